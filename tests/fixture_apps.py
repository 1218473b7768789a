"""ABI fixtures installed as apps of the node double: every manifest of ../shared/fixtures/abi/ (real ABIs, beside
the checkout, never in it) and of tests/manifests/ (our own). Used by the tool lint, the Gemini CLI interop test
and `make bench`; each app gets one context, so every generated tool can be called.
"""
from __future__ import annotations

import json
from pathlib import Path

import abi

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


def tool_count(paths):
    """How many generated tools the manifests make (see abi.tool_methods: init and the like make none)."""
    return sum(len(abi.tool_methods(abi.parse_manifest(json.loads(path.read_text(encoding="utf-8")), path.name)))
               for path in paths)
