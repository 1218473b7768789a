"""`make demo`: the real server against the bundled node double, through a short scripted session."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from mcp_client import McpServer, minimal_env  # noqa: E402


def start_double():
    """The double runs as its own process, as a real node would."""
    proc = subprocess.Popen([sys.executable, str(HERE / "node_double.py"), "--sample"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit("the node double did not start: %r" % line)
    return proc, line.split(" ", 1)[1]


def show(title, value):
    print("\n── %s" % title)
    print(value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False))


def first_text(result):
    return result["content"][0]["text"]


def session(server):
    info = server.initialize("2025-11-25")
    show("initialize", "negotiated protocol %s with %s %s" % (
        info["protocolVersion"], info["serverInfo"]["name"], info["serverInfo"]["version"]))
    tools = server.result("tools/list")["tools"]
    show("tools/list (%d tools)" % len(tools), "\n".join("  %-28s %s" % (t["name"], t.get("title") or "")
                                                        for t in tools))
    show("node_status", json.loads(first_text(server.call_tool("node_status"))))
    selected = json.loads(first_text(server.call_tool("select_app", {"app": "kv-store"})))
    show("select_app kv-store", {k: selected[k] for k in ("package", "appVersion", "context", "tools")})
    handle = selected["app_handle"]
    stored = server.call_tool("kv_store_set", {"app_handle": handle, "key": "greeting", "value": "hello"})
    show("kv_store_set {key: greeting, value: hello}", first_text(stored))
    print("   (null: set returns nothing, its ABI return type is unit, so the result is JSON null)")
    got = server.call_tool("kv_store_get", {"app_handle": handle, "key": "greeting"})
    show("kv_store_get {key: greeting}", {"text": first_text(got), "structuredContent": got["structuredContent"],
                                          "then": got["content"][1]["text"]})
    print("   (one value in two forms: text is its JSON for any client, structuredContent the same value as an\n"
          "    object matching the tool's outputSchema; a string rides as {\"result\": ...} in this protocol era;\n"
          "    then a line saying where it ran, as every app call's answer ends)")
    refused = server.call_tool("kv_store_set", {"app_handle": handle, "key": "greeting", "value": 42})
    show("kv_store_set with a wrong type (refused locally, nothing sent)", first_text(refused))


def shown_path(path):
    """A path as a person would type it in the checkout."""
    relative = os.path.relpath(path, ROOT)
    return str(path) if relative.startswith("..") else relative


def main():
    double, url = start_double()
    python = shown_path(sys.executable)
    with tempfile.TemporaryDirectory() as home:
        env = minimal_env(home, {"CALIMERO_NODE_URL": url, "CALIMERO_MCP_STATE_DIR": Path(home) / "state"})
        server = McpServer(env)
        try:
            print("node: tests/node_double.py --sample at %s (a stand-in for merod)" % url)
            print("server: %s mero_mcp.py, with CALIMERO_NODE_URL=%s; this script plays the MCP host" % (python, url))
            session(server)
        finally:
            server.close()
            double.terminate()
            double.wait(5)
    print(TRY_IT_YOURSELF.format(python=python, executable=sys.executable, root=ROOT))
    return 0


TRY_IT_YOURSELF = """
Demo done, and its node stopped. To try it yourself (README.md, "Try it by hand"):
  python3 tests/node_double.py --sample --port 2530        # a node with these apps, until Ctrl-C
  CALIMERO_NODE_URL=http://127.0.0.1:2530 {python} mero_mcp.py --check
and point your agent at it, e.g. Claude Code:
  claude mcp add -s user mero-mcp --env CALIMERO_NODE_URL=http://127.0.0.1:2530 -- {executable} {root}/mero_mcp.py
Against a real merod the server needs no double: set CALIMERO_NODE_URL, or let it find the node itself."""


if __name__ == "__main__":
    sys.exit(main())
