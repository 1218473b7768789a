"""Unit tests of abi.py: ABI manifest -> JSON Schemas, validators, signatures, tool names. No server, no node.

Tables follow the rows of ../shared/spec/abi-mapping.md and reference-behaviour.md §3.9, §3.14, §4.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import jsonschema

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import abi  # noqa: E402

MANIFESTS = HERE / "manifests"
SHARED_ABI = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "abi"
TOOL_NAME = re.compile(r"^[a-z0-9_]{1,49}$")


# ---------------------------------------------------------------------------------------------------------------------
# Helpers

def manifest_of(params=(), returns=None, types=None, **method_keys):
    """A one-method manifest `m` built from params given as (name, type) or (name, type, {extra keys})."""
    declared = []
    for entry in params:
        name, typ, extra = (entry + ({},))[:3]
        declared.append(dict({"name": name, "type": typ}, **extra))
    method = dict({"name": "m", "params": declared}, **method_keys)
    if returns is not None:
        method["returns"] = returns
    return abi.parse_manifest({"schema_version": "wasm-abi/1", "types": types or {}, "methods": [method]}, "test")


def one_param(typ, types=None, **extra):
    return manifest_of([("v", typ, extra)], types=types)


def check(manifest, args, method="m"):
    return abi.Validator(manifest, method).check(args)


def load(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def every_kind():
    return abi.parse_manifest(load(MANIFESTS / "every-kind.json"), "every-kind")


def shared_manifest(name):
    """A manifest of ../shared/fixtures/abi, or a skip naming what is missing (a plain clone has no ../shared)."""
    path = SHARED_ABI / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared fixtures live beside the checkout, not in it")
    return abi.parse_manifest(load(path), path.stem)


def k(kind, **extra):
    return dict({"kind": kind}, **extra)


def ref(name):
    return {"$ref": name}


# ---------------------------------------------------------------------------------------------------------------------
# Manifest parsing

REFUSED = [
    ("not an object", ["wasm-abi/1"], "not a JSON object"),
    ("other major", {"schema_version": "wasm-abi/2", "types": {}, "methods": []}, '"wasm-abi/2" is not wasm-abi/1'),
    ("no version", {"types": {}, "methods": []}, "null is not wasm-abi/1"),
    ("look-alike", {"schema_version": "wasm-abi/10", "methods": []}, "is not wasm-abi/1"),
    ("no methods", {"schema_version": "wasm-abi/1", "types": {}}, "no methods list"),
    ("methods not a list", {"schema_version": "wasm-abi/1", "methods": {}}, "no methods list"),
    ("types not an object", {"schema_version": "wasm-abi/1", "types": [], "methods": []}, "types is not an object"),
    ("nameless method", {"schema_version": "wasm-abi/1", "methods": [{"params": []}]}, "method #1 has no name"),
    ("params not a list", {"schema_version": "wasm-abi/1", "methods": [{"name": "a", "params": {}}]},
     "params that are not a list"),
    ("nameless param", {"schema_version": "wasm-abi/1", "methods": [{"name": "a", "params": [{"type": k("u32")}]}]},
     "parameter without a name"),
    ("typeless param", {"schema_version": "wasm-abi/1", "methods": [{"name": "a", "params": [{"name": "x"}]}]},
     "parameter x of method a has no type"),
    ("bad returns", {"schema_version": "wasm-abi/1", "methods": [{"name": "a", "params": [], "returns": "u32"}]},
     "return type that is not an object"),
    ("duplicate method", {"schema_version": "wasm-abi/1", "methods": [{"name": "a", "params": []}] * 2},
     "method a is declared twice"),
    ("duplicate param", {"schema_version": "wasm-abi/1", "methods": [
        {"name": "a", "params": [{"name": "x", "type": k("u32")}, {"name": "x", "type": k("u32")}]}]},
     "declares a parameter twice"),
]


@pytest.mark.parametrize("case, raw, reason", REFUSED, ids=[row[0] for row in REFUSED])
def test_parse_manifest_refuses_naming_the_app(case, raw, reason):
    with pytest.raises(abi.AbiError) as caught:
        abi.parse_manifest(raw, "com.example.kv")
    assert str(caught.value).startswith('Application "com.example.kv" has an unusable ABI: ')
    assert reason in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("version", ["wasm-abi/1", "wasm-abi/1.0", "wasm-abi/1.12"])
def test_parse_manifest_accepts_minor_versions(version):
    manifest = abi.parse_manifest({"schema_version": version, "methods": []}, "x")
    assert manifest == abi.Manifest(types={}, methods=())


def test_parse_manifest_reads_every_method_field_and_ignores_unknown_keys():
    raw = {"schema_version": "wasm-abi/1", "future": 1, "types": {"T": k("alias", target=k("u32"))}, "methods": [
        {"name": "get", "doc": "Read.", "intent": "read_only", "returns": k("string"), "returns_nullable": True,
         "returns_doc": "The value.", "destructive": True, "idempotent": True, "xcall_callable": True, "errors": [],
         "params": [{"name": "key", "type": k("string"), "nullable": True, "doc": "The key.", "later": 2}]},
        {"name": "bare"}]}
    manifest = abi.parse_manifest(raw, "x")
    assert manifest.method("get") == abi.Method(
        name="get", params=(abi.Param("key", {"kind": "string"}, True, "The key."),), returns={"kind": "string"},
        returns_nullable=True, returns_doc="The value.", intent="read_only", doc="Read.", destructive=True,
        idempotent=True)
    assert manifest.method("bare") == abi.Method("bare", (), None, False, None, None, None, False, False)
    assert manifest.method("absent") is None
    assert manifest.types == {"T": {"kind": "alias", "target": {"kind": "u32"}}}


def test_parse_manifest_never_mutates_and_does_not_share_the_input():
    raw = load(MANIFESTS / "every-kind.json")
    before = copy.deepcopy(raw)
    manifest = abi.parse_manifest(raw, "every-kind")
    for method in manifest.methods:       # derive everything once
        abi.input_schema(manifest, method), abi.output_schema(manifest, method, True), abi.signature(manifest, method)
    assert raw == before
    raw["types"]["Point"]["fields"].clear()
    raw["methods"][1]["params"][0]["type"]["kind"] = "string"
    assert manifest.types["Point"]["fields"] != []
    assert manifest.method("echo_scalars").params[0].type == {"kind": "bool"}


# ---------------------------------------------------------------------------------------------------------------------
# Scalars (abi-mapping.md "Scalars"; reference §4.2 for the output column)

SCALARS = [
    ("bool", {"type": "boolean"}, {"type": "boolean"}),
    ("string", {"type": "string"}, {"type": "string"}),
    ("unit", {"type": "null"}, {"type": "null"}),
    ("i32", {"type": "integer", "minimum": -2 ** 31, "maximum": 2 ** 31 - 1},
     {"type": "integer", "minimum": -2 ** 31, "maximum": 2 ** 31 - 1}),
    ("i64", {"type": "integer"}, {"type": "number"}),
    ("u32", {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1},
     {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1}),
    ("u64", {"type": "integer", "minimum": 0}, {"type": "number", "minimum": 0}),
    ("f32", {"type": "number"}, {"type": "number"}),
    ("f64", {"type": "number"}, {"type": "number"}),
]


@pytest.mark.parametrize("kind, input_schema, output_schema", SCALARS, ids=[row[0] for row in SCALARS])
def test_scalar_schemas_in_both_modes(kind, input_schema, output_schema):
    manifest = manifest_of([("v", k(kind))], returns=k(kind))
    assert abi.params_schema(manifest, "m")["properties"]["v"] == input_schema
    if kind == "unit":
        assert abi.output_schema(manifest, "m", wrap=False) is None
    else:
        assert abi.output_schema(manifest, "m", wrap=False) == output_schema


SCALAR_VALUES = [
    ("bool", [True, False], [1, "true", None]),
    ("string", ["", "x"], [42, None, ["x"]]),
    ("unit", [None], [0, "", {}]),
    ("i32", [0, -2 ** 31, 2 ** 31 - 1], [2 ** 31, 1.5, "1", True]),
    ("i64", [-2 ** 63, 2 ** 63 - 1, 2 ** 70], [1.5, "1", False]),
    ("u32", [0, 2 ** 32 - 1], [-1, 2 ** 32, 1.5]),
    ("u64", [0, 2 ** 53 + 1, 2 ** 64 - 1], [-1, 0.5, "9"]),
    ("f32", [0, 1.5, -3], ["1.5", None]),
    ("f64", [1e300, 2], [True, [1.0]]),
]


@pytest.mark.parametrize("kind, good, bad", SCALAR_VALUES, ids=[row[0] for row in SCALAR_VALUES])
def test_scalar_values_accepted_and_refused(kind, good, bad):
    manifest = one_param(k(kind))
    for value in good:
        wire, problems = check(manifest, {"v": value})
        assert problems == [] and wire == {"v": value}
        assert type(wire["v"]) is type(value)
    for value in bad:
        wire, problems = check(manifest, {"v": value})
        assert wire is None and [problem.path for problem in problems] == ["v"], value


def test_big_integers_stay_exact_on_the_wire():
    manifest = manifest_of([("a", k("u64")), ("b", k("i64")), ("c", k("list", items=k("u64")))])
    args = {"a": 18446744073709551615, "b": -9223372036854775808, "c": [9007199254740993]}
    wire, problems = check(manifest, args)
    assert problems == []
    assert wire == args and wire["c"][0] == 9007199254740993
    assert json.dumps(wire) == '{"a": 18446744073709551615, "b": -9223372036854775808, "c": [9007199254740993]}'


def test_integral_floats_become_ints_because_serde_refuses_1_0_for_an_integer():
    manifest = manifest_of([("n", k("u32")), ("x", k("f64")), ("b", k("bytes"))])
    wire, problems = check(manifest, {"n": 3.0, "x": 3.0, "b": [1.0, 2]})
    assert problems == []
    assert wire == {"n": 3, "x": 3.0, "b": [1, 2]}
    assert type(wire["n"]) is int and type(wire["x"]) is float and type(wire["b"][0]) is int


# ---------------------------------------------------------------------------------------------------------------------
# Composites (abi-mapping.md "Composites", "CRDT collection wrappers", reference §4.2)

POINT = {"Point": k("record", doc="A point.", fields=[{"name": "x", "type": k("i32")}, {"name": "y", "type": k("i32")}])}
I32 = {"type": "integer", "minimum": -2 ** 31, "maximum": 2 ** 31 - 1}

COMPOSITES = [
    ("list", k("list", items=k("string")), {"type": "array", "items": {"type": "string"}}),
    ("map", k("map", key=k("string"), value=k("bool")), {"type": "object", "additionalProperties": {"type": "boolean"}}),
    ("map with bare key", k("map", key="string", value=k("bool")),
     {"type": "object", "additionalProperties": {"type": "boolean"}}),
    ("tuple", k("tuple", elements=[k("string"), k("bool")]),
     {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False,
      "minItems": 2, "maxItems": 2}),
    ("inline record", k("record", fields=[{"name": "a", "type": k("string")},
                                          {"name": "b", "type": k("bool"), "nullable": True, "doc": "Maybe."}]),
     {"type": "object", "properties": {"a": {"type": "string"},
                                       "b": {"type": ["boolean", "null"], "description": "Maybe."}},
      "required": ["a"]}),
    ("named record", ref("Point"),
     {"type": "object", "properties": {"x": I32, "y": I32}, "required": ["x", "y"], "description": "A point."}),
    ("crdt wrapper", k("record", fields=[], crdt_type="lww_register", inner_type=k("string")), {"type": "string"}),
    ("crdt collection", k("map", key=k("string"), crdt_type="unordered_map",
                          value=k("record", fields=[], crdt_type="lww_register", inner_type=k("bool"))),
     {"type": "object", "additionalProperties": {"type": "boolean"}}),
    ("crdt without inner type is a record", k("record", fields=[], crdt_type="counter"),
     {"type": "object", "properties": {}}),
    ("alias", ref("Names"), {"type": "array", "items": {"type": "string"}}),
]


@pytest.mark.parametrize("case, typ, expected", COMPOSITES, ids=[row[0] for row in COMPOSITES])
def test_composite_schemas(case, typ, expected):
    types = dict(POINT, Names=k("alias", target=k("list", items=k("string"))))
    assert abi.params_schema(one_param(typ, types), "m")["properties"]["v"] == expected


COMPOSITE_VALUES = [
    ("list", k("list", items=k("u32")), [[], [1, 2]], [3, [-1], ["a"]]),
    ("map values typed", k("map", key=k("string"), value=k("u32")), [{}, {"a": 1}], [{"a": "1"}, [1]]),
    ("tuple exact arity", k("tuple", elements=[k("string"), k("u64")]), [["a", 1]], [["a"], ["a", 1, 2], [1, "a"]]),
    ("record", ref("Point"), [{"x": 1, "y": 2}], [{"x": 1}, {"x": "1", "y": 2}, [1, 2]]),
    ("nullable field absent or null", k("record", fields=[{"name": "a", "type": k("u32"), "nullable": True}]),
     [{}, {"a": None}, {"a": 1}], [{"a": "x"}]),
    ("crdt wrapper is its inner type", k("record", fields=[], crdt_type="lww_register", inner_type=k("u64")),
     [5], [{}, "5"]),
]


@pytest.mark.parametrize("case, typ, good, bad", COMPOSITE_VALUES, ids=[row[0] for row in COMPOSITE_VALUES])
def test_composite_values(case, typ, good, bad):
    manifest = one_param(typ, POINT)
    for value in good:
        assert check(manifest, {"v": value}) == ({"v": value}, []), value
    for value in bad:
        assert check(manifest, {"v": value})[0] is None, value


def test_unknown_record_keys_are_dropped_everywhere_not_refused():
    types = dict(POINT, Bag=k("record", fields=[{"name": "points", "type": k("list", items=ref("Point"))},
                                                 {"name": "by_name", "type": k("map", key=k("string"), value=ref("Point"))},
                                                 {"name": "maybe", "type": ref("Point"), "nullable": True}]))
    manifest = one_param(ref("Bag"), types)
    value = {"points": [{"x": 1, "y": 2, "z": 3}], "by_name": {"a": {"x": 0, "y": 0, "extra": True}}, "stray": 1}
    wire, problems = check(manifest, {"v": value, "undeclared": 5})
    assert problems == []
    assert wire == {"v": {"points": [{"x": 1, "y": 2}], "by_name": {"a": {"x": 0, "y": 0}}}}


# ---------------------------------------------------------------------------------------------------------------------
# Bytes (abi-mapping.md "Bytes")

BYTE_ARRAY = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}
# The degraded unknown: every JSON type (some hosts drop a tool with an untyped node), accepting anything.
UNKNOWN = {"type": ["string", "number", "boolean", "object", "array", "null"],
           "description": "any JSON value, passed through unchecked"}

BYTES_SCHEMAS = [
    ("unsized input", k("bytes"), "input",
     {"type": ["string", "array"], "anyOf": [{"type": "string", "pattern": "^(?:[0-9a-fA-F]{2})*$"}, BYTE_ARRAY],
      "description": "bytes: a hex string or a byte array"}),
    ("sized input", k("bytes", size=32), "input",
     {"type": ["string", "array"],
      "anyOf": [{"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}, dict(BYTE_ARRAY, minItems=32, maxItems=32)],
      "description": "bytes: a hex string or a 32-byte array"}),
    ("unsized output", k("bytes"), "output", dict(BYTE_ARRAY, description="bytes: a byte array")),
    ("sized output", k("bytes", size=4), "output",
     dict(BYTE_ARRAY, minItems=4, maxItems=4, description="bytes: a 4-byte array")),
    ("bytes type definition", ref("Digest"), "input",
     {"type": ["string", "array"],
      "anyOf": [{"type": "string", "pattern": "^[0-9a-fA-F]{4}$"}, dict(BYTE_ARRAY, minItems=2, maxItems=2)],
      "description": "A digest. (bytes: a hex string or a 2-byte array)"}),
]


@pytest.mark.parametrize("case, typ, mode, expected", BYTES_SCHEMAS, ids=[row[0] for row in BYTES_SCHEMAS])
def test_bytes_schemas(case, typ, mode, expected):
    manifest = manifest_of([("v", typ)], returns=typ, types={"Digest": k("bytes", size=2, doc="A digest.")})
    if mode == "input":
        assert abi.params_schema(manifest, "m")["properties"]["v"] == expected
    else:
        assert abi.output_schema(manifest, "m", wrap=False) == expected


BYTES_VALUES = [
    ("lowercase hex", k("bytes"), "dead", [222, 173]),
    ("uppercase hex", k("bytes"), "DEAD", [222, 173]),
    ("mixed-case hex", k("bytes"), "dEaD00ff", [222, 173, 0, 255]),
    ("empty hex", k("bytes"), "", []),
    ("byte array", k("bytes"), [0, 255], [0, 255]),
    ("sized hex", k("bytes", size=2), "0102", [1, 2]),
    ("sized array", k("bytes", size=2), [1, 2], [1, 2]),
    ("alias to sized bytes", ref("Id"), "ff" * 32, [255] * 32),
    ("list of bytes", k("list", items=k("bytes")), ["01", [2]], [[1], [2]]),
    ("map of bytes", k("map", key=k("string"), value=k("bytes")), {"a": "0a"}, {"a": [10]}),
    ("tuple with bytes", k("tuple", elements=[k("bytes"), k("string")]), ["ff", "ff"], [[255], "ff"]),
]


@pytest.mark.parametrize("case, typ, given, sent", BYTES_VALUES, ids=[row[0] for row in BYTES_VALUES])
def test_hex_becomes_a_byte_array_on_the_wire(case, typ, given, sent):
    manifest = one_param(typ, {"Id": k("alias", target=k("bytes", size=32))})
    assert check(manifest, {"v": given}) == ({"v": sent}, [])


BYTES_REFUSED = [
    ("odd-length hex", k("bytes"), "abc", "expected a hex string or a byte array (0-255), got \"abc\""),
    ("non-hex", k("bytes"), "zz", "expected a hex string or a byte array (0-255), got \"zz\""),
    ("0x prefix", k("bytes"), "0xdead", "expected a hex string or a byte array (0-255), got \"0xdead\""),
    ("a number", k("bytes"), 7, "expected a hex string or a byte array (0-255), got 7"),
    ("sized hex too short", k("bytes", size=32), "dead",
     "expected a hex string of 64 digits or an array of 32 bytes (0-255), got \"dead\""),
    ("empty hex for a sized type", k("bytes", size=1), "",
     "expected a hex string of 2 digits or an array of 1 bytes (0-255), got \"\""),
]


@pytest.mark.parametrize("case, typ, given, message", BYTES_REFUSED, ids=[row[0] for row in BYTES_REFUSED])
def test_bad_bytes_are_refused_readably(case, typ, given, message):
    assert check(one_param(typ), {"v": given}) == (None, [abi.Problem("v", message)])


@pytest.mark.parametrize("given, problems", [
    ([1, 256], [("v.1", "expected a byte (0-255), got 256")]),
    ([-1], [("v.0", "expected a byte (0-255), got -1")]),
    ([1.5], [("v.0", "expected a byte (0-255), got 1.5")]),
    (["ff"], [("v.0", "expected a byte (0-255), got \"ff\"")]),
])
def test_bad_byte_array_elements_are_pinned_to_their_index(given, problems):
    assert check(one_param(k("bytes")), {"v": given}) == (None, [abi.Problem(*p) for p in problems])


def test_sized_byte_array_of_the_wrong_length():
    assert check(one_param(k("bytes", size=32)), {"v": [1, 2]}) == (
        None, [abi.Problem("v", "expected exactly 32 items, got 2")])


def test_bytes_hint_survives_param_field_and_return_docs(every_kind):
    params = abi.params_schema(every_kind, "put_bytes")["properties"]
    assert params["raw"]["description"] == "Any bytes. (bytes: a hex string or a byte array)"
    assert params["digest"]["description"] == "Checked digest. (bytes: a hex string or a 32-byte array)"
    assert params["blob"]["description"] == "bytes: a hex string or a byte array"
    assert params["user"]["description"] == "bytes: a hex string or a 32-byte array"
    profile = abi.params_schema(every_kind, "set_profile")["properties"]["profile"]
    assert profile["properties"]["avatar"]["description"] == "Image bytes. (bytes: a hex string or a byte array)"
    assert abi.output_schema(every_kind, "put_bytes", wrap=False)["description"] == "The digest. (bytes: a 32-byte array)"


# ---------------------------------------------------------------------------------------------------------------------
# Variants (abi-mapping.md "Variants (enums)"; reference §4.2 for serde tag / content / untagged)

def test_unit_only_variant_is_a_plain_string_enum(every_kind):
    schema = abi.params_schema(every_kind, "variants")["properties"]["color"]
    assert schema == {"type": "string", "enum": ["Red", "Green", "Blue"]}


def test_documented_unit_variants_stay_a_plain_enum_described_by_their_docs(every_kind):
    """abi-mapping.md: a variant with no payloads anywhere becomes a plain string enum; the docs describe it."""
    schema = abi.params_schema(every_kind, "variants")["properties"]["phase"]
    assert schema == {"type": "string", "enum": ["Pending", "Done"],
                      "description": "Where a job stands. Pending: Waiting to start."}


def test_payload_only_variant_is_a_union_of_strict_single_key_objects(every_kind):
    schema = abi.params_schema(every_kind, "variants")["properties"]["shape"]
    circle, rect = schema["oneOf"]
    assert circle == {"type": "object", "properties": {"Circle": {"type": "number"}}, "required": ["Circle"],
                      "additionalProperties": False, "description": "Radius."}
    assert rect["required"] == ["Rect"] and rect["additionalProperties"] is False
    assert rect["properties"]["Rect"]["required"] == ["x", "y"]


def test_mixed_variant_is_the_enum_plus_one_object_per_payload(every_kind):
    schema = abi.params_schema(every_kind, "variants")["properties"]["command"]
    # the accepted forms follow the doc, and the union states its types, for hosts that flatten unions
    assert schema["description"] == 'What to do next. (one of "Reset", {"Set": ...}, {"Move": ...}, {"Stamp": ...})'
    assert schema["type"] == ["string", "object"]
    assert schema["oneOf"][0] == {"type": "string", "enum": ["Reset"]}
    assert [member["required"] for member in schema["oneOf"][1:]] == [["Set"], ["Move"], ["Stamp"]]


EXTERNAL_VALUES = [
    ("bare unit name", "Reset", "Reset"),
    ("payload object", {"Set": 7}, {"Set": 7}),
    ("record payload with a stray key", {"Move": {"x": 1, "y": 2, "z": 3}}, {"Move": {"x": 1, "y": 2}}),
    ("hex payload", {"Stamp": "beef"}, {"Stamp": [190, 239]}),
]


@pytest.mark.parametrize("case, given, sent", EXTERNAL_VALUES, ids=[row[0] for row in EXTERNAL_VALUES])
def test_externally_tagged_values(every_kind, case, given, sent):
    args = {"color": "Red", "phase": "Done", "shape": {"Circle": 1.5}, "command": given}
    wire, problems = check(every_kind, args, "variants")
    assert problems == [] and wire["command"] == sent


EXTERNAL_REFUSED = [
    ("unknown unit", "Jump",
     [("command", 'expected one of "Reset", {"Set": ...}, {"Move": ...}, {"Stamp": ...}, got "Jump"')]),
    ("two keys", {"Set": 1, "Move": {"x": 1, "y": 1}},
     [("command", 'expected one of "Reset", {"Set": ...}, {"Move": ...}, {"Stamp": ...}, '
                  'got {"Set": 1, "Move": {"x": 1, "y": 1}}')]),
    ("wrong payload", {"Set": "7"}, [("command.Set", 'expected integer, got "7"')]),
    ("missing payload field", {"Move": {"x": 1}}, [("command.Move.y", "missing required field")]),
]


@pytest.mark.parametrize("case, given, problems", EXTERNAL_REFUSED, ids=[row[0] for row in EXTERNAL_REFUSED])
def test_externally_tagged_refusals(every_kind, case, given, problems):
    args = {"color": "Red", "phase": "Done", "shape": {"Circle": 1.5}, "command": given}
    assert check(every_kind, args, "variants") == (None, [abi.Problem(*p) for p in problems])


def test_unit_only_enum_refusal_lists_the_names(every_kind):
    args = {"color": "Pink", "phase": "Done", "shape": {"Circle": 1}, "command": "Reset"}
    assert check(every_kind, args, "variants") == (
        None, [abi.Problem("color", 'expected one of "Red", "Green", "Blue", got "Pink"')])


def test_internally_tagged_members(every_kind):
    members = abi.params_schema(every_kind, "tagged")["properties"]["event"]["oneOf"]
    started, moved, labelled, nested_a, nested_b, raw, signed = members
    assert started == {"type": "object", "properties": {"type": {"type": "string", "const": "Started"}},
                       "required": ["type"], "description": "The job began."}
    assert list(moved["properties"]) == ["type", "x", "y"] and moved["required"] == ["type", "x", "y"]
    assert labelled["additionalProperties"] == {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1}
    assert nested_a["required"] == ["type", "sub", "x", "y"]
    assert nested_a["properties"]["sub"] == {"type": "string", "const": "A"}
    assert nested_b["properties"] == {"type": {"type": "string", "const": "Nested"},
                                      "sub": {"type": "string", "const": "B"}}
    assert raw == {"type": "object", "properties": {"type": {"type": "string", "const": "Raw"}}, "required": ["type"]}
    assert signed["properties"]["type"] == {"type": "string", "const": "Signed"}     # the tag wins over the field
    assert signed["required"] == ["type", "key"]


def test_adjacently_tagged_members(every_kind):
    members = abi.params_schema(every_kind, "tagged")["properties"]["message"]["oneOf"]
    assert members[0] == {"type": "object", "properties": {"t": {"type": "string", "const": "Ping"}}, "required": ["t"]}
    assert members[1] == {"type": "object", "properties": {"t": {"type": "string", "const": "Text"},
                                                           "c": {"type": "string"}}, "required": ["t", "c"]}


def test_untagged_members_and_bytes_as_arrays_only(every_kind):
    schema = abi.params_schema(every_kind, "tagged")["properties"]["loose"]
    assert schema == {"type": ["integer", "string", "array", "null"], "anyOf": [
        {"type": "integer", "minimum": 0}, {"type": "string"},
        dict(BYTE_ARRAY, description="Bytes, as an array. (bytes: a byte array)"), {"type": "null"}],
        "description": "one of integer, string, array, null"}


TAGGED_VALUES = [
    ("internal unit", "event", {"type": "Started", "junk": 1}, {"type": "Started"}),
    ("internal record", "event", {"type": "Moved", "x": 1.0, "y": 2, "junk": 1}, {"type": "Moved", "x": 1, "y": 2}),
    ("internal map", "event", {"type": "Labelled", "a": 1.0, "b": 2}, {"type": "Labelled", "a": 1, "b": 2}),
    ("internal flattened", "event", {"type": "Nested", "sub": "A", "x": 0, "y": 0, "junk": 1},
     {"type": "Nested", "sub": "A", "x": 0, "y": 0}),
    ("internal flattened unit", "event", {"type": "Nested", "sub": "B"}, {"type": "Nested", "sub": "B"}),
    ("internal loose", "event", {"type": "Raw", "anything": [1]}, {"type": "Raw", "anything": [1]}),
    ("internal tag wins", "event", {"type": "Signed", "key": "0a0b"}, {"type": "Signed", "key": [10, 11]}),
    ("adjacent unit", "message", {"t": "Ping"}, {"t": "Ping"}),
    ("adjacent payload", "message", {"t": "Data", "c": "ff00", "x": 1}, {"t": "Data", "c": [255, 0]}),
    ("untagged number", "loose", 2 ** 60, 2 ** 60),
    ("untagged string stays a string", "loose", "abcd", "abcd"),
    ("untagged byte array", "loose", [1, 2, 3], [1, 2, 3]),
    ("untagged unit", "loose", None, None),
]


@pytest.mark.parametrize("case, param, given, sent", TAGGED_VALUES, ids=[row[0] for row in TAGGED_VALUES])
def test_tagged_and_untagged_values(every_kind, case, param, given, sent):
    args = {"event": {"type": "Started"}, "message": {"t": "Ping"}, "loose": 1}
    args[param] = given
    wire, problems = check(every_kind, args, "tagged")
    assert problems == [] and wire[param] == sent


TAGGED_REFUSED = [
    ("internal unknown tag", "event", {"type": "Stopped"},
     ("event", 'expected one of {"type": "Started", ...}, {"type": "Moved", ...}, {"type": "Labelled", ...}, '
               '{"type": "Nested", "sub": "A", ...}, {"type": "Nested", "sub": "B", ...}, {"type": "Raw", ...}, '
               '{"type": "Signed", ...}, got {"type": "Stopped"}')),
    ("internal wrong field", "event", {"type": "Moved", "x": "1", "y": 2}, ("event.x", 'expected integer, got "1"')),
    ("internal missing field", "event", {"type": "Moved", "x": 1}, ("event.y", "missing required field")),
    ("adjacent missing content", "message", {"t": "Text"}, ("message.c", "missing required field")),
    ("adjacent hex in content checked", "message", {"t": "Data", "c": "xyz"},
     ("message.c", 'expected a hex string or a byte array (0-255), got "xyz"')),
    ("untagged byte out of range", "loose", [1, 2, 300], ("loose.2", "expected a byte (0-255), got 300")),
    ("untagged refuses an object", "loose", {"a": 1},
     ("loose", 'expected one of integer, string, array, null, got {"a": 1}')),
]


@pytest.mark.parametrize("case, param, given, problem", TAGGED_REFUSED, ids=[row[0] for row in TAGGED_REFUSED])
def test_tagged_refusals(every_kind, case, param, given, problem):
    args = {"event": {"type": "Started"}, "message": {"t": "Ping"}, "loose": 1}
    args[param] = given
    assert check(every_kind, args, "tagged") == (None, [abi.Problem(*problem)])


def test_untagged_refusal_follows_the_member_the_value_nearly_fitted():
    types = {"Either": k("variant", untagged=True, variants=[
        {"name": "Count", "payload": k("record", fields=[{"name": "count", "type": k("u32")}])},
        {"name": "Label", "payload": k("record", fields=[{"name": "label", "type": k("string")}])}])}
    manifest = one_param(ref("Either"), types)
    assert check(manifest, {"v": {"count": "many"}}) == (None, [abi.Problem("v.count", 'expected integer, got "many"')])
    assert check(manifest, {"v": {"other": 1}}) == (
        None, [abi.Problem("v", 'expected one of an object, an object, got {"other": 1}')])
    assert check(manifest, {"v": {"label": "x", "extra": 1}}) == ({"v": {"label": "x", "extra": 1}}, [])


def test_nullable_enum_param_refusal_mentions_null():
    manifest = one_param(ref("Color"), {"Color": k("variant", variants=[{"name": "Red"}, {"name": "Blue"}])},
                         nullable=True)
    assert check(manifest, {"v": "Pink"}) == (None, [abi.Problem("v", 'expected one of "Red", "Blue" or null, got "Pink"')])
    assert check(manifest, {"v": 3}) == (None, [abi.Problem("v", 'expected one of "Red", "Blue" or null, got 3')])
    assert check(manifest, {"v": None}) == ({"v": None}, [])


# ---------------------------------------------------------------------------------------------------------------------
# Type references and recursion (abi-mapping.md "Type references and recursion")

def chain_types(length):
    types = {f"C{i}": k("record", fields=[{"name": "next", "type": ref(f"C{i + 1}")}]) for i in range(1, length)}
    types[f"C{length}"] = k("record", fields=[{"name": "end", "type": k("bool")}])
    return types


def test_a_chain_of_eight_refs_expands_fully():
    manifest = one_param(ref("C1"), chain_types(8))
    schema = abi.params_schema(manifest, "m")
    assert abi.unknown_paths(schema) == [] and abi.degradations(manifest) == []
    innermost = schema["properties"]["v"]
    for _ in range(7):
        innermost = innermost["properties"]["next"]
    assert innermost == {"type": "object", "properties": {"end": {"type": "boolean"}}, "required": ["end"]}


def test_a_chain_deeper_than_eight_degrades_at_the_ninth_ref(every_kind):
    schema = abi.params_schema(every_kind, "chain")
    assert abi.unknown_paths(schema) == ["#/properties/c" + "/properties/next" * 8]
    assert 'chain.c: $ref "Chain9" is nested more than 8 deep' in abi.degradations(every_kind)
    deep = {"end": True}
    for _ in range(8):
        deep = {"next": deep}
    assert check(every_kind, {"c": deep}, "chain") == ({"c": deep}, [])


def test_self_referential_type_terminates_at_depth_eight(every_kind):
    schema = abi.params_schema(every_kind, "grow")["properties"]["tree"]
    depth = 0
    while schema.get("type") == "object":
        assert schema["description"] == "A node and its children."
        schema, depth = schema["properties"]["children"]["items"], depth + 1
    assert depth == 8 and schema == UNKNOWN
    tree = {"value": 1, "children": [{"value": 2.0, "children": [], "x": 1}]}
    assert check(every_kind, {"tree": tree}, "grow") == (
        {"tree": {"value": 1, "children": [{"value": 2, "children": []}]}}, [])


def test_missing_ref_and_unknown_kind_degrade_to_unknown(every_kind):
    schema = abi.params_schema(every_kind, "ghost")
    assert schema["properties"] == {"g": UNKNOWN, "odd": UNKNOWN}
    assert abi.unknown_paths(schema) == ["#/properties/g", "#/properties/odd"]
    assert abi.unknown_paths(abi.output_schema(every_kind, "ghost", wrap=True)) == ["#/properties/result"]
    found = abi.degradations(every_kind)
    assert 'ghost.g: $ref "Missing" is not in the type table' in found
    assert 'ghost.odd: unknown kind "f128"' in found
    anything = {"g": {"whatever": ["ab"]}, "odd": "ab"}
    assert check(every_kind, anything, "ghost") == (anything, [])


def test_every_kind_degrades_exactly_where_it_was_built_to(every_kind):
    assert abi.degradations(every_kind) == [
        'grow.tree: $ref "Tree" is nested more than 8 deep',
        'grow -> result: $ref "Tree" is nested more than 8 deep',
        'chain.c: $ref "Chain9" is nested more than 8 deep',
        'ghost.g: $ref "Missing" is not in the type table',
        'ghost.odd: unknown kind "f128"',
        'ghost -> result: $ref "Missing" is not in the type table',
    ]


def test_unknown_kind_inside_a_named_type_is_detected():
    manifest = one_param(ref("Wrap"), {"Wrap": k("record", fields=[{"name": "w", "type": k("weird"), "doc": "W."}])})
    schema = abi.params_schema(manifest, "m")
    assert schema["properties"]["v"]["properties"]["w"] == dict(
        UNKNOWN, description="W. (any JSON value, passed through unchecked)")
    assert abi.unknown_paths(schema) == ["#/properties/v/properties/w"]


# ---------------------------------------------------------------------------------------------------------------------
# Method schemas (tools.md "Generated method tools"; abi-mapping.md "The _context option"; reference §3.14, §4.3)

def test_input_schema_injects_handle_and_context_before_the_params():
    """The routing is advertised once, in a few words (the server's instructions explain it): app_handle and
    _context; context is accepted as _context's synonym without being advertised."""
    manifest = shared_manifest("mero-mcp-rc83-kv-store.json")
    schema = abi.input_schema(manifest, "set")
    assert schema == {"type": "object", "properties": {
        "app_handle": {"type": "string", "description": "From select_app."},
        "_context": {"type": "string", "description": "Context id or alias."},
        "key": {"type": "string", "description": "The key to write. Any string, including the empty string."},
        "value": {"type": "string", "description": "The value to store."}}, "required": ["key", "value"]}


def test_declared_context_parameters_win(every_kind):
    schema = abi.input_schema(every_kind, "own_context")     # declares both context names: only the handle routes
    assert list(schema["properties"]) == ["app_handle", "context", "_context"]
    assert schema["properties"]["context"] == {"type": "string", "description": "The app's own context name."}
    assert schema["properties"]["_context"] == {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1}
    assert schema["required"] == ["context", "_context"]
    handle = abi.input_schema(every_kind, "with_handle")["properties"]
    assert list(handle) == ["_context", "app_handle"] and handle["app_handle"] == {"type": "string"}
    # a method declaring _context is targeted through context, the synonym
    own = abi.input_schema(manifest_of([("_context", k("u32"))]), "m")["properties"]
    assert list(own) == ["app_handle", "context", "_context"]
    assert own["context"] == {"type": "string", "description": "Context id or alias."}


def test_nullable_params_are_optional_and_accept_null(every_kind):
    schema = abi.input_schema(every_kind, "set_profile")
    assert schema["required"] == ["profile"]
    assert schema["properties"]["note"] == {"type": ["string", "null"], "description": "Why."}
    profile = {"name": "a", "tags": []}
    for args in ({"profile": profile}, {"profile": profile, "note": None}, {"profile": profile, "note": "x"}):
        assert check(every_kind, args, "set_profile") == (args, [])
    assert check(every_kind, {"profile": profile, "note": 1}, "set_profile") == (
        None, [abi.Problem("note", "expected string or null, got 1")])


def test_a_method_without_params_still_has_an_object_schema(every_kind):
    assert abi.params_schema(every_kind, "clear") == {"type": "object", "properties": {}}
    assert list(abi.input_schema(every_kind, "clear")["properties"]) == ["app_handle", "_context"]
    assert "required" not in abi.input_schema(every_kind, "clear")


@pytest.mark.parametrize("method", ["clear", "nothing", "forget", "chain"])
def test_unit_returns_have_no_output_schema(every_kind, method):
    assert abi.output_schema(every_kind, method, wrap=True) is None
    assert abi.output_schema(every_kind, method, wrap=False) is None


OUTPUTS = [
    ("count", True, {"type": "object", "properties": {"result": {
        "type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1, "description": "How many notes exist."}},
        "required": ["result"]}),
    ("count", False, {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1, "description": "How many notes exist."}),
    ("name_of", False, {"type": "string", "description": "A display name."}),
    ("own_context", True, {"type": "object", "properties": {"result": {"type": "string"}}, "required": ["result"]}),
]


@pytest.mark.parametrize("method, wrap, expected", OUTPUTS, ids=[f"{row[0]}-wrap={row[1]}" for row in OUTPUTS])
def test_output_schemas(every_kind, method, wrap, expected):
    assert abi.output_schema(every_kind, method, wrap) == expected


def test_nullable_return_is_a_type_list_and_wrapped_in_the_handshake_era(every_kind):
    raw = abi.output_schema(every_kind, "set_profile", wrap=False)
    assert raw["description"] == "The previous profile, if any."
    assert raw["type"] == ["object", "null"] and "anyOf" not in raw and raw["required"]
    assert abi.output_schema(every_kind, "set_profile", wrap=True) == {
        "type": "object", "properties": {"result": raw}, "required": ["result"]}


def test_object_returns_are_never_wrapped_and_nullable_fields_may_be_absent(every_kind):
    manifest = manifest_of(returns=ref("Profile"), types={"Profile": every_kind.types["Profile"]},
                           returns_doc="The profile.")
    schema = abi.output_schema(manifest, "m", wrap=True)
    assert schema["type"] == "object" and schema["description"] == "The profile."
    assert schema["required"] == ["name", "tags"]
    validator = abi.compile_schema(schema)
    assert validator.is_valid({"name": "a", "tags": []})
    assert validator.is_valid({"name": "a", "tags": [], "bio": None, "avatar": [1]})
    assert not validator.is_valid({"name": "a", "tags": [], "avatar": "ff"})   # output bytes are arrays only


def test_output_mode_accepts_64_bit_values_as_numbers(every_kind):
    schema = abi.output_schema(every_kind, "echo_scalars", wrap=False)
    assert schema["prefixItems"][2:] == [{"type": "number"}, {"type": "number", "minimum": 0}]
    assert abi.compile_schema(schema).is_valid([True, "s", -2 ** 63, 1.8446744073709552e19])


# ---------------------------------------------------------------------------------------------------------------------
# The validator: problems, paths, wire args

def test_problems_are_every_error_with_dotted_paths(every_kind):
    args = {"profile": {"name": 5, "tags": ["a", 7], "bio": 3}}
    wire, problems = check(every_kind, args, "set_profile")
    assert wire is None
    assert problems == [
        abi.Problem("profile.name", "expected string, got 5"),
        abi.Problem("profile.bio", "expected string or null, got 3"),
        abi.Problem("profile.tags.1", "expected string, got 7"),
    ]
    assert abi.render_problems(problems) == (
        "- profile.name: expected string, got 5\n"
        "- profile.bio: expected string or null, got 3\n"
        "- profile.tags.1: expected string, got 7")


PROBLEMS = [
    ("not an object", [1], [("args", "expected object, got [1]")]),
    ("a string", "x", [("args", 'expected object, got "x"')]),
    ("missing", {}, [("key", "missing required parameter"), ("value", "missing required parameter")]),
    ("wrong type", {"key": "k", "value": 42}, [("value", "expected string, got 42")]),
    ("long values are cut", {"key": "k", "value": list(range(40))},
     [("value", "expected string, got " + json.dumps(list(range(40)))[:57] + "...")]),
]


@pytest.mark.parametrize("case, args, problems", PROBLEMS, ids=[row[0] for row in PROBLEMS])
def test_problem_messages(case, args, problems):
    manifest = manifest_of([("key", k("string")), ("value", k("string"))])
    assert check(manifest, args) == (None, [abi.Problem(*p) for p in problems])


MORE_PROBLEMS = [
    ("below minimum", k("u32"), -1, ("v", "expected an integer >= 0, got -1")),
    ("above maximum", k("i32"), 2 ** 31, ("v", "expected an integer <= 2147483647, got 2147483648")),
    ("fraction", k("u64"), 1.5, ("v", "expected integer, got 1.5")),
    ("tuple too long", k("tuple", elements=[k("u32")]), [1, 2], ("v", "expected exactly 1 item, got 2")),
    ("tuple element", k("tuple", elements=[k("u32"), k("string")]), [1, 2], ("v.1", "expected string, got 2")),
    ("map value", k("map", key=k("string"), value=k("bool")), {"a": 1}, ("v.a", "expected boolean, got 1")),
    ("record field", ref("Point"), {"x": 1}, ("v.y", "missing required field")),
]


@pytest.mark.parametrize("case, typ, value, problem", MORE_PROBLEMS, ids=[row[0] for row in MORE_PROBLEMS])
def test_more_problem_messages(case, typ, value, problem):
    assert check(one_param(typ, POINT), {"v": value}) == (None, [abi.Problem(*problem)])


def test_none_args_means_no_args():
    assert check(manifest_of(), None) == ({}, [])
    assert check(manifest_of([("a", k("u32"))]), None) == (None, [abi.Problem("a", "missing required parameter")])


def test_wire_args_keep_declared_params_only_and_omitted_nullables_stay_omitted(every_kind):
    args = {"app_handle": "h.x", "context": "c", "_context": "d", "profile": {"name": "a", "tags": []}, "extra": 1}
    assert check(every_kind, args, "set_profile") == ({"profile": {"name": "a", "tags": []}}, [])


def test_declared_context_reaches_the_app(every_kind):
    args = {"context": "mine", "_context": 3, "app_handle": "h"}
    assert check(every_kind, args, "own_context") == ({"context": "mine", "_context": 3}, [])


def test_undeclared_names(every_kind):
    validator = abi.Validator(every_kind, "set_profile")
    args = {"profile": {}, "zeta": 1, "alpha": 2, "app_handle": "h", "context": "c", "_context": "d"}
    assert validator.undeclared(args) == ["alpha", "zeta"]
    assert validator.undeclared(args, ignore_injected=False) == ["_context", "alpha", "app_handle", "context", "zeta"]
    assert abi.Validator(every_kind, "init").undeclared({"owner": "me"}) == []


def test_validator_compiles_once(every_kind, monkeypatch):
    compiled = []
    real = abi.compile_schema
    monkeypatch.setattr(abi, "compile_schema", lambda schema: compiled.append(schema) or real(schema))
    validator = abi.Validator(every_kind, "count")
    for _ in range(5):
        validator.check({})
    assert len(compiled) == 1


def test_importing_abi_does_not_import_jsonschema():
    code = "import sys; sys.path.insert(0, %r); import abi; print('jsonschema' in sys.modules)" % str(HERE.parent)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_unknown_method_is_an_abi_error(every_kind):
    with pytest.raises(abi.AbiError, match='Method "nope" is not in the ABI.'):
        abi.Validator(every_kind, "nope")


# ---------------------------------------------------------------------------------------------------------------------
# Signatures and method references (abi-mapping.md "Method signatures"; reference §4.5, §4.6)

SIGNATURES = [
    ("get", [("key", k("string"))], k("string"), {"intent": "read_only", "returns_nullable": True},
     "[view] get(key: string) -> string | null"),
    ("set", [("k", k("string"), {"nullable": True})], k("unit"), {}, "[mut] set(k?: string) -> unit"),
    ("set", [("key", k("string")), ("value", k("string"))], None, {"intent": "mutating"},
     "[mut] set(key: string, value: string) -> unit"),
    ("entries", [], k("map", key=k("string"), value=k("string")), {"intent": "read_only"},
     "[view] entries() -> map<string, string>"),
    ("find", [], ref("Point"), {"intent": "read_only", "returns_nullable": True}, "[view] find() -> Point | null"),
    ("put", [("entries", k("map", key=k("string"), value=k("u32")))], k("record", fields=[]), {"intent": "unspecified"},
     "[mut] put(entries: map<string, u32>) -> {}"),
    ("bulk", [("xs", k("list", items=ref("Point"))), ("m", k("map", key="string", value=k("u64")))], k("bytes"), {},
     "[mut] bulk(xs: Point[], m: map<string, u64>) -> bytes"),
    ("pair", [("t", k("tuple", elements=[k("string"), k("u64")]))], k("list", items=k("tuple", elements=[k("bool")])),
     {}, "[mut] pair(t: (string, u64)) -> (bool)[]"),
    ("reg", [("r", k("record", fields=[], crdt_type="lww_register", inner_type=ref("UserId")))],
     k("list", items=k("record", fields=[], crdt_type="lww_register", inner_type=k("u32"))), {},
     "[mut] reg(r: UserId) -> u32[]"),
    ("sized", [("b", k("bytes", size=32)), ("w", k("what"))], ref("Missing"), {},
     "[mut] sized(b: bytes, w: what) -> Missing"),
]


@pytest.mark.parametrize("name, params, returns, keys, expected", SIGNATURES, ids=[row[4] for row in SIGNATURES])
def test_signatures(name, params, returns, keys, expected):
    manifest = manifest_of(params, returns=returns, **keys)
    assert abi.signature(manifest, "m") == expected.replace(f" {name}(", " m(")


def test_signatures_of_every_kind(every_kind):
    assert abi.signature(every_kind, "set_profile") == "[mut] set_profile(profile: Profile, note?: string) -> Profile | null"
    assert abi.signature(every_kind, "collections") == (
        "[mut] collections(xs: u32[], points: map<string, Point>, pair: (string, u64), register: string, "
        "ledger: Ledger, bare: map<string, bool>) -> map<string, u32[]>")
    assert abi.signature(every_kind, "forget") == "[mut] forget() -> unit"


def test_method_references(every_kind):
    assert abi.method_reference(every_kind, "clear") == "Remove everything.\n\n[mut] clear() -> unit"
    assert abi.method_reference(every_kind, "set_profile") == (
        "Replace the profile.\n\n[mut] set_profile(profile: Profile, note?: string) -> Profile | null\n"
        "  profile: The new profile.\n  note: Why.")
    manifest = manifest_of([("key", k("string"), {"doc": "Up to 64 bytes.\nNo more."}), ("plain", k("u32"))],
                           returns=k("string"), intent="read_only")
    assert abi.method_reference(manifest, "m") == (
        "[view] m(key: string, plain: u32) -> string\n  key: Up to 64 bytes.\n    No more.")


# ---------------------------------------------------------------------------------------------------------------------
# Tool definitions (tools.md "Generated method tools"; reference §3.14)

@pytest.mark.parametrize("method, label, title", [
    ("set_blocks", "Mero Blocks", "Set blocks (Mero Blocks)"),
    ("get", "KV Store", "Get (KV Store)"),
    ("ping", "RawApp42", "Ping (RawApp42)"),
    ("__odd__name_", "x", "Odd name (x)"),
    ("_", "x", "_ (x)"),
])
def test_tool_titles(method, label, title):
    assert abi.tool_title(method, label) == title


def test_tool_descriptions(every_kind):
    assert abi.tool_description(every_kind, "count") == "How many entries.\n\n[view] count() -> u32"
    assert abi.tool_description(every_kind, "grow") == "[mut] grow(tree: Tree) -> Tree"


def test_a_long_doc_is_cut_so_the_description_keeps_its_signature():
    """Claude Code cuts a description past 2,048 characters from its end; the signature must survive."""
    doc = "Explains at length. " * 200
    manifest = manifest_of([("key", k("string"))], returns=k("u32"), doc=doc)
    description = abi.tool_description(manifest, "m")
    assert len(description) == 2048
    assert description.endswith("…\n\n[mut] m(key: string) -> u32")
    assert description.startswith("Explains at length. Explains")
    assert abi.method_reference(manifest, "m") == doc + "\n\n[mut] m(key: string) -> u32"   # describe_app: whole


ANNOTATIONS = [
    ("count", {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}),
    ("clear", {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False}),
    ("set_profile", {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False}),
    ("forget", {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": False}),
]


@pytest.mark.parametrize("method, expected", ANNOTATIONS, ids=[row[0] for row in ANNOTATIONS])
def test_tool_annotations(every_kind, method, expected):
    assert abi.tool_annotations(every_kind.method(method)) == expected
    assert abi.is_read_only(every_kind.method(method)) is expected["readOnlyHint"]


def test_tool_meta(every_kind):
    assert abi.tool_meta("com.x.kv", "1.0.0", "signer", every_kind.method("count")) == {
        "package": "com.x.kv", "appVersion": "1.0.0", "signerId": "signer", "intent": "read_only"}
    assert abi.tool_meta("RawApp42", None, None, every_kind.method("forget")) == {
        "package": "RawApp42", "appVersion": None, "signerId": None, "intent": "unspecified"}


def test_tool_methods_skip_init_and_handle_params(every_kind):
    names = [method.name for method in abi.tool_methods(every_kind)]
    assert "init" not in names and "with_handle" not in names
    assert names == sorted(names) and len(names) == len(every_kind.methods) - 2
    assert "collide" in abi.untooled_reason(every_kind, every_kind.method("with_handle"))


def test_a_method_with_an_unportable_argument_key_gets_no_tool():
    """Claude Code skips a tool whose schema has a property key outside [a-zA-Z0-9_.-]{1,64}; such a method
    (a serde-renamed field, say) is left to `call`, with the reason for the log."""
    odd = k("record", fields=[{"name": "user name", "type": k("string")}])
    manifest = abi.parse_manifest({"schema_version": "wasm-abi/1", "types": {"Odd": odd}, "methods": [
        {"name": "nested", "params": [{"name": "v", "type": ref("Odd")}]},
        {"name": "direct", "params": [{"name": "k" * 65, "type": k("string")}]},
        {"name": "fine", "params": [{"name": "a.b-c_D9", "type": k("string")}]}]}, "t")
    assert [method.name for method in abi.tool_methods(manifest)] == ["fine"]
    assert '"user name"' in abi.untooled_reason(manifest, manifest.method("nested"))
    assert abi.unportable_keys(abi.input_schema(manifest, "direct")) == ["k" * 65]
    assert abi.untooled_reason(manifest, manifest.method("fine")) is None


# ---------------------------------------------------------------------------------------------------------------------
# Tool names (abi-mapping.md "Tool naming"; tools.md; reference §3.14 examples)

def unit(package, app_id, methods, service=None, multi=False):
    return abi.ToolUnit(key=(app_id, service), package=package, app_id=app_id, service=service,
                        multi_service=multi, method_names=tuple(methods))


def hashed(name):
    return name[:42] + "_" + hashlib.sha256(name.encode()).hexdigest()[:6]


LONG = "reconcile_every_pending_transfer_now"
NAMING = [
    ("single service", [unit("com.calimero.kv-store", "kv-id", ["get", "init"])], (), ["kv_store_get"]),
    ("multi-service", [unit("com.calimero.mero-drive", "d", ["create_doc"], "docs", True),
                       unit("com.calimero.mero-drive", "d", ["register_folder"], "registry", True)], (),
     ["mero_drive_docs_create_doc", "mero_drive_registry_register_folder"]),
    ("one-service bundle is single-service", [unit("com.x.solo", "s", ["ping"], "main", False)], (), ["solo_ping"]),
    ("fixed tool clash", [unit("com.x.node", "nodeapp-id", ["status"])], ("node_status",), ["node_nodeap_status"]),
    ("generated name clash", [unit("com.x.kv", "a-id", ["store_get"]), unit("com.y.kv-store", "b-id", ["get"])], (),
     ["kv_store_get", "kv_store_bid_get"]),
    ("two signers", [unit("com.calimero.kv-store", "kv-a", ["set"]), unit("com.calimero.kv-store", "kv-b", ["set"])],
     (), ["kv_store_set", "kv_store_kvb_set"]),
    ("slug twins", [unit("com.calimero.kv-store", "kv-id", ["ping"]), unit("org.example.kv_store", "twin-id", ["ping"])],
     (), ["kv_store_ping", "kv_store_twinid_ping"]),
    ("no package", [unit(None, "RawApp42", ["ping"])], (), ["rawapp42_ping"]),
    ("slug cut to 20", [unit("com.x.a-very-long-application-name", "l", ["go"])], (), ["a_very_long_applicat_go"]),
    ("hashed long name", [unit("com.x.a-very-long-application-name", "l", [LONG])], (),
     [hashed("a_very_long_applicat_" + LONG)]),
    ("third twin counts up", [unit("a.kv", "x-1", ["p"]), unit("b.kv", "x1", ["p"]), unit("c.kv", "X_1", ["p"])], (),
     ["kv_p", "kv_x1_p", "kv_x1_2_p"]),
    ("odd characters", [unit("com.x.Mero Chat!!v2", "c", ["Send-Message"], "Main Room", True)], (),
     ["mero_chat_v2_main_room_send_message"]),
    ("empty trailing segment", [unit("com.x.", "e", ["go"])], (), ["com_x__go"]),
]


@pytest.mark.parametrize("case, units, reserved, expected", NAMING, ids=[row[0] for row in NAMING])
def test_tool_names(case, units, reserved, expected):
    names = abi.tool_names(units, reserved)
    assert list(names.values()) == expected
    assert all(TOOL_NAME.match(name) for name in names.values())


def test_hashed_name_is_49_characters_like_the_reference_example():
    names = abi.tool_names([unit("com.x.a-very-long-application-name", "l", [LONG])], ())
    (name,) = names.values()
    assert len(name) == 49 and name.startswith("a_very_long_applicat_reconcile_every_pendi_")
    assert re.fullmatch(r"[0-9a-f]{6}", name[-6:])


def test_tool_names_are_keyed_by_unit_and_method_and_skip_init():
    units = [unit("com.x.kv", "kv", ["set", "get", "init"])]
    assert abi.tool_names(units, ()) == {(("kv", None), "get"): "kv_get", (("kv", None), "set"): "kv_set"}


def test_tool_names_are_deterministic_and_a_clash_never_depends_on_method_order():
    units = [unit("com.a.kv", "id-a", ["b", "a"]), unit("com.b.kv", "id-b", ["a", "b"])]
    first = abi.tool_names(units, {"node_status"})
    assert first == abi.tool_names(list(units), ["node_status"])
    assert sorted(first.values()) == ["kv_a", "kv_b", "kv_idb_a", "kv_idb_b"]


def test_clash_on_a_hashed_name_still_finds_a_free_name():
    long_package = "com.x.a-very-long-application-name"
    first = abi.tool_names([unit(long_package, "l", [LONG])], ())
    (taken,) = first.values()
    names = abi.tool_names([unit(long_package, "l", [LONG])], {taken})
    (name,) = names.values()
    assert name != taken and TOOL_NAME.match(name) and len(name) == 49


@pytest.mark.parametrize("given, slug", [
    ("com.calimero.kv-store", "kv_store"), ("RawApp42", "rawapp42"), ("org.example.kv_store", "kv_store"),
    ("com.x.KV--Store..v2", "v2"), ("com.x.Ünïcode", "_n_code"), ("x" * 30, "x" * 20), ("", "app"),
    ("com.x.3d-viewer", "_3d_viewer"), ("9" * 30, "_" + "9" * 19),      # a tool name never starts with a digit
])
def test_app_slug(given, slug):
    assert abi.app_slug(given) == slug


# ---------------------------------------------------------------------------------------------------------------------
# Guides: procedures (reference §3.9)

PROCEDURES = [
    ("basic", "# App\n## Procedures\n### Add a key\ntext\n### Remove it\n## Other\n### Not this", ["Add a key", "Remove it"]),
    ("none without heading", "# App\n### Loose\n## Notes\n### Also not", []),
    ("heading must be the whole line", "## Procedures and more\n### No", []),
    ("trailing whitespace and CRLF", "## Procedures  \r\n### One  \r\n###   Two\t\r\n", ["One", "Two"]),
    ("BOM", "\ufeff## Procedures\n### First", ["First"]),
    ("fenced headings ignored", "## Procedures\n```md\n## Other\n### Fake\n```\n### Real", ["Real"]),
    ("indented fence counts", "## Procedures\n   ```\n### Fake\n   ```\n### Real", ["Real"]),
    ("tab-indented backticks are not a fence", "## Procedures\n\t```\n### Seen\n\t```\n### Also", ["Seen", "Also"]),
    ("empty titles skipped", "## Procedures\n### \n###\n### Kept", ["Kept"]),
    ("second procedures section", "## Procedures\n### A\n## X\n### no\n## Procedures\n### B", ["A", "B"]),
    ("not a string", None, []),
]


@pytest.mark.parametrize("case, guide, titles", PROCEDURES, ids=[row[0] for row in PROCEDURES])
def test_procedures(case, guide, titles):
    assert abi.procedures(guide) == titles


# ---------------------------------------------------------------------------------------------------------------------
# Every manifest: samples built from the ABI type are accepted (and converted as expected); wrong types are refused

class Sampler:
    """A valid value for an ABI type, paired with what the validator should send to the node."""

    def __init__(self, types):
        self.types = types

    def pair(self, typ, depth=0, untagged=False):
        if "$ref" in typ:
            target = self.types.get(typ["$ref"])
            if target is None or depth >= abi.MAX_REF_DEPTH:
                return {"unchecked": ["ab"]}, {"unchecked": ["ab"]}
            return self.pair(target, depth + 1, untagged)
        kind = typ.get("kind")
        simple = {"bool": True, "string": "text", "i32": -5, "i64": -(2 ** 60), "u32": 7, "u64": 2 ** 63 + 1,
                  "f32": 1.5, "f64": 2.25, "unit": None}
        if kind in simple:
            return simple[kind], simple[kind]
        method = getattr(self, kind + "_", None)
        return method(typ, depth, untagged) if method else ({"unchecked": 1}, {"unchecked": 1})

    def bytes_(self, typ, depth, untagged):
        data = bytes(range(1, 1 + (typ.get("size") or 2)))
        return (list(data) if untagged else data.hex()), list(data)

    def alias_(self, typ, depth, untagged):
        return self.pair(typ["target"], depth, untagged)

    def list_(self, typ, depth, untagged):
        if depth >= 3:
            return [], []
        given, sent = self.pair(typ["items"], depth, untagged)
        return [given], [sent]

    def map_(self, typ, depth, untagged):
        given, sent = self.pair(typ["value"], depth, untagged)
        return {"k": given}, {"k": sent}

    def tuple_(self, typ, depth, untagged):
        pairs = [self.pair(element, depth, untagged) for element in typ["elements"]]
        return [given for given, _ in pairs], [sent for _, sent in pairs]

    def record_(self, typ, depth, untagged):
        if "crdt_type" in typ and "inner_type" in typ:
            return self.pair(typ["inner_type"], depth, untagged)
        given, sent = ({}, {}) if untagged else ({"zz_undeclared": 1}, {})
        for field in typ["fields"]:
            if field.get("nullable"):
                given[field["name"]] = sent[field["name"]] = None
            else:
                given[field["name"]], sent[field["name"]] = self.pair(field["type"], depth, untagged)
        return given, sent

    def variant_(self, typ, depth, untagged):
        variants = typ["variants"]
        if typ.get("untagged"):
            first = variants[0]
            return (None, None) if "payload" not in first else self.pair(first["payload"], depth, True)
        if typ.get("tag"):
            return self.tagged(typ, variants, depth, untagged)
        chosen = next((v for v in reversed(variants) if "payload" in v), variants[0])
        if "payload" not in chosen:
            return chosen["name"], chosen["name"]
        given, sent = self.pair(chosen["payload"], depth, untagged)
        return {chosen["name"]: given}, {chosen["name"]: sent}

    def tagged(self, typ, variants, depth, untagged):
        tag, content, first = typ["tag"], typ.get("content"), variants[0]
        if content:
            if "payload" not in first:
                return {tag: first["name"]}, {tag: first["name"]}
            given, sent = self.pair(first["payload"], depth, untagged)
            return {tag: first["name"], content: given}, {tag: first["name"], content: sent}
        return {tag: first["name"]}, {tag: first["name"]}   # the every-kind tests cover internal payloads


WRONG = {"bool": "yes", "string": 42, "i32": "7", "i64": "7", "u32": "7", "u64": "7", "f32": "1.5", "f64": "1.5",
         "unit": 0, "bytes": "xyz", "list": "x", "map": ["x"], "tuple": {"x": 1}, "record": "x", "variant": 12345}


def wrong_value(types, typ, depth=0):
    """A value of the wrong JSON type for `typ`, or None when the type accepts anything."""
    while "$ref" in typ:
        if typ["$ref"] not in types or depth >= abi.MAX_REF_DEPTH:
            return None
        typ, depth = types[typ["$ref"]], depth + 1
    if typ.get("kind") == "alias":
        return wrong_value(types, typ["target"], depth)
    if typ.get("kind") == "record" and "inner_type" in typ and "crdt_type" in typ:
        return wrong_value(types, typ["inner_type"], depth)
    if typ.get("kind") == "variant" and typ.get("untagged"):
        return None
    return WRONG.get(typ.get("kind"))


def manifest_paths():
    own = sorted(MANIFESTS.glob("*.json"))
    shared = sorted(SHARED_ABI.glob("*.json")) if SHARED_ABI.exists() else []
    return own + [path for path in shared if path.name != "wasm-abi.schema.json"]


def shared_manifests_with_methods():
    if not SHARED_ABI.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{SHARED_ABI} is absent"))]
    found = [path for path in sorted(SHARED_ABI.glob("*.json"))
             if path.name != "wasm-abi.schema.json" and load(path).get("methods")]
    return [pytest.param(path, id=path.stem) for path in found]


@pytest.mark.parametrize("path", shared_manifests_with_methods())
def test_shared_manifests_map_with_zero_degradations(path):
    manifest = abi.parse_manifest(load(path), path.stem)
    assert abi.degradations(manifest) == []
    for method in manifest.methods:
        assert abi.unknown_paths(abi.input_schema(manifest, method)) == []
        assert abi.unknown_paths(abi.output_schema(manifest, method, wrap=False) or {"type": "null"}) == []


def test_the_state_schema_form_parses_with_no_methods():
    manifest = shared_manifest("core-state-schema-conformance.state-schema.json")
    assert manifest.methods == () and "StateSchemaConformance" in manifest.types
    assert abi.degradations(manifest) == []


def own_and_shared_manifests():
    """The manifests that declare methods: one with none (the state-schema form) has nothing for these tests to
    check, and test_the_state_schema_form_parses_with_no_methods covers it."""
    return [pytest.param(path, id=path.stem) for path in manifest_paths() if declares_methods(path)]


def declares_methods(path):
    try:
        raw = load(path)
    except ValueError:
        return True              # a manifest being edited fails its own tests, not the collection
    return not isinstance(raw, dict) or raw.get("methods") != []


def manifest_with_methods(path):
    return abi.parse_manifest(load(path), path.stem)


def check_schema(schema):
    """A valid 2020-12 schema; under jsonschema 3.2, which has no 2020-12 meta-schema, a valid Draft 7 one as
    abi.draft7 writes it (what that release validates with), holding no keyword Draft 7 would ignore."""
    modern = getattr(jsonschema, "Draft202012Validator", None)
    if modern is not None:
        modern.check_schema(schema)
    else:
        jsonschema.Draft7Validator.check_schema(abi.draft7(schema))
    assert not draft7_unknown(schema), draft7_unknown(schema)


def draft7_unknown(schema):
    """The keywords of abi.DRAFT7_UNKNOWN anywhere in `schema` (any dict in it: a property named so counts too)."""
    if isinstance(schema, dict):
        return [key for key in schema if key in abi.DRAFT7_UNKNOWN] + [
            found for value in schema.values() for found in draft7_unknown(value)]
    if isinstance(schema, list):
        return [found for value in schema for found in draft7_unknown(value)]
    return []


@pytest.mark.parametrize("path", own_and_shared_manifests())
def test_every_schema_is_valid_draft_2020_12(path):
    manifest = manifest_with_methods(path)
    for method in manifest.methods:
        schemas = [abi.params_schema(manifest, method), abi.input_schema(manifest, method),
                   abi.output_schema(manifest, method, True), abi.output_schema(manifest, method, False)]
        for schema in filter(None, schemas):
            check_schema(schema)
        assert abi.input_schema(manifest, method)["type"] == "object"
        wrapped = abi.output_schema(manifest, method, True)
        assert wrapped is None or wrapped["type"] == "object"


@pytest.mark.parametrize("path", own_and_shared_manifests())
def test_samples_are_accepted_converted_and_wrong_types_refused(path):
    manifest = manifest_with_methods(path)
    sampler = Sampler(manifest.types)
    for method in manifest.methods:
        validator = abi.Validator(manifest, method)
        pairs = {param.name: sampler.pair(param.type) for param in method.params}
        given = {name: pair[0] for name, pair in pairs.items()}
        sent = {name: pair[1] for name, pair in pairs.items()}
        injected = {name: "injected" for name in abi.INJECTED_NAMES if name not in given}
        assert validator.check(dict(given, **injected)) == (sent, []), method.name
        wrong = next(((param.name, value) for param in method.params
                      for value in [wrong_value(manifest.types, param.type)] if value is not None), None)
        bad_args = dict(given, **{wrong[0]: wrong[1]}) if wrong else ["not", "an", "object"]
        result, problems = validator.check(bad_args)
        assert result is None and [p.path for p in problems] == [wrong[0] if wrong else "args"], method.name


@pytest.mark.parametrize("path", own_and_shared_manifests())
def test_wire_form_of_every_return_satisfies_its_output_schema(path):
    manifest = manifest_with_methods(path)
    sampler = Sampler(manifest.types)
    for method in manifest.methods:
        raw = abi.output_schema(manifest, method, wrap=False)
        if raw is None:
            continue
        _, value = sampler.pair(method.returns)
        assert abi.compile_schema(raw).is_valid(value), method.name
        wrapped = abi.output_schema(manifest, method, wrap=True)
        result = value if wrapped is raw or wrapped == raw else {"result": value}
        assert abi.compile_schema(wrapped).is_valid(result), method.name
        if method.returns_nullable:
            assert abi.compile_schema(raw).is_valid(None)


def test_shared_kv_store_matches_the_reference_expectations():
    manifest = shared_manifest("mero-mcp-rc83-kv-store.json")
    assert len(manifest.methods) == 11
    assert [m.name for m in abi.tool_methods(manifest)] == [
        "clear", "entries", "get", "get_or_insert", "get_result", "get_unchecked", "len", "remove", "set",
        "update_if_exists"]
    assert abi.signature(manifest, "entries") == "[view] entries() -> map<string, string>"
    assert abi.tool_annotations(manifest.method("remove")) == {
        "readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False}
    assert abi.output_schema(manifest, "len", wrap=False)["description"] == (
        "The number of keys in the store; `0` when it is empty.")
    assert check(manifest, {"key": "k", "value": 42}, "set") == (None, [abi.Problem("value", "expected string, got 42")])


def test_shared_conformance_status_and_ids():
    manifest = shared_manifest("mero-mcp-rc83-abi_conformance.json")
    assert abi.signature(manifest, "opt_id") == "[mut] opt_id(x?: UserId32) -> UserId32 | null"
    assert abi.params_schema(manifest, "roundtrip_id")["properties"]["x"]["anyOf"][0]["pattern"] == "^[0-9a-fA-F]{64}$"
    assert check(manifest, {"x": "dead"}, "roundtrip_id") == (None, [abi.Problem(
        "x", 'expected a hex string of 64 digits or an array of 32 bytes (0-255), got "dead"')])
    assert check(manifest, {"a": {"MultiTuple": {"field_0": 1, "field_1": "s"}}}, "act")[1] == []
    status = abi.output_schema(manifest, "get_status", wrap=False)
    assert status["oneOf"][0] == {"type": "string", "enum": ["Pending"]}
    assert status["oneOf"][1]["properties"]["Active"]["properties"]["timestamp"] == {"type": "number", "minimum": 0}


def test_advertised_output_admits_the_null_a_none_return_rides_as():
    """kv-store `get` returns Option<String> but its ABI omits returns_nullable (node-api.md §5.5)."""
    manifest = abi.parse_manifest({"schema_version": "wasm-abi/1", "types": {"P": {"kind": "record", "fields": []}},
                                   "methods": [{"name": "get", "params": [], "returns": {"kind": "string"}},
                                               {"name": "rec", "params": [], "returns": {"$ref": "P"}},
                                               {"name": "opt", "params": [], "returns": {"kind": "u32"},
                                                "returns_nullable": True}]}, "t")
    assert abi.output_schema(manifest, "get", False, admit_null=True) == {"type": ["string", "null"]}
    assert abi.output_schema(manifest, "get", True, admit_null=True) == {
        "type": "object", "properties": {"result": {"type": ["string", "null"]}}, "required": ["result"]}
    # an object root too (a None record rides as null): wrapped in the handshake era, whose structuredContent
    # must be an object
    assert abi.output_schema(manifest, "rec", False, admit_null=True) == {"type": ["object", "null"], "properties": {}}
    assert abi.output_schema(manifest, "rec", True, admit_null=True) == {"type": "object", "properties": {
        "result": {"type": ["object", "null"], "properties": {}}}, "required": ["result"]}
    assert abi.output_schema(manifest, "rec", True) == {"type": "object", "properties": {}}
    assert abi.output_schema(manifest, "opt", False, admit_null=True) == abi.output_schema(manifest, "opt", False)


# ---------------------------------------------------------------------------------------------------------------------
# jsonschema 3.2 (Ubuntu 22.04, Debian 11) has no 2020-12 validator: abi.compile_schema checks with Draft 7 there.

HOSTILE = (None, True, 0, -1, 1.5, 2 ** 70, "", "zz", [], [0], [1, 2, 3, 4, 5], [None], {}, {"a": 1}, {"Unit": None})


def tuple_manifest():
    return manifest_of([("pair", {"kind": "tuple", "elements": [{"kind": "string"}, {"kind": "u32"}]}),
                        ("none", ref("Never"), {"nullable": True})],
                       types={"Never": {"kind": "variant", "variants": []}})


def compared_manifests():
    return [pytest.param(None, id="tuple-and-no-variant")] + own_and_shared_manifests()


# Under jsonschema 3.2 (make test-oldest), which has no 2020-12 validator, the 2020-12 verdicts come from another
# Python that has one: the suite's own venv, named by this variable (the Makefile sets it).
MODERN_PYTHON = "MERO_MCP_TEST_MODERN_PYTHON"
VERDICTS_2020_12 = """
import json, sys
sys.path.insert(0, sys.argv[1])
import abi, jsonschema
verdicts = []
for schema, cases in json.load(sys.stdin):
    validator = jsonschema.Draft202012Validator(schema)
    verdicts.append([[list(problem) for problem in abi.schema_problems(validator, args)] for args in cases])
json.dump(verdicts, sys.stdout)
"""


def verdicts_2020_12(checks):
    """For each (schema, [args…]) the problems the schema gives each args under Draft 2020-12, as [path, message]
    lists: here when this jsonschema has the validator, else from the Python MERO_MCP_TEST_MODERN_PYTHON names."""
    modern = getattr(jsonschema, "Draft202012Validator", None)
    if modern is not None:
        return [[[list(problem) for problem in abi.schema_problems(modern(schema), args)] for args in cases]
                for schema, cases in checks]
    python = os.environ.get(MODERN_PYTHON)
    if not python:
        pytest.skip("jsonschema %s has no 2020-12 validator, and %s names no Python that has one"
                    % (jsonschema.__version__, MODERN_PYTHON))
    done = subprocess.run([python, "-c", VERDICTS_2020_12, str(HERE.parent)], input=json.dumps(checks),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("path", compared_manifests())
def test_draft_7_gives_the_verdicts_and_texts_of_2020_12(path):
    """Every method's arguments, right and wrong (each parameter given each hostile value, and left out), get the
    same problems, in the same words and order, from the schema under 2020-12 and from abi.draft7's under Draft 7:
    under jsonschema 3.2 that is the Draft 7 check the server runs (abi.compile_schema)."""
    manifest = tuple_manifest() if path is None else manifest_with_methods(path)
    sampler = Sampler(manifest.types)
    checks = []
    for method in manifest.methods:
        given = {"pair": ["a", 1], "none": None} if path is None else {
            param.name: sampler.pair(param.type)[0] for param in method.params}
        cases = [given, [], "args"] + [dict(given, **{param.name: value}) for param in method.params
                                       for value in HOSTILE] + [
            {name: value for name, value in given.items() if name != param.name} for param in method.params]
        checks.append((abi.params_schema(manifest, method), cases))
    compared = refused = 0
    for (schema, cases), verdicts in zip(checks, verdicts_2020_12(checks)):
        old = jsonschema.Draft7Validator(abi.draft7(schema))
        for args, problems in zip(cases, verdicts):
            assert [list(problem) for problem in abi.schema_problems(old, args)] == problems, (schema, args)
            compared, refused = compared + 1, refused + bool(problems)
    assert refused and compared > refused, (compared, refused)
    assert compared == sum(len(cases) for _, cases in checks)


def test_draft7_translates_the_tuple_and_leaves_the_schema_as_it_was():
    manifest = tuple_manifest()
    schema = abi.params_schema(manifest, "m")
    before = json.dumps(schema)
    pair = abi.draft7(schema)["properties"]["pair"]
    assert json.dumps(schema) == before
    assert list(pair) == ["type", "items", "additionalItems", "minItems", "maxItems"]
    assert pair["items"] == [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1}]
    assert pair["additionalItems"] is False
    validator = abi.compile_schema(schema)
    assert abi.schema_problems(validator, {"pair": ["a", 1, 2], "none": None}) == [
        abi.Problem("pair", "expected exactly 2 items, got 3")]
    assert abi.schema_problems(validator, {"pair": [1, -3], "none": 5}) == [
        abi.Problem("pair.0", "expected string, got 1"), abi.Problem("pair.1", "expected an integer >= 0, got -3"),
        abi.Problem("none", "no value fits here, got 5")]
