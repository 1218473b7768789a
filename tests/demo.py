"""`make demo`: the real server against the bundled node double, through a short scripted session."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
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
    show("kv_store_set {key: greeting, value: hello}",
         first_text(server.call_tool("kv_store_set", {"app_handle": handle, "key": "greeting", "value": "hello"})))
    got = server.call_tool("kv_store_get", {"app_handle": handle, "key": "greeting"})
    show("kv_store_get {key: greeting}", {"text": first_text(got), "structuredContent": got["structuredContent"]})
    refused = server.call_tool("kv_store_set", {"app_handle": handle, "key": "greeting", "value": 42})
    show("kv_store_set with a wrong type (refused locally, nothing sent)", first_text(refused))


def main():
    double, url = start_double()
    with tempfile.TemporaryDirectory() as home:
        env = minimal_env(home, {"CALIMERO_NODE_URL": url, "CALIMERO_MCP_STATE_DIR": Path(home) / "state"})
        server = McpServer(env)
        try:
            print("node double at %s; server: %s mero_mcp.py" % (url, Path(sys.executable).name))
            session(server)
        finally:
            server.close()
            double.terminate()
            double.wait(5)
    print("\nDemo done: the same server runs against a real merod with CALIMERO_NODE_URL set, or finds one itself.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
