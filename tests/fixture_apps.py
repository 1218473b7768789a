"""ABI fixtures installed as apps of the node double: every manifest of ../shared/fixtures/abi/ (real ABIs, beside
the checkout, never in it) and of tests/manifests/ (our own). Used by the tool lint, the Gemini CLI interop test
and `make bench`; each app gets one context, so every generated tool can be called.
"""
from __future__ import annotations

import json
from pathlib import Path


TESTS = Path(__file__).resolve().parent
SHARED_ABIS = TESTS.parents[1] / "shared" / "fixtures" / "abi"
OWN_ABIS = TESTS / "manifests"
SIGNER = "did:key:fixtures"


def manifest_paths(folder):
    """The files of `folder` that are ABI manifests (have a methods list); [] when the folder is absent."""
    found = []
    for path in sorted(Path(folder).glob("*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(raw, dict) and isinstance(raw.get("methods"), list):
            found.append(path)
    return found


def package_of(path):
    """`apps-kv-store.json` -> `com.fixtures.apps-kv-store`: one package per file, dots kept out of the slug."""
    return "com.fixtures." + path.name[:-len(".json")].replace(".", "-")


def install(double, paths):
    """Install each manifest as a generic app with one context; {package: app id}."""
    installed = {}
    for path in paths:
        raw = json.loads(path.read_text(encoding="utf-8"))
        package = package_of(path)
        app_id = double.add_app({"package": package, "version": "1.0.0", "signer_id": SIGNER, "metadata": {},
                                 "abi": raw, "behaviour": "generic"})
        double.add_context(app_id)
        installed[package] = app_id
    return installed


# Which methods get a generated tool, by the rule itself rather than abi.tool_methods (a count taken from the code
# under test passes whatever it drops): one per method except init, which create_context runs (tools.md,
# "Generated tools"), and one declaring app_handle, which would collide with the injected one (DEVELOPERS.md).
# A property key outside what hosts accept makes none either; no fixture has one, and one that did would fail
# the counts loudly.
def tooled_methods(path):
    """The raw manifest's methods (dicts, as the JSON has them) that get a generated tool."""
    methods = json.loads(path.read_text(encoding="utf-8"))["methods"]
    return [m for m in methods if m["name"] != "init"
            and "app_handle" not in [param["name"] for param in m.get("params") or []]]


def tool_count(paths, read_only=False):
    """How many generated tools the manifests make; with read_only, how many of them are views (intent
    "read_only": abi-mapping.md, "[view]")."""
    return sum(1 for path in paths for m in tooled_methods(path) if not read_only or m.get("intent") == "read_only")
