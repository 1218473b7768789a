"""The fixed tools' definitions, pinned once: the live tools/list against tests/snapshots/fixed_tools.json.

Other tests read names, counts and texts from the snapshot (mcp_client.fixed_names, fixed_definitions) instead of
repeating them; a change of a fixed tool is one `make snapshot` and a reviewable diff of that file."""
import difflib
import json

from mcp_client import APP_TOOLS, FIXED_TOOL_BYTES, MULTI_SNAPSHOT, SNAPSHOT, TOOLSETS, fixed_names, fixed_snapshot, \
    live_multi_snapshot, live_snapshot, snapshot_text


def assert_snapshot(live, path, what):
    """The live definitions are the committed file, else the diff and what to run."""
    live, committed = snapshot_text(live), path.read_text(encoding="utf-8")
    if live != committed:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), live.splitlines(True),
                                            "%s (committed)" % path.name, "tools/list (live)", n=2))
        raise AssertionError("%s differ from %s. If the change is meant, run `make snapshot` and commit the file."
                             "\n%s" % (what, path.name, diff))


def test_the_live_fixed_tools_are_the_snapshot(tmp_path):
    assert_snapshot(live_snapshot(tmp_path), SNAPSHOT, "The fixed tools tools/list serves")


def test_the_toolsets_divide_the_fixed_tools():
    """Every fixed tool is listed by some toolset, in tools/list order; the application tools by every one, and
    read-only mode keeps call and call_many and leaves writes out."""
    snapshot = fixed_snapshot()
    names = [t["name"] for t in snapshot["tools"]]
    assert fixed_names() == names and len(set(names)) == len(names)
    assert set().union(*(snapshot["toolsets"][t] for t in TOOLSETS)) == set(names)
    for toolset in TOOLSETS:
        assert APP_TOOLS <= set(snapshot["toolsets"][toolset]), toolset
    assert {"call", "call_many", "node_status"} <= set(snapshot["read_only"]) < set(names)
    assert "delete_context" not in snapshot["read_only"]


def test_what_a_model_reads_of_the_fixed_tools_stays_within_the_budget():
    """name + description + inputSchema of all fixed tools together, as compact UTF-8 JSON, within the budget of
    their count."""
    tools = fixed_snapshot()["tools"]
    size = sum(len(json.dumps({k: t[k] for k in ("name", "description", "inputSchema")}, separators=(",", ":"),
                              ensure_ascii=False).encode("utf-8")) for t in tools)
    assert size <= FIXED_TOOL_BYTES * len(tools), "the %d fixed tools take %d B of a model's context, over %d" % (
        len(tools), size, FIXED_TOOL_BYTES * len(tools))
    assert size <= 12000, "the fixed tools take %d B of a model's context, over 12,000 B in all (issue 36)" % size


def test_the_live_multi_node_fixed_tools_are_the_second_snapshot(tmp_path):
    assert_snapshot(live_multi_snapshot(tmp_path), MULTI_SNAPSHOT, "The multi-node fixed tools")


def test_multi_node_mode_costs_at_most_2000_bytes_more_than_single_mode():
    """Issue 33: the `node` argument, join_namespace's from and wait_for_sync together, as compact JSON."""
    def size(tools):
        return len(json.dumps(tools, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    multi = json.loads(MULTI_SNAPSHOT.read_text(encoding="utf-8"))["tools"]
    grown = size(multi) - size(fixed_snapshot()["tools"])
    assert 0 < grown <= 2000, "multi-node mode adds %d B to the fixed tools" % grown
