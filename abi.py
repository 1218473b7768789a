"""Pure ABI mapping for mero-mcp: a `wasm-abi/1` manifest in; JSON Schemas, validators, signatures and tool names out.

Nothing here does I/O. The contract is `../shared/spec/abi-mapping.md` and `tools.md` ("Generated method tools");
`reference-behaviour.md` §3.9, §3.14 and §4 fill in what they leave open. Where the two differ, the spec wins.

Sections: constants · manifest · type -> JSON Schema · method schemas · degradations · validation ·
wire arguments · signatures · tool definitions · tool names · guides.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Set, Tuple

# ---------------------------------------------------------------------------------------------------------------------
# Constants

# The release this file belongs to: mero_mcp.py, node.py and abi.py carry the same one (mero_mcp.module_problems).
__version__ = "0.1.0"
INPUT = "input"     # what an agent may send (inputSchema, validation)
OUTPUT = "output"   # what the node returns (outputSchema)

MAX_REF_DEPTH = 8           # abi-mapping.md "Type references and recursion": beyond this a $ref degrades to unknown
SLUG_MAX = 20               # tools.md: <app> is cut to 20 characters
DESCRIPTION_MAX = 2048      # Claude Code cuts a longer tool description, silently
TOOL_NAME_MAX = 49          # 64 minus Claude Code's 15-character `mcp__mero-mcp__` prefix (reference §3.14)
HASHED_NAME_KEEP = 42       # a longer name keeps 42 characters, then `_` + 6 hex of its sha256
ID_TAIL_LENGTH = 6          # a clashing name adds `_` + 6 alphanumerics of the application id

# The routing arguments every generated tool accepts. Advertised: app_handle, and _context (abi-mapping.md) or, when
# the method declares _context, context (tools.md's name, otherwise accepted as _context's synonym unadvertised). The
# server's instructions say once how they work, so each schema carries only a few words.
INJECTED_NAMES = ("app_handle", "context", "_context")
ROUTING_DESCRIPTIONS = {"app_handle": "From select_app.", "_context": "Context id or alias.",
                        "context": "Context id or alias."}
# One schema object per routing argument, shared by every tool's input schema (memory, with a thousand tools).
ROUTING_PROPERTIES = {name: {"type": "string", "description": text} for name, text in ROUTING_DESCRIPTIONS.items()}
MISSING_PARAMETER = "missing required parameter"
MISSING_FIELD = "missing required field"

# Every JSON value has one of these types: what the degraded `unknown` lists, so that every schema node states a type
# (some hosts drop a tool with an untyped node) while accepting anything.
JSON_TYPES = ("string", "number", "boolean", "object", "array", "null")
UNCHECKED = "any JSON value, passed through unchecked"

PROPERTY_KEY = re.compile(r"[a-zA-Z0-9_.-]{1,64}")   # what Claude Code accepts as a property key

_SCHEMA_VERSION = re.compile(r"wasm-abi/1(?:\.[0-9]+)?")
_UNSIZED_HEX = "^(?:[0-9a-fA-F]{2})*$"
_BYTE = {"type": "integer", "minimum": 0, "maximum": 255}
_INTEGER_KINDS = frozenset({"i32", "i64", "u32", "u64"})

# abi-mapping.md "Scalars". u32/i32 carry their real bounds; i64/u64 stay unbounded so a value beyond 2^53 is still
# accepted (Python keeps it exact). Output mode relaxes i64/u64 to `number` (reference §4.2).
_INPUT_SCALARS = {
    "bool": {"type": "boolean"},
    "string": {"type": "string"},
    "unit": {"type": "null"},
    "i32": {"type": "integer", "minimum": -(2 ** 31), "maximum": 2 ** 31 - 1},
    "u32": {"type": "integer", "minimum": 0, "maximum": 2 ** 32 - 1},
    "i64": {"type": "integer"},
    "u64": {"type": "integer", "minimum": 0},
    "f32": {"type": "number"},
    "f64": {"type": "number"},
}
_OUTPUT_SCALARS = dict(_INPUT_SCALARS, i64={"type": "number"}, u64={"type": "number", "minimum": 0})


# ---------------------------------------------------------------------------------------------------------------------
# Manifest

class AbiError(ValueError):
    """A manifest we refuse; the message names the application."""


class Param(NamedTuple):
    name: str
    type: dict
    nullable: bool
    doc: Optional[str]


class Method(NamedTuple):
    name: str
    params: Tuple[Param, ...]
    returns: Optional[dict]
    returns_nullable: bool
    returns_doc: Optional[str]
    intent: Optional[str]
    doc: Optional[str]
    destructive: bool
    idempotent: bool

    def param_names(self) -> List[str]:
        return [param.name for param in self.params]


class Event(NamedTuple):
    name: str
    payload: Any                  # a TypeRef, or None for an event that carries nothing
    doc: Optional[str]


class Manifest(NamedTuple):
    types: dict                   # name -> type definition; treat as read-only
    methods: Tuple[Method, ...]   # in ABI order
    events: Tuple[Event, ...] = ()   # what the app's methods may emit (node-api §0.9), in ABI order

    def method(self, name: str) -> Optional[Method]:
        for method in self.methods:
            if method.name == name:
                return method
        return None


def parse_manifest(raw: Any, label: str) -> Manifest:
    """Read a `wasm-abi/1[.N]` manifest; unknown keys are ignored and `raw` is never mutated (it is copied)."""
    def refuse(reason: str) -> AbiError:
        return AbiError(f'Application "{label}" has an unusable ABI: {reason}.')

    if not isinstance(raw, dict):
        raise refuse("the manifest is not a JSON object")
    version = raw.get("schema_version")
    if not isinstance(version, str) or not _SCHEMA_VERSION.fullmatch(version):
        raise refuse(f"schema_version {json.dumps(version)} is not wasm-abi/1")
    if not isinstance(raw.get("methods"), list):
        raise refuse("it has no methods list")
    types = raw.get("types") if raw.get("types") is not None else {}
    if not isinstance(types, dict):
        raise refuse("types is not an object")
    methods = tuple(_parse_method(entry, index, refuse) for index, entry in enumerate(raw["methods"]))
    names = [method.name for method in methods]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise refuse(f"method {duplicates[0]} is declared twice")
    return Manifest(types=copy.deepcopy(types), methods=methods, events=_parse_events(raw.get("events")))


def _parse_events(raw: Any) -> Tuple[Event, ...]:
    """The declared events; an entry without a name is left out (events never make an ABI unusable)."""
    events = []
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"]:
            doc = entry.get("doc") if isinstance(entry.get("doc"), str) else None
            events.append(Event(entry["name"], copy.deepcopy(entry.get("payload")), doc))
    return tuple(events)


def event_reference(event: Event) -> str:
    """An event as describe_app lists it: `Name(PayloadType)` like a signature, then its doc."""
    shown = event.name if event.payload is None else f"{event.name}({type_name(event.payload)})"
    return f"{shown}: {event.doc}" if event.doc else shown


def _parse_method(entry: Any, index: int, refuse) -> Method:
    if not isinstance(entry, dict) or not _is_name(entry.get("name")):
        raise refuse(f"method #{index + 1} has no name")
    name = entry["name"]
    params = entry.get("params") if entry.get("params") is not None else []
    if not isinstance(params, list):
        raise refuse(f"method {name} has params that are not a list")
    parsed = tuple(_parse_param(param, name, refuse) for param in params)
    if len({param.name for param in parsed}) != len(parsed):
        raise refuse(f"method {name} declares a parameter twice")
    returns = entry.get("returns")
    if returns is not None and not isinstance(returns, dict):
        raise refuse(f"method {name} has a return type that is not an object")
    return Method(
        name=name, params=parsed, returns=copy.deepcopy(returns),
        returns_nullable=entry.get("returns_nullable") is True, returns_doc=_text(entry.get("returns_doc")),
        intent=_text(entry.get("intent")), doc=_text(entry.get("doc")),
        destructive=entry.get("destructive") is True, idempotent=entry.get("idempotent") is True)


def _parse_param(entry: Any, method: str, refuse) -> Param:
    if not isinstance(entry, dict) or not _is_name(entry.get("name")):
        raise refuse(f"method {method} has a parameter without a name")
    if not isinstance(entry.get("type"), dict):
        raise refuse(f"parameter {entry['name']} of method {method} has no type")
    return Param(name=entry["name"], type=copy.deepcopy(entry["type"]),
                 nullable=entry.get("nullable") is True, doc=_text(entry.get("doc")))


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value != "" else None


def _method_of(manifest: Manifest, method) -> Method:
    """Accept a Method or a method name."""
    if isinstance(method, Method):
        return method
    found = manifest.method(method)
    if found is None:
        raise AbiError(f'Method "{method}" is not in the ABI.')
    return found


# ---------------------------------------------------------------------------------------------------------------------
# Type -> JSON Schema (reference §4.2; `$ref` expanded inline, depth-capped, per the decisions in reference §0)

class _At(NamedTuple):
    """Where the builder stands: how many `$ref`s deep, and whether inside an untagged enum."""
    depth: int = 0
    untagged: bool = False

    def deeper(self) -> "_At":
        return _At(self.depth + 1, self.untagged)

    def in_untagged(self) -> "_At":
        return _At(self.depth, True)


class _SchemaBuilder:
    """Builds JSON Schemas for ABI types in one mode and notes every place it had to fall back to unknown."""

    def __init__(self, types: Mapping, mode: str):
        self.types = types
        self.mode = mode
        self.where = ""
        self.degraded: List[str] = []

    def build(self, typ: Any, at: _At = _At()) -> dict:
        if not isinstance(typ, dict):
            return self.unknown("a type that is not an object")
        if "$ref" in typ:
            return self.reference(typ["$ref"], at)
        kind = typ.get("kind")
        build_kind = self._KINDS.get(kind) if isinstance(kind, str) else None
        if build_kind is None:
            return self.unknown(f"unknown kind {json.dumps(kind)}")
        return build_kind(self, typ, at)

    def unknown(self, reason: str) -> dict:
        # abi-mapping.md: unknown means accepted unvalidated and passed through.
        self.degraded.append(f"{self.where}: {reason}")
        return _unknown()

    def reference(self, name: Any, at: _At) -> dict:
        target = self.types.get(name) if isinstance(name, str) else None
        if not isinstance(target, dict):
            return self.unknown(f"$ref {json.dumps(name)} is not in the type table")
        if at.depth >= MAX_REF_DEPTH:
            return self.unknown(f'$ref "{name}" is nested more than {MAX_REF_DEPTH} deep')
        built, doc = self.build(target, at.deeper()), _text(target.get("doc"))
        if doc and target.get("kind") == "variant" and built.get("description") and _type_hint(built) is None:
            doc = "%s %s" % (doc, built["description"])     # keep what each variant means after the type's doc
        return _with_doc(built, doc)

    def scalar(self, typ: dict, at: _At) -> dict:
        table = _OUTPUT_SCALARS if self.mode == OUTPUT else _INPUT_SCALARS
        return dict(table[typ["kind"]])

    def bytes_(self, typ: dict, at: _At) -> dict:
        size = typ.get("size") if type(typ.get("size")) is int and typ["size"] >= 1 else None
        array = {"type": "array", "items": dict(_BYTE)}
        if size:
            array["minItems"] = array["maxItems"] = size
        # Output is a byte array only; inside an untagged enum serde matches the raw JSON, so a hex string would stay a
        # string and is not offered (reference §4.2).
        if self.mode == OUTPUT or at.untagged:
            array["description"] = _bytes_hint(size, hex_too=False)
            return array
        pattern = f"^[0-9a-fA-F]{{{2 * size}}}$" if size else _UNSIZED_HEX
        return dict(_union("anyOf", [{"type": "string", "pattern": pattern}, array]),
                    description=_bytes_hint(size, True))

    def list_(self, typ: dict, at: _At) -> dict:
        return {"type": "array", "items": self.build(typ.get("items"), at)}

    def map_(self, typ: dict, at: _At) -> dict:
        # Keys are always strings on the wire (node-api.md §5.4); the key type is not checked.
        return {"type": "object", "additionalProperties": self.build(typ.get("value"), at)}

    def tuple_(self, typ: dict, at: _At) -> dict:
        elements = typ.get("elements") if isinstance(typ.get("elements"), list) else []
        return {"type": "array", "prefixItems": [self.build(element, at) for element in elements],
                "items": False, "minItems": len(elements), "maxItems": len(elements)}

    def record(self, typ: dict, at: _At) -> dict:
        if _is_crdt_wrapper(typ):
            return self.build(typ["inner_type"], at)   # abi-mapping.md: the wire value is the inner type
        properties, required = {}, []
        for field in _fields(typ):
            schema = _with_doc(self.build(field["type"], at), field.get("doc"))
            if field.get("nullable") is True:
                # A nullable field may be null or left out, in both modes: serde reads a missing Option<T> field as
                # None, and the node leaves None fields out of its output (skip_serializing_if, reference §4.2).
                properties[field["name"]] = _nullable(schema)
            else:
                properties[field["name"]] = schema
                required.append(field["name"])
        # No additionalProperties: false. Unknown keys are dropped on the way out (wire arguments), not refused.
        return _object(properties, required)

    def alias(self, typ: dict, at: _At) -> dict:
        return self.build(typ.get("target"), at)

    def variant(self, typ: dict, at: _At) -> dict:
        variants = [entry for entry in typ.get("variants") or []
                    if isinstance(entry, dict) and _is_name(entry.get("name"))]
        if not variants:
            return {"not": {}, "description": "An enum with no variants: no value fits."}
        if typ.get("untagged") is True:
            members = [self._untagged_member(entry, at) for entry in variants]
            return members[0] if len(members) == 1 else _described_union("anyOf", members)
        tag, content = typ.get("tag"), typ.get("content")
        if _is_name(tag) and _is_name(content):
            members = [self._adjacent_member(entry, tag, content, at) for entry in variants]
        elif _is_name(tag):
            members = [member for entry in variants for member in self._internal_members(entry, tag, at)]
        else:
            members = self._external_members(variants, at)
        return members[0] if len(members) == 1 else _described_union("oneOf", members)

    def _external_members(self, variants: List[dict], at: _At) -> List[dict]:
        # abi-mapping.md "Variants": unit variants ride as bare names, payload variants as a single-key object.
        # Unit variants are one plain string enum, documented or not (abi-mapping.md); their docs describe it.
        units = [entry for entry in variants if _is_unit_variant(entry)]
        members = []
        if units:
            enum = {"type": "string", "enum": [entry["name"] for entry in units]}
            docs = ["%s: %s" % (entry["name"], _text(entry.get("doc"))) for entry in units if _text(entry.get("doc"))]
            members.append(_with_doc(enum, " ".join(docs)) if docs else enum)
        for entry in variants:
            if not _is_unit_variant(entry):
                payload = self.build(entry["payload"], at)
                member = {"type": "object", "properties": {entry["name"]: payload},
                          "required": [entry["name"]], "additionalProperties": False}
                members.append(_with_doc(member, entry.get("doc")))
        return members

    def _adjacent_member(self, entry: dict, tag: str, content: str, at: _At) -> dict:
        properties = {tag: _tag_const(entry["name"])}
        if not _is_unit_variant(entry):
            properties[content] = self.build(entry["payload"], at)
        return _with_doc(_object(properties, list(properties)), entry.get("doc"))

    def _internal_members(self, entry: dict, tag: str, at: _At) -> List[dict]:
        """serde internally tagged: the tag sits beside the payload's own keys (reference §4.2)."""
        tag_only = _object({tag: _tag_const(entry["name"])}, [tag])
        if _is_unit_variant(entry):
            return [_with_doc(tag_only, entry.get("doc"))]
        payload, depth = _resolve_payload(self.types, entry["payload"], at.depth)
        at = _At(depth, at.untagged)
        if payload is None:
            self.degraded.append(f"{self.where}: the payload of {entry['name']} cannot be resolved, "
                                 "so only its tag is checked")
            members = [tag_only]
        elif payload.get("kind") == "record":
            members = [_merge_tag(self.record(payload, at), tag, entry["name"])]
        elif payload.get("kind") == "map":
            members = [dict(tag_only, additionalProperties=self.build(payload.get("value"), at))]
        elif _is_internally_tagged(payload) and payload["tag"] != tag:
            members = [_merge_tag(inner, tag, entry["name"]) for inner in _as_members(self.variant(payload, at))]
        else:
            members = [tag_only]   # serde decides; the node reports what it cannot read
        return [_with_doc(member, entry.get("doc")) for member in members]

    def _untagged_member(self, entry: dict, at: _At) -> dict:
        schema = {"type": "null"} if _is_unit_variant(entry) else self.build(entry["payload"], at.in_untagged())
        return _with_doc(schema, entry.get("doc"))

    _KINDS = {
        **dict.fromkeys(_INPUT_SCALARS, scalar),
        "bytes": bytes_, "list": list_, "map": map_, "tuple": tuple_, "record": record, "alias": alias,
        "variant": variant,
    }


