"""Issue 43 (answers, app data, --check, wait_for_sync, registry, ABI): every block of an app call's answer fitted to
the room left, app and peer strings shown as JSON data, --check probing on a bounded pool, wait_for_sync's clock,
two signers of one package in the registry, package names checked before install, inline records shown by field.
Each through the real server against the node double."""
from __future__ import annotations

import json
from pathlib import Path

from mcp_client import minimal_env, run_check
from node_double import NodeDouble

HERE = Path(__file__).resolve().parent


def text_of(result):
    return "\n".join(block["text"] for block in result["content"] if block.get("type") == "text")


# ---- an inline record is shown by its fields ----

def test_an_inline_record_shows_its_fields_in_signatures_describe_app_and_events(serve):
    raw = json.loads((HERE / "manifests" / "inline-record.json").read_text(encoding="utf-8"))
    double = NodeDouble()
    app_id = double.add_app({"package": "com.example.clock", "version": "1.0.0", "signer_id": "did:key:clock",
                             "metadata": {}, "abi": raw, "behaviour": "generic"})
    double.add_context(app_id)
    server = serve(double)
    described = server.call_tool("describe_app", {"app": "com.example.clock"})["structuredContent"]
    shown = json.dumps(described)
    assert "tick(at: { tick: u32, note?: string }) -> unit" in shown
    assert "last() -> { tick: u32 }" in shown
    assert described["events"] == ["Ticked({ tick: u32 }): The clock moved."]
    assert "record" not in shown
    tick = next(tool for tool in server.result("tools/list")["tools"] if tool["name"].endswith("_tick"))
    assert "{ tick: u32, note?: string }" in tick["description"]


# ---- --check probes on a bounded pool ----

def test_check_probes_many_nodes_a_few_at_a_time(tmp_path):
    double = NodeDouble().start()
    try:
        double.slow["/admin-api/health"] = 0.2          # every probe in flight long enough to overlap
        nodes = ",".join("n%d=%s" % (index, double.url) for index in range(60))
        env = minimal_env(tmp_path / "home", {"CALIMERO_NODES": nodes, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                              "CALIMERO_NODE_HOME": tmp_path / "nodes"})
        done = run_check(env)
        assert "n59" in done.stdout
        probes = [entry for entry in double.log if entry["path"] == "/admin-api/health" and "done_at" in entry]
        assert len(probes) >= 60
        overlap = max(sum(1 for other in probes if other["at"] <= entry["at"] < other["done_at"]) for entry in probes)
        assert overlap <= 16, "%d probes were in flight at once" % overlap
    finally:
        double.stop()
