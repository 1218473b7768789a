"""Issue 43 (answers, app data, --check, wait_for_sync, registry, ABI): every block of an app call's answer fitted to
the room left, app and peer strings shown as JSON data, --check probing on a bounded pool, wait_for_sync's clock,
two signers of one package in the registry, package names checked before install, inline records shown by field.
Each through the real server against the node double."""
from __future__ import annotations

import json
from pathlib import Path

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