def _unknown() -> dict:
    return {"type": list(JSON_TYPES), "description": UNCHECKED}


def _is_unknown(schema: dict) -> bool:
    return schema.get("type") == list(JSON_TYPES) and not set(schema) - {"type", "description", "title"}


def _types(schema: dict) -> Optional[List[str]]:
    """The types a schema states, as a list; None when it states none."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    return list(kind) if isinstance(kind, list) else None


def _union(key: str, members: List[dict]) -> dict:
    """An anyOf/oneOf that also states its type: every type a member states (when each states one). A host that
    flattens unions then still knows the kinds of value; validation is unchanged, the members already imply it."""
    types: List[str] = []
    for member in members:
        stated = _types(member)
        if stated is None:
            return {key: members}
        types += [kind for kind in stated if kind not in types]
    return {"type": types, key: members}


def _described_union(key: str, members: List[dict]) -> dict:
    """A union of variants, described by the forms it accepts, for hosts that show a union as its first member."""
    union = _union(key, members)
    return dict(union, description=_forms_hint(union))


def _object(properties: dict, required: List[str]) -> dict:
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _fields(record: dict) -> List[dict]:
    fields = record.get("fields") if isinstance(record.get("fields"), list) else []
    return [field for field in fields if isinstance(field, dict) and _is_name(field.get("name")) and "type" in field]


def _is_crdt_wrapper(typ: dict) -> bool:
    return typ.get("kind") == "record" and "crdt_type" in typ and isinstance(typ.get("inner_type"), dict)


def _is_unit_variant(entry: dict) -> bool:
    return entry.get("payload") is None


def _is_internally_tagged(typ: dict) -> bool:
    return (typ.get("kind") == "variant" and _is_name(typ.get("tag"))
            and not _is_name(typ.get("content")) and typ.get("untagged") is not True)


def _tag_const(name: str) -> dict:
    return {"type": "string", "const": name}


def _merge_tag(member: dict, tag: str, name: str) -> dict:
    """Put `tag: name` in front of an object member's keys; the tag wins over a same-named field."""
    properties = {tag: _tag_const(name)}
    properties.update((key, value) for key, value in member.get("properties", {}).items() if key != tag)
    merged = dict(member, properties=properties)
    merged["required"] = [tag] + [key for key in member.get("required", []) if key != tag]
    return merged


