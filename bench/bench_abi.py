"""How long abi.py takes to map the shared ABI manifests, and what one argument check costs.

Prints figures and ratios; never asserts (DEVELOPERS.md: timing belongs to bench/, tests never assert wall-clock).
Run: python3 bench/bench_abi.py
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import abi  # noqa: E402

SHARED_ABI = ROOT.parent / "shared" / "fixtures" / "abi"
PASSES = 20
CALLS = 20000


def shared_manifests():
    found = []
    for path in sorted(SHARED_ABI.glob("*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        if path.name != "wasm-abi.schema.json" and raw.get("methods"):
            found.append((path.stem, raw))
    return found


def map_everything(raws):
    """What a catalog change costs: parse, every input/output schema in both eras, every validator compiled."""
    for label, raw in raws:
        manifest = abi.parse_manifest(raw, label)
        for method in manifest.methods:
            abi.input_schema(manifest, method)
            abi.output_schema(manifest, method, wrap=True)
            abi.output_schema(manifest, method, wrap=False)
            abi.Validator(manifest, method)


def median_seconds(action, repeat):
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def per_call_micros(action, calls=CALLS):
    """Median over batches of 100 calls, in µs per call."""
    batches = calls // 100

    def batch():
        for _ in range(100):
            action()
    return median_seconds(batch, batches) / 100 * 1e6


def validation_cases(raws):
    by_label = {label: abi.parse_manifest(raw, label) for label, raw in raws}
    conformance = by_label.get("mero-mcp-rc83-abi_conformance")
    kv = by_label.get("mero-mcp-rc83-kv-store")
    cases = []
    if kv:
        cases += [("kv set (2 strings)", kv, "set", {"key": "greeting", "value": "hello", "app_handle": "h"}),
                  ("kv set, wrong type", kv, "set", {"key": "greeting", "value": 42})]
    if conformance:
        person = {"id": "ab" * 32, "name": "Ada", "age": 36}
        cases += [("make_person (hex 32 bytes)", conformance, "make_person", {"p": person}),
                  ("act (variant payload)", conformance, "act", {"a": {"MultiStruct": {"x": 1, "y": "s"}}}),
                  ("list_records (10 persons)", conformance, "list_records", {"ps": [person] * 10}),
                  ("act, unknown variant", conformance, "act", {"a": "Pong"})]
    return cases


def main():
    raws = shared_manifests()
    if not raws:
        print(f"no shared manifests at {SHARED_ABI}; nothing to measure")
        return
    methods = sum(len(raw["methods"]) for _, raw in raws)
    mapping = median_seconds(lambda: map_everything(raws), PASSES)
    print(f"map all shared manifests ({len(raws)} manifests, {methods} methods): "
          f"{mapping * 1e3:.1f} ms median of {PASSES} passes ({mapping / methods * 1e6:.0f} µs per method)")
    baseline_args = {"key": "greeting", "value": "hello"}
    baseline = per_call_micros(lambda: json.loads(json.dumps(baseline_args)))
    print(f"baseline: JSON round trip of a 2-key object: {baseline:.2f} µs")
    for name, manifest, method, args in validation_cases(raws):
        validator = abi.Validator(manifest, method)
        cost = per_call_micros(lambda: validator.check(args))
        print(f"check {name}: {cost:.1f} µs per call ({cost / baseline:.1f}x the JSON round trip)")


if __name__ == "__main__":
    main()
