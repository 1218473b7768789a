"""Synthetic apps for the catalog benchmarks: APPS manifests of METHODS_PER_APP methods each, built from the
real ABI fixtures so the schemas the server generates have real shapes (records, variants, maps, bytes, CRDTs).

Methods are taken in turn from every fixture that has methods (`../shared/fixtures/abi/*.json`, or our own
`tests/manifests/*.json` when the shared tree is absent), each carrying its fixture's `types` table along.
The kv-store ABI comes first, so app 00 is a kv store (get/set) that the per-call benchmarks can read.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_ABIS = ROOT.parent / "shared" / "fixtures" / "abi"
OWN_ABIS = ROOT / "tests" / "manifests"
APPS = 20
METHODS_PER_APP = 50
SIGNER = "did:key:z6MknF3p5L5FDHJQ7FREUapuX4Wmp4MtF6WrHYaXS2B3eZQd"


def fixture_manifests():
    """(label, manifest) for every fixture with methods; kv-store first, the rest by name."""
    folder = SHARED_ABIS if SHARED_ABIS.is_dir() else OWN_ABIS
    found = []
    for path in sorted(folder.glob("*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(raw, dict) and raw.get("methods"):
            found.append((path.stem, raw))
    return sorted(found, key=lambda item: ("kv-store" not in item[0], item[0]))


def rename_refs(node, renames):
    """A copy of a TypeRef tree with `$ref` names replaced."""
    if isinstance(node, list):
        return [rename_refs(item, renames) for item in node]
    if not isinstance(node, dict):
        return node
    copied = {key: rename_refs(value, renames) for key, value in node.items()}
    if isinstance(copied.get("$ref"), str):
        copied["$ref"] = renames.get(copied["$ref"], copied["$ref"])
    return copied


def without_type_clashes(manifests):
    """Fixtures may define one type name differently; later ones get `<Name>_<n>` so tables merge safely."""
    owners = {}
    result = []
    for index, (label, raw) in enumerate(manifests):
        types = raw.get("types") or {}
        renames = {}
        for name, definition in types.items():
            if owners.setdefault(name, definition) != definition:
                renames[name] = "%s_%d" % (name, index)
        renamed_types = {renames.get(name, name): rename_refs(d, renames) for name, d in types.items()}
        renamed_methods = [rename_refs(m, renames) for m in raw["methods"]]
        for name in renames.values():
            owners[name] = renamed_types[name]
        result.append((label, renamed_types, renamed_methods))
    return result


def method_pool(sources):
    """Every tool-eligible method with the index of its source; `init` belongs to create_context, not a tool."""
    return [(index, method) for index, (_, _, methods) in enumerate(sources)
            for method in methods if method.get("name") != "init"]


def unique_name(name, taken):
    candidate, suffix = name, 2
    while candidate in taken:
        candidate, suffix = "%s_%d" % (name, suffix), suffix + 1
    taken.add(candidate)
    return candidate


def synthetic_manifest(sources, pool, app_index):
    """METHODS_PER_APP methods cycled from the pool, renamed apart, with the types tables they need."""
    start = app_index * METHODS_PER_APP
    picked = [pool[(start + offset) % len(pool)] for offset in range(METHODS_PER_APP)]
    types, methods, taken = {}, [], set()
    for source_index, method in picked:
        types.update(sources[source_index][1])
        method = copy.deepcopy(method)
        method["name"] = unique_name(method["name"], taken)
        methods.append(method)
    return {"schema_version": "wasm-abi/1", "types": types, "methods": methods, "events": []}


def bench_app_specs():
    """NodeDouble app specs: com.bench.app00 … com.bench.app19."""
    sources = without_type_clashes(fixture_manifests())
    pool = method_pool(sources)
    return [{"package": "com.bench.app%02d" % index, "version": "1.0.0", "signer_id": SIGNER,
             "metadata": {"name": "Bench app %02d" % index, "description": "A synthetic app for benchmarks."},
             "abi": synthetic_manifest(sources, pool, index)}
            for index in range(APPS)]