def _as_members(schema: dict) -> List[dict]:
    return schema.get("oneOf", [schema])


def _resolve_payload(types: Mapping, typ: Any, depth: int) -> Tuple[Optional[dict], int]:
    """Follow `$ref`s, aliases and CRDT wrappers to the type that decides a payload's shape."""
    while isinstance(typ, dict):
        if "$ref" in typ:
            if depth >= MAX_REF_DEPTH or not isinstance(types.get(typ["$ref"]), dict):
                return None, depth
            typ, depth = types[typ["$ref"]], depth + 1
        elif typ.get("kind") == "alias":
            typ = typ.get("target")
        elif _is_crdt_wrapper(typ):
            typ = typ["inner_type"]
        else:
            return typ, depth
    return None, depth


def _bytes_hint(size: Optional[int], hex_too: bool) -> str:
    array = f"a {size}-byte array" if size else "a byte array"
    return f"bytes: a hex string or {array}" if hex_too else f"bytes: {array}"


def _bytes_size(schema: dict) -> Optional[int]:
    """The size of a bytes schema this module built (0 when unsized), or None for any other schema."""
    members = schema.get("anyOf")
    if (isinstance(members, list) and len(members) == 2 and members[0].get("type") == "string"
            and "[0-9a-fA-F]" in str(members[0].get("pattern", "")) and _is_byte_array(members[1])):
        return members[1].get("maxItems", 0)
    return None


def _is_byte_array(schema: dict) -> bool:
    return schema.get("type") == "array" and schema.get("items") == _BYTE


def _type_hint(schema: dict) -> Optional[str]:
    """The hint a schema's own description carries, which a doc must not hide: the forms of bytes (abi-mapping.md
    "Bytes") and of a union, or that an unknown value is passed through unchecked."""
    size = _bytes_size(schema)
    if size is not None:
        return _bytes_hint(size, hex_too=True)
    if _is_byte_array(schema):
        return _bytes_hint(schema.get("maxItems"), hex_too=False)
    if _is_unknown(schema):
        return UNCHECKED
    if "oneOf" in schema or "anyOf" in schema:
        return _forms_hint(schema)
    return None


def _forms_hint(schema: dict) -> str:
    return "one of " + ", ".join(_forms(schema))


def _with_doc(schema: dict, doc: Any) -> dict:
    """A copy of `schema` described by `doc`; a bytes hint stays, as `<doc> (<hint>)` (reference §4.2 "Parameters")."""
    doc = _text(doc)
    if doc is None:
        return schema
    hint = _type_hint(schema)
    return dict(schema, description=f"{doc} ({hint})" if hint else doc)


def _nullable(schema: dict) -> dict:
    """`schema` or null: `null` joins the type list (an enum's values too); a union, or a schema stating no type,
    is wrapped as anyOf [schema, null] instead. Keywords other than type, enum and const constrain only their own
    kind of value, so null passes them."""
    types = _types(schema)
    if types is not None and "null" in types:
        return schema
    if types is None or any(key in schema for key in ("anyOf", "oneOf", "not")):
        inner = dict(schema)
        description = inner.pop("description", None)
        wrapped = {"type": types + ["null"]} if types else {}
        wrapped["anyOf"] = [inner, {"type": "null"}]
        if description:
            wrapped["description"] = description
        return wrapped
    nullable = dict(schema, type=types + ["null"])
    if "const" in nullable:
        nullable["enum"] = [nullable.pop("const")]
    if "enum" in nullable:
        nullable["enum"] = list(nullable["enum"]) + [None]
    return nullable


# ---------------------------------------------------------------------------------------------------------------------
# Method schemas

def params_schema(manifest: Manifest, method) -> dict:
    """The object schema of the declared parameters only: what validation uses."""
    return _params_schema(manifest, _method_of(manifest, method), _SchemaBuilder(manifest.types, INPUT))


def _params_schema(manifest: Manifest, method: Method, builder: _SchemaBuilder) -> dict:
    properties, required = {}, []
    for param in method.params:
        builder.where = f"{method.name}.{param.name}"
        schema = _with_doc(builder.build(param.type), param.doc)
        if param.nullable:
            properties[param.name] = _nullable(schema)   # abi-mapping.md: a nullable parameter may be omitted
        else:
            properties[param.name] = schema
            required.append(param.name)
    return _object(properties, required)


def input_schema(manifest: Manifest, method) -> dict:
    """The advertised tool schema: app_handle and one context option (see INJECTED_NAMES), then the parameters."""
    method = _method_of(manifest, method)
    params = params_schema(manifest, method)
    properties = {name: ROUTING_PROPERTIES[name] for name in routing_names(method)}
    properties.update(params["properties"])
    return _object(properties, params.get("required", []))


def routing_names(method: Method) -> List[str]:
    """The routing arguments a method's tool advertises. abi-mapping.md "The _context option": declared parameters
    win, keeping their ABI type, so a method declaring _context is targeted through context, if it can be."""
    declared = set(method.param_names())
    context = next((name for name in ("_context", "context") if name not in declared), None)
    return [name for name in ("app_handle", context) if name is not None and name not in declared]


def output_schema(manifest: Manifest, method, wrap: bool, admit_null: bool = False) -> Optional[dict]:
    """The outputSchema in output mode, or None for a unit return; `wrap` is the handshake era (reference §3.14).

    `admit_null`: what the server advertises. The node answers `output: null` for every None (node-api.md
    §4.2), and real ABIs drop Option from a return without setting returns_nullable (kv-store `get`, §5.5); a
    schema refusing that null would make clients reject a successful call. So every root admits null, and in the
    handshake era, whose structuredContent must be an object, every root then rides wrapped as {result}."""
    method = _method_of(manifest, method)
    builder = _SchemaBuilder(manifest.types, OUTPUT)
    schema = _return_schema(manifest, method, builder)
    if schema is not None and admit_null:
        schema = _nullable(schema)
    return handshake_output(schema) if wrap else schema


def handshake_output(schema: Optional[dict]) -> Optional[dict]:
    """An output schema as the handshake era advertises it: a non-object root rides as {result}. The schema itself
    is kept, not copied, so one can serve both eras."""
    if schema is not None and schema.get("type") != "object":
        return {"type": "object", "properties": {"result": schema}, "required": ["result"]}
    return schema


def _return_schema(manifest: Manifest, method: Method, builder: _SchemaBuilder) -> Optional[dict]:
    if _returns_unit(manifest.types, method.returns):
        return None
    builder.where = f"{method.name} -> result"
    schema = _with_doc(builder.build(method.returns), method.returns_doc)
    return _nullable(schema) if method.returns_nullable else schema


def returns_unit(manifest: Manifest, method: Method) -> bool:
    """Whether the method returns nothing (no return type, or one that resolves to unit): its null is no value."""
    return _returns_unit(manifest.types, method.returns)


def _returns_unit(types: Mapping, returns: Optional[dict]) -> bool:
    resolved, _ = _resolve_payload(types, returns, 0)
    return returns is None or (resolved is not None and resolved.get("kind") == "unit")


# ---------------------------------------------------------------------------------------------------------------------
# Degradations: where a schema accepts anything because the ABI could not be followed

def unknown_paths(schema: Any, at: str = "#") -> List[str]:
    """JSON pointers of every subschema that validates nothing (an unknown type), `#` being the root."""
    if not isinstance(schema, dict):
        return []
    if _is_unknown(schema) or not set(schema) - {"description", "title"}:
        return [at]
    found = []
    for name, sub in (schema.get("properties") or {}).items():
        found += unknown_paths(sub, f"{at}/properties/{name}")
    for key in ("items", "additionalProperties"):
        found += unknown_paths(schema.get(key), f"{at}/{key}")
    for key in ("prefixItems", "anyOf", "oneOf"):
        for index, sub in enumerate(schema.get(key) or []):
            found += unknown_paths(sub, f"{at}/{key}/{index}")
    return found


def degradations(manifest: Manifest) -> List[str]:
    """Every place, in either mode, where a method's schema fell back to unknown, with the reason; [] is healthy."""
    found: List[str] = []
    for method in manifest.methods:
        for mode in (INPUT, OUTPUT):
            builder = _SchemaBuilder(manifest.types, mode)
            _params_schema(manifest, method, builder)
            _return_schema(manifest, method, builder)
            found += [entry for entry in builder.degraded if entry not in found]
    return found


# ---------------------------------------------------------------------------------------------------------------------
# Validation

class Problem(NamedTuple):
    path: str      # dotted, `args` for the arguments object itself
    message: str


def render_problems(problems: Iterable[Problem]) -> str:
    return "\n".join(f"- {problem.path}: {problem.message}" for problem in problems)


def schema_problems(validator, instance: Any) -> List[Problem]:
    """A compiled schema's errors for `instance` in the words Validator.check uses (values shown short, as JSON)."""
    return _problems(validator.iter_errors(instance))


def compile_schema(schema: dict):
    """A validator of `schema`, a Draft 2020-12 schema. jsonschema is imported here, so the server answers initialize
    without it. jsonschema 3.2 (Ubuntu 22.04's, Debian 11's) has no 2020-12 validator: its Draft 7 one checks the
    same schema as `draft7` writes it, with the same verdicts and, through `_problems`, the same texts."""
    import jsonschema
    modern = getattr(jsonschema, "Draft202012Validator", None)
    if modern is not None:
        return modern(schema)
    return jsonschema.Draft7Validator(draft7(schema))


# What 2020-12 spells differently from Draft 7, and what Draft 7 lacks. Our schemas use one of these forms only, the
# tuple (prefixItems, then items: false for "no more"); DRAFT7_UNKNOWN must stay out of them (test_abi checks every
# schema the server validates with), since Draft 7 would ignore those keywords and accept what 2020-12 refuses.
DRAFT7_UNKNOWN = ("$defs", "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
                  "minContains", "maxContains", "$anchor", "$dynamicRef", "$dynamicAnchor")
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties")


def draft7(schema: Any) -> Any:
    """`schema` (2020-12) in Draft 7's words: prefixItems becomes items (a list), and the items beside it
    additionalItems. Keys keep their order, so errors come in the same order; the original is not changed."""
    if not isinstance(schema, dict):
        return schema
    translated: Dict[str, Any] = {}
    tuple_form = "prefixItems" in schema
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            value = {name: draft7(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            value = [draft7(sub) for sub in value]
        elif key in _SUBSCHEMA:
            value = draft7(value)
        if key == "prefixItems":
            key = "items"
        elif key == "items" and tuple_form:
            key = "additionalItems"
        translated[key] = value
    return translated


def preload() -> None:
    """Import jsonschema now (the server does it once, on one thread; see mero_mcp.heavy)."""
    compile_schema({})


class Validator:
    """One method's argument check, compiled once: `check(args) -> (wire_args, problems)`."""

    def __init__(self, manifest: Manifest, method):
        self.method = _method_of(manifest, method)
        self.schema = params_schema(manifest, self.method)
        self._validator = compile_schema(self.schema)
        self._wire = _WireArgs(manifest.types)

    def check(self, args: Any) -> Tuple[Optional[dict], List[Problem]]:
        """Problems for every error; on success the arguments as the node wants them (declared params, hex -> ints)."""
        args = {} if args is None else args
        problems = _problems(self._validator.iter_errors(args))
        if problems:
            return None, problems
        return self._wire.params(self.method, args), []

    def undeclared(self, args: Mapping, ignore_injected: bool = True) -> List[str]:
        """Argument names the method does not declare; the injected names are not counted unless asked."""
        declared = set(self.method.param_names())
        if ignore_injected:
            declared.update(INJECTED_NAMES)
        return sorted(name for name in args if name not in declared)


def _problems(errors) -> List[Problem]:
    problems: List[Problem] = []
    for error in _without_redundant(list(errors)):
        problems += [problem for problem in _explain(error) if problem not in problems]
    return problems


def _without_redundant(errors: list) -> list:
    """A value outside an enum or a union also fails the `type` beside it; the enum's or the union's message says
    more, so keep that one."""
    telling = {(id(error.schema), tuple(error.absolute_path)) for error in errors
               if error.validator in ("enum", "const", "anyOf", "oneOf")}
    return [error for error in errors
            if not (error.validator == "type" and (id(error.schema), tuple(error.absolute_path)) in telling)]


def _explain(error, or_null: bool = False) -> List[Problem]:
    path = list(error.absolute_path)
    if error.validator == "required":
        missing = [name for name in error.validator_value
                   if isinstance(error.instance, dict) and name not in error.instance]
        message = MISSING_FIELD if path else MISSING_PARAMETER
        return [Problem(_dotted(path + [name]), message) for name in missing]
    if error.validator in ("anyOf", "oneOf"):
        return _explain_union(error, or_null)
    if error.validator in ("items", "additionalItems") and error.validator_value is False:
        return []   # the tuple's maxItems error already says it (additionalItems: the same check in Draft 7)
    return [Problem(_dotted(path), _message(error, or_null))]


def _explain_union(error, or_null: bool = False) -> List[Problem]:
    """Name the member the value was aiming at and report its errors; otherwise list the accepted forms."""
    path, instance, members = list(error.absolute_path), error.instance, error.validator_value
    null = " or null" if or_null else ""
    size = _bytes_size(error.schema)
    if size is not None and not isinstance(instance, list):
        return [Problem(_dotted(path), f"{_bytes_expectation(size)}{null}, got {_show(instance)}")]
    picked = _pick_member(members, instance)
    if picked is None:
        picked = _furthest_member(error.context, len(path))
    nullable = len(members) == 2 and {"type": "null"} in members
    if picked is not None:
        problems: List[Problem] = []
        for sub in _without_redundant(error.context):
            if sub.relative_schema_path[0] == picked:
                same_place = list(sub.absolute_path) == path
                problems += _explain(sub, or_null=(or_null or nullable) and same_place)
        if problems:
            return problems
    return [Problem(_dotted(path), f"expected {_forms_text(error.schema)}{null}, got {_show(instance)}")]


def _pick_member(members: List[dict], instance: Any) -> Optional[int]:
    others = [index for index, member in enumerate(members) if member != {"type": "null"}]
    if instance is not None and len(members) == 2 and len(others) == 1:
        return others[0]          # a nullable value that is not null: report what the value itself gets wrong
    if isinstance(instance, list):
        arrays = [index for index, member in enumerate(members) if member.get("type") == "array"]
        return arrays[0] if len(arrays) == 1 else None
    if isinstance(instance, dict):
        for index, member in enumerate(members):
            if _member_claims(member, instance):
                return index
    return None


def _furthest_member(errors, depth: int) -> Optional[int]:
    """The one member whose errors reach deeper into the value than the union itself (an untagged payload that almost
    fitted). A const/enum miss says "another member", not "nearly this one", so it does not count."""
    reach: Dict[int, int] = {}
    for sub in errors:
        if sub.validator not in ("const", "enum"):
            member = sub.relative_schema_path[0]
            reach[member] = max(reach.get(member, 0), len(sub.absolute_path))
    deepest = max(reach.values(), default=depth)
    leaders = [member for member, length in reach.items() if length == deepest]
    return leaders[0] if deepest > depth and len(leaders) == 1 else None


def _member_claims(member: dict, instance: dict) -> bool:
    """Does this object member name the variant the instance names (by its single key, or by its tags)?"""
    required = member.get("required") or []
    if member.get("additionalProperties") is False and len(required) == 1:
        return list(instance) == required
    tags = {key: prop["const"] for key, prop in (member.get("properties") or {}).items()
            if isinstance(prop, dict) and "const" in prop}
    return bool(tags) and all(instance.get(key) == value for key, value in tags.items())


def _message(error, or_null: bool = False) -> str:
    keyword, expected, instance = error.validator, error.validator_value, error.instance
    null = " or null" if or_null else ""
    if error.schema == _BYTE and keyword in ("type", "minimum", "maximum"):
        return f"expected a byte (0-255), got {_show(instance)}"
    if keyword == "type":
        names = expected if isinstance(expected, list) else [expected]
        return f"expected {' or '.join(names)}{null}, got {_show(instance)}"
    if keyword == "enum":
        values = [value for value in expected if value is not None]
        null = " or null" if or_null or len(values) < len(expected) else ""
        return f"expected one of {', '.join(_show(value) for value in values)}{null}, got {_show(instance)}"
    if keyword == "const":
        return f"expected {_show(expected)}{null}, got {_show(instance)}"
    if keyword in ("minimum", "maximum"):
        sign = ">=" if keyword == "minimum" else "<="
        return f"expected {_a_number(error.schema)} {sign} {expected}, got {_show(instance)}"
    if keyword in ("minItems", "maxItems"):
        return f"expected {_item_count(error.schema)}, got {len(instance)}"
    if keyword == "additionalProperties":
        extra = [key for key in instance if key not in (error.schema.get("properties") or {})]
        return f"unexpected key {', '.join(_show(key) for key in extra)}"
    if keyword == "pattern":
        return f"expected a string matching {expected}, got {_show(instance)}"
    if keyword == "not":          # an enum with no variants; jsonschema's own words differ between releases
        return f"no value fits here, got {_show(instance)}"
    return error.message


def _a_number(schema: dict) -> str:
    return "an integer" if "integer" in (_types(schema) or []) else "a number"


def _item_count(schema: dict) -> str:
    low, high = schema.get("minItems"), schema.get("maxItems")
    if low is not None and low == high:
        return f"exactly {low} item{'s' if low != 1 else ''}"
    if high is not None:
        return f"at most {high} items"
    return f"at least {low} items"


def _bytes_expectation(size: int) -> str:
    if size:
        return f"expected a hex string of {2 * size} digits or an array of {size} bytes (0-255)"
    return "expected a hex string or a byte array (0-255)"


def _forms_text(schema: dict) -> str:
    forms = _forms(schema)
    return forms[0] if len(forms) == 1 else "one of " + ", ".join(forms)


def _forms(schema: dict) -> List[str]:
    """Short readable names of the values a schema accepts, for "expected one of …"."""
    if _bytes_size(schema) is not None:
        return ["a hex string or a byte array"]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return [form for member in schema[key] for form in _forms(member)]
    if "enum" in schema:
        return [_show(value) for value in schema["enum"]]
    if "const" in schema:
        return [_show(schema["const"])]
    types = _types(schema)
    if not types or _is_unknown(schema):
        return ["anything"]
    return [_object_form(schema) if kind == "object" else kind for kind in types]


def _object_form(schema: dict) -> str:
    properties = schema.get("properties") or {}
    tags = [f"{_show(key)}: {_show(prop['const'])}" for key, prop in properties.items()
            if isinstance(prop, dict) and "const" in prop]
    if tags:
        return "{" + ", ".join(tags) + ", ...}"
    required = schema.get("required") or []
    if schema.get("additionalProperties") is False and len(required) == 1:
        return "{" + _show(required[0]) + ": ...}"
    return "an object"


def _show(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _dotted(path: List[Any]) -> str:
    return ".".join(str(step) for step in path) if path else "args"


# ---------------------------------------------------------------------------------------------------------------------
# Wire arguments: a walk over the ABI type (not the schema) that turns validated input into what the guest reads.
# Hex strings become byte arrays, integral floats become ints (serde refuses 1.0 for a u32), undeclared record keys
# are dropped (the guest's argument struct denies unknown fields, node-api.md §4.4). Untagged values pass unchanged.

class _WireArgs:
    def __init__(self, types: Mapping):
        self.types = types

    def params(self, method: Method, args: Mapping) -> dict:
        return {param.name: self.value(param.type, args[param.name], 0)
                for param in method.params if param.name in args}

    def value(self, typ: Any, value: Any, depth: int) -> Any:
        if value is None or not isinstance(typ, dict):
            return value
        if "$ref" in typ:
            target = self.types.get(typ["$ref"])
            if not isinstance(target, dict) or depth >= MAX_REF_DEPTH:
                return value
            return self.value(target, value, depth + 1)
        kind = typ.get("kind")
        if not isinstance(kind, str):      # an odd kind is unknown to the schema too: passed through unchecked
            return value
        if kind == "bytes":
            return _hex_bytes(value) if isinstance(value, str) else _integers(value)
        if kind in _INTEGER_KINDS:
            return _integer(value)
        if kind == "alias":
            return self.value(typ.get("target"), value, depth)
        convert = self._CONTAINERS.get(kind)
        return convert(self, typ, value, depth) if convert else value

    def list_(self, typ: dict, value: Any, depth: int) -> Any:
        if not isinstance(value, list):
            return value
        return [self.value(typ.get("items"), item, depth) for item in value]

    def map_(self, typ: dict, value: Any, depth: int) -> Any:
        if not isinstance(value, dict):
            return value
        return {key: self.value(typ.get("value"), item, depth) for key, item in value.items()}

    def tuple_(self, typ: dict, value: Any, depth: int) -> Any:
        if not isinstance(value, list):
            return value
        return [self.value(element, item, depth) for element, item in zip(typ.get("elements") or [], value)]

    def record(self, typ: dict, value: Any, depth: int) -> Any:
        if _is_crdt_wrapper(typ):
            return self.value(typ["inner_type"], value, depth)
        if not isinstance(value, dict):
            return value
        return {field["name"]: self.value(field["type"], value[field["name"]], depth)
                for field in _fields(typ) if field["name"] in value}

    def variant(self, typ: dict, value: Any, depth: int) -> Any:
        if typ.get("untagged") is True or not isinstance(value, dict):
            return value
        tag, content = typ.get("tag"), typ.get("content")
        if _is_name(tag) and _is_name(content):
            return self._adjacent(typ, value, depth)
        if _is_name(tag):
            return self._internal(typ, value, depth, ())
        if len(value) != 1:
            return value
        (name, payload), = value.items()
        entry = _variant_named(typ, name)
        if entry is None or _is_unit_variant(entry):
            return value
        return {name: self.value(entry["payload"], payload, depth)}

    def _adjacent(self, typ: dict, value: dict, depth: int) -> dict:
        tag, content = typ["tag"], typ["content"]
        entry = _variant_named(typ, value.get(tag))
        wire = {tag: value[tag]} if tag in value else {}
        if entry is not None and not _is_unit_variant(entry) and content in value:
            wire[content] = self.value(entry["payload"], value[content], depth)
        return wire

    def _internal(self, typ: dict, value: dict, depth: int, outer_tags: Tuple[str, ...]) -> dict:
        tags = outer_tags + (typ["tag"],)
        entry = _variant_named(typ, value.get(typ["tag"]))
        tagged = {key: value[key] for key in tags if key in value}
        if entry is None or _is_unit_variant(entry):
            return tagged
        payload, depth = _resolve_payload(self.types, entry["payload"], depth)
        if payload is None:
            return value
        if payload.get("kind") == "record":
            fields = {key: item for key, item in self.record(payload, value, depth).items() if key not in tags}
            return dict(tagged, **fields)
        if payload.get("kind") == "map":
            return {key: item if key in tags else self.value(payload.get("value"), item, depth)
                    for key, item in value.items()}
        if _is_internally_tagged(payload) and payload["tag"] not in tags:
            return self._internal(payload, value, depth, tags)
        return value

    _CONTAINERS = {"list": list_, "map": map_, "tuple": tuple_, "record": record, "variant": variant}


def _variant_named(typ: dict, name: Any) -> Optional[dict]:
    for entry in typ.get("variants") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    return None


def _hex_bytes(text: str) -> Any:
    try:
        return list(bytes.fromhex(text))
    except ValueError:
        return text   # not reachable after validation; the node reports what it cannot read


def _integer(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _integers(value: Any) -> Any:
    return [_integer(item) for item in value] if isinstance(value, list) else value


# ---------------------------------------------------------------------------------------------------------------------
# Signatures (abi-mapping.md "Method signatures", reference §4.5, §4.6)

def type_name(typ: Any) -> str:
    """The compact name a signature shows: `$ref` names, `T[]`, `map<K, V>`, `(A, B)`, CRDT wrappers unwrapped."""
    if isinstance(typ, str):
        return typ                      # a bare map key, `"key": "string"`
    if not isinstance(typ, dict):
        return "unknown"
    if "$ref" in typ:
        return str(typ["$ref"])
    kind = typ.get("kind")
    if kind == "list":
        return f"{type_name(typ.get('items'))}[]"
    if kind == "map":
        return f"map<{type_name(typ.get('key'))}, {type_name(typ.get('value'))}>"
    if kind == "tuple":
        return "(" + ", ".join(type_name(element) for element in typ.get("elements") or []) + ")"
    if _is_crdt_wrapper(typ):
        return type_name(typ["inner_type"])
    if kind == "record":
        return _record_body(typ)        # an inline record: its fields are all the agent has to go on
    return kind if isinstance(kind, str) else "unknown"


def _record_body(typ: dict) -> str:
    """A record's fields in signature notation: `{ field: T, maybe?: T }`."""
    fields = ", ".join(f"{field['name']}{'?' if field.get('nullable') else ''}: {type_name(field['type'])}"
                       for field in _fields(typ))
    return "{ %s }" % fields if fields else "{}"


def is_read_only(method: Method) -> bool:
    return method.intent == "read_only"


def signature(manifest: Manifest, method) -> str:
    method = _method_of(manifest, method)
    params = ", ".join(f"{param.name}{'?' if param.nullable else ''}: {type_name(param.type)}"
                       for param in method.params)
    returns = type_name(method.returns) if method.returns is not None else "unit"
    nullable = " | null" if method.returns_nullable else ""
    return f"{'[view]' if is_read_only(method) else '[mut]'} {method.name}({params}) -> {returns}{nullable}"


def method_reference(manifest: Manifest, method) -> str:
    """Doc, blank line, signature; then `  name: doc` for each documented parameter."""
    method = _method_of(manifest, method)
    lines = [_doc_and_signature(manifest, method, len(method.doc or ""))]
    lines += [f"  {param.name}: " + param.doc.replace("\n", "\n    ") for param in method.params if param.doc]
    return "\n".join(lines)


def used_types(manifest: Manifest, methods: Optional[Iterable[Method]] = None) -> List[str]:
    """The named types (`types` keys) the methods' parameters and returns reach, transitively: first met first,
    by a walk in method, then parameter, then field order. A `$ref` to no entry is left out (no definition to
    show)."""
    found: List[str] = []
    for method in (manifest.methods if methods is None else methods):
        pending = [param.type for param in method.params] + ([method.returns] if method.returns is not None else [])
        _collect_refs(manifest.types, pending, found)
    return found


def _collect_refs(types: Mapping, pending: list, found: List[str]) -> None:
    stack = list(reversed(pending))
    while stack:
        typ = stack.pop()
        if not isinstance(typ, dict):
            continue
        name = typ.get("$ref")
        if name is not None:
            if isinstance(name, str) and name in types and name not in found:
                found.append(name)
                stack.extend(reversed(_inner_types(types[name])))
            continue
        stack.extend(reversed(_inner_types(typ)))


def _inner_types(typ: Any) -> list:
    """The type references directly inside one type: items, key and value, elements, fields, payloads, target."""
    if not isinstance(typ, dict):
        return []
    inner = [typ.get(key) for key in ("inner_type", "items", "key", "value", "target") if isinstance(typ.get(key), dict)]
    inner += [element for element in typ.get("elements") or [] if isinstance(element, dict)]
    inner += [field["type"] for field in _fields(typ)]
    variants = typ.get("variants") if isinstance(typ.get("variants"), list) else []
    inner += [entry["payload"] for entry in variants if isinstance(entry, dict) and isinstance(entry.get("payload"), dict)]
    return inner


def type_definition(manifest: Manifest, name: str) -> str:
    """A named type as describe_app shows it, in signature notation (type_name): its doc, blank line, then
    `type Name = { field: T, maybe?: T }`, `type Name = A | B(T)` or `type Name = T`; then `  field: doc` for each
    documented field or case."""
    typ = manifest.types[name]
    typ = typ if isinstance(typ, dict) else {}
    kind, docs = typ.get("kind"), []
    if kind == "record" and not _is_crdt_wrapper(typ):
        body = _record_body(typ)
        docs = [(field["name"], field.get("doc")) for field in _fields(typ)]
    elif kind == "variant":
        variants = [entry for entry in typ.get("variants") or [] if isinstance(entry, dict) and _is_name(entry.get("name"))]
        body = " | ".join(entry["name"] + (f"({type_name(entry['payload'])})" if not _is_unit_variant(entry) else "")
                          for entry in variants) or "never"
        docs = [(entry["name"], entry.get("doc")) for entry in variants]
    elif kind == "alias":
        body = type_name(typ.get("target"))
    elif kind == "bytes" and isinstance(typ.get("size"), int):
        body = f"bytes[{typ['size']}]"
    else:
        body = type_name(typ)
    lines = [f"type {name} = {body}"]
    lines += [f"  {label}: " + doc.replace("\n", "\n    ") for label, doc in docs if isinstance(doc, str) and doc]
    text = "\n".join(lines)
    return f"{typ['doc']}\n\n{text}" if isinstance(typ.get("doc"), str) and typ["doc"] else text


def type_references(manifest: Manifest, methods: Optional[Iterable[Method]] = None) -> List[str]:
    """Every named type the methods use, each as type_definition renders it."""
    return [type_definition(manifest, name) for name in used_types(manifest, methods)]


# ---------------------------------------------------------------------------------------------------------------------
# Tool definitions (tools.md "Generated method tools", reference §3.14)

def untooled_reason(manifest: Manifest, method: Method, schema: Optional[dict] = None) -> Optional[str]:
    """Why a method gets no generated tool (it stays reachable through `call`), or None when it gets one.
    `schema` is its input_schema when the caller has it already."""
    if method.name == "init":
        return "init runs in create_context"
    if "app_handle" in method.param_names():
        return "its app_handle parameter would collide"
    odd = unportable_keys(input_schema(manifest, method) if schema is None else schema)
    if odd:
        return "its argument key %s is not one hosts accept ([a-zA-Z0-9_.-], at most 64)" % json.dumps(odd[0])
    return None


def tool_methods(manifest: Manifest) -> List[Method]:
    return sorted((method for method in manifest.methods if untooled_reason(manifest, method) is None),
                  key=lambda method: method.name)


def unportable_keys(schema: Any) -> List[str]:
    """Property keys outside what every host takes (Claude Code skips a tool with one): a serde-renamed field."""
    if isinstance(schema, list):
        return [key for item in schema for key in unportable_keys(item)]
    if not isinstance(schema, dict):
        return []
    found = [key for key in schema.get("properties") or {} if not PROPERTY_KEY.fullmatch(key)]
    return found + [key for value in schema.values() for key in unportable_keys(value)]


def tool_title(method_name: str, app_label: str) -> str:
    words = " ".join(word for word in method_name.split("_") if word) or method_name
    return f"{words[:1].upper()}{words[1:]} ({app_label})"


def tool_description(manifest: Manifest, method) -> str:
    """The doc above the signature, within DESCRIPTION_MAX: a host cuts a longer one from its end, which would take
    the signature; so the doc is cut instead (describe_app keeps it whole)."""
    method = _method_of(manifest, method)
    return _doc_and_signature(manifest, method, DESCRIPTION_MAX - len(signature(manifest, method)) - 2)


def _doc_and_signature(manifest: Manifest, method: Method, room: int) -> str:
    text = signature(manifest, method)
    if not method.doc:
        return text
    doc = method.doc if len(method.doc) <= room else method.doc[:max(room - 1, 0)].rstrip() + "\u2026"
    return f"{doc}\n\n{text}"


def tool_annotations(method: Method) -> dict:
    read_only = is_read_only(method)
    return {"readOnlyHint": read_only, "destructiveHint": method.destructive is True,
            "idempotentHint": method.idempotent is True or read_only, "openWorldHint": False}


def tool_meta(package: Optional[str], version: Optional[str], signer_id: Optional[str], method: Method) -> dict:
    return {"package": package, "appVersion": version, "signerId": signer_id,
            "intent": method.intent or "unspecified"}


# ---------------------------------------------------------------------------------------------------------------------
# Tool names (abi-mapping.md "Tool naming", tools.md "Generated method tools", reference §3.14)

class ToolUnit(NamedTuple):
    key: Any                          # the caller's handle on this unit, echoed in the result
    package: Optional[str]
    app_id: str
    service: Optional[str]
    multi_service: bool
    method_names: Tuple[str, ...]     # the tool-eligible methods (see tool_methods)


def sanitize(text: str) -> str:
    """Lowercase, every run of characters outside [a-z0-9_] collapsed to `_`."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower())


def app_slug(package_or_id: str) -> str:
    """The sanitised trailing dot-segment, cut to 20 characters: `com.calimero.kv-store` -> `kv_store`. A name must
    not start with a digit (Gemini's rule), so `3d-viewer` gives `_3d_viewer`."""
    segment = package_or_id.rsplit(".", 1)[-1] or package_or_id
    slug = sanitize(segment)
    return (("_" + slug) if slug[:1].isdigit() else slug)[:SLUG_MAX] or "app"


def tool_names(units: Iterable[ToolUnit], reserved: Iterable[str]) -> Dict[Tuple[Any, str], str]:
    """Name every method of every unit, in the given (catalog) order; stable for a stable order."""
    taken: Set[str] = set(reserved)
    slug_of_app: Dict[str, str] = {}
    names: Dict[Tuple[Any, str], str] = {}
    for unit in units:
        tail = _id_tail(unit.app_id)
        if unit.app_id not in slug_of_app:
            base = app_slug(unit.package or unit.app_id)
            slug_of_app[unit.app_id] = _free_slug(base, tail, set(slug_of_app.values()))
        slug = slug_of_app[unit.app_id]
        service = sanitize(unit.service) if unit.multi_service and unit.service else None
        for method in sorted(set(unit.method_names)):
            if method == "init":
                continue
            name = _free_name(slug, tail, service, method, taken)
            taken.add(name)
            names[(unit.key, method)] = name
    return names


def _id_tail(app_id: str) -> str:
    return re.sub(r"[^a-z0-9]", "", app_id.lower())[:ID_TAIL_LENGTH] or "app"


def _with_tail(base: str, tail: str, attempt: int) -> str:
    """attempt 0: base; 1: base_tail; n: base_tail_n."""
    if attempt == 0:
        return base
    return f"{base}_{tail}" if attempt == 1 else f"{base}_{tail}_{attempt}"


def _free_slug(base: str, tail: str, held: Set[str]) -> str:
    """A slug another application already holds gets this id's tail: derived from the id, never selection order."""
    attempt = 0
    while _with_tail(base, tail, attempt) in held:
        attempt += 1
    return _with_tail(base, tail, attempt)


def _free_name(slug: str, tail: str, service: Optional[str], method: str, taken: Set[str]) -> str:
    """A whole name that clashes with a fixed tool or an earlier name retries with the id's tail, then _2, _3, …"""
    attempt = 0
    while True:
        parts = [_with_tail(slug, tail, attempt)] + ([service] if service else []) + [sanitize(method)]
        name = _fit("_".join(parts))
        if name not in taken:
            return name
        attempt += 1


def _fit(name: str) -> str:
    if len(name) <= TOOL_NAME_MAX:
        return name
    return f"{name[:HASHED_NAME_KEEP]}_{hashlib.sha256(name.encode('utf-8')).hexdigest()[:6]}"


# ---------------------------------------------------------------------------------------------------------------------
# Guides (reference §3.9)

_FENCE = re.compile(r"^ *```")   # spaces only: a tab-indented fence does not count


def procedures(guide: Any) -> List[str]:
    """The `###` titles under the `## Procedures` heading of an app's guide, fenced code ignored."""
    if not isinstance(guide, str):
        return []
    text = guide[1:] if guide.startswith("\ufeff") else guide
    titles, fenced, inside = [], False, False
    for line in re.split(r"\r?\n", text):
        line = line.rstrip()
        if _FENCE.match(line):
            fenced = not fenced
        elif fenced:
            continue
        elif line.startswith("## "):
            inside = line == "## Procedures"
        elif inside and line.startswith("### ") and line[4:].strip():
            titles.append(line[4:].strip())
    return titles
