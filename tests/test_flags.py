"""The command line (issue 44): each flag is its variable and wins over it, through the real server; -V; --help
lists every flag and every variable the code reads; a flag we do not take is one stderr line and exit 2."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from mcp_client import fixed_names, minimal_env, our_variables, ROOT, run_check, SERVER_COMMAND
from test_packaging import VERSION


def run(args, env=None, timeout=30):
    return subprocess.run(SERVER_COMMAND + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env or minimal_env(ROOT / "no-home"), stdin=subprocess.DEVNULL, cwd=str(ROOT))


@pytest.fixture
def started(start_server, tmp_path):
    """A server over `env` (the state and node homes in tmp_path) started with `args`."""
    def start(args, **env):
        settings = {"CALIMERO_MCP_STATE_DIR": tmp_path / "state", "CALIMERO_NODE_HOME": tmp_path / "nodes"}
        settings.update(env)
        return start_server(minimal_env(tmp_path / "home", settings), args=args)
    return start


DEAD_NODE = "http://127.0.0.1:9"          # discard: nothing answers there


# ---- each flag wins over its variable ----

def test_read_only_flag_wins_over_its_variable(started, double):
    server = started(["--read-only"], CALIMERO_NODE_URL=double.url, CALIMERO_MCP_READ_ONLY="0")
    names = server.tool_names()
    assert "kv_store_get" in names and "kv_store_set" not in names and "create_context" not in names, names
    assert server.tool_json("node_status")["readOnly"] is True
    refused = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "set",
                                        "args": {"key": "k", "value": "v"}})
    assert refused.get("isError") and "read-only" in refused["content"][-1]["text"], refused
    assert "drop --read-only" in refused["content"][-1]["text"]         # the way back names the flag set here
    assert not [entry for entry in double.log if entry["path"].endswith("/execute")], double.log


def test_toolsets_flag_wins_over_its_variable(started, double):
    server = started(["--toolsets", "core"], CALIMERO_NODE_URL=double.url, CALIMERO_MCP_TOOLSETS="all")
    fixed = {t["name"] for t in server.result("tools/list")["tools"] if "_meta" not in t}
    assert fixed == set(fixed_names(("core",))), sorted(fixed)


def test_node_url_flag_wins_over_its_variable(started, double):
    server = started(["--node-url=%s" % double.url], CALIMERO_NODE_URL=DEAD_NODE)
    status = server.tool_json("node_status")
    assert status["url"] == double.url and status["health"] == {"status": "alive"}, status
    assert status["discoverySource"] == "env", status


def test_nodes_and_node_name_flags_win_over_their_variables(started, network):
    node1, node2 = network.add("node1"), network.add("node2")
    server = started(["--nodes", "node1=%s,node2=%s" % (node1.url, node2.url), "--node-name", "node2"],
                     CALIMERO_NODES="lone=%s" % DEAD_NODE, CALIMERO_NODE_NAME="lone")
    listed = json.loads(server.call_tool("list_nodes")["content"][0]["text"])
    rows = {row["name"]: row for row in listed["nodes"]}
    assert set(rows) == {"node1", "node2"}, rows
    assert rows["node2"]["default"] is True and rows["node1"]["default"] is False, rows
    assert rows["node1"]["reachable"] and rows["node2"]["reachable"], rows


def test_a_down_nodes_fix_names_the_nodes_flag_that_named_it(started, network):
    node1, node2 = network.add("node1"), network.add("node2")
    network.stop("node2")
    server = started(["--nodes", "node1=%s,node2=%s" % (node1.url, node2.url)])
    fix = json.loads(server.call_tool("node_status", {"node": "node2"})["content"][0]["text"])["fix"]
    assert fix.endswith("and that the --nodes flag names the right URL."), fix


def test_log_level_debug_writes_each_request_to_stderr_never_stdout(started, double):
    server = started(["--log-level", "debug"], CALIMERO_NODE_URL=double.url, CALIMERO_MCP_LOG_LEVEL="error")
    server.tool_json("node_status")
    server.close()
    server.assert_stdout_pure()
    assert re.search(r"^\[mero-mcp\] tools/call node_status \(id \d+\): ok in \d+ ms$", server.stderr, re.M), \
        server.stderr
    assert "[mero-mcp] GET %s/admin-api/health: 200 in " % double.url in server.stderr, server.stderr


def test_the_log_level_leaves_out_what_is_below_it(started, double, tmp_path):
    quiet = started(["--log-level", "warning"], CALIMERO_NODE_URL=double.url, CALIMERO_MCP_LOG_LEVEL="debug")
    quiet.tool_json("node_status")
    quiet.close()
    assert "ready on stdio" not in quiet.stderr and " ms" not in quiet.stderr, quiet.stderr
    said = started([], CALIMERO_NODE_URL=double.url, CALIMERO_MCP_LOG_LEVEL="loud")
    said.close()
    assert said.stderr.count('CALIMERO_MCP_LOG_LEVEL="loud" is none of debug, info, warning, error, so info is '
                             'used') == 1, said.stderr
    assert "ready on stdio" in said.stderr
    checked = run_check(minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url,
                                                        "CALIMERO_MCP_LOG_LEVEL": "loud"}))
    assert checked.returncode == 0 and checked.stderr == "", checked
    assert '  - CALIMERO_MCP_LOG_LEVEL="loud" is none of debug, info, warning, error, so info is used\n' \
        in checked.stdout, checked.stdout


# ---- -V, --help, and what is refused ----

@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags_print_the_version(flag):
    done = run([flag])
    assert (done.returncode, done.stdout, done.stderr) == (0, "mero-mcp %s\n" % VERSION, "")


def help_text(args=("--help",)):
    done = run(args)
    assert done.returncode == 0 and done.stderr == "", done
    return done.stdout


def test_help_lists_every_flag_and_every_variable_the_code_reads():
    text = help_text()
    flags, variables = text.split("\nFlags ", 1)[1].split("\nVariables ", 1)
    for flag, variable in (("--node-url URL", "CALIMERO_NODE_URL"), ("--nodes LIST", "CALIMERO_NODES"),
                           ("--node-name NAME", "CALIMERO_NODE_NAME"), ("--toolsets LIST", "CALIMERO_MCP_TOOLSETS"),
                           ("--read-only", "CALIMERO_MCP_READ_ONLY"), ("--log-level LEVEL", "CALIMERO_MCP_LOG_LEVEL")):
        assert re.search(r"^  %s +%s +\S" % (re.escape(flag), variable), flags, re.M), (flag, flags)
    for option in ("--check", "-V, --version", "-h, --help"):
        assert "\n  %s " % option in flags, option
    missing = [name for name in our_variables() if name not in text]
    assert missing == [], "--help names no %s" % missing
    assert all(len(line) <= 120 for line in text.splitlines()), "a line past 120 characters"
    assert "README.md" not in text and "see " not in text.lower()


def test_help_names_the_command_that_started_it():
    if SERVER_COMMAND[-1].endswith(".pyz"):
        pytest.skip("MERO_MCP_TEST_SERVER is the pyz: test_pyz.py checks its --help")
    assert "Register it with your agent as the command: python3 %s [FLAG ...]\n" % (ROOT / "mero_mcp.py") \
        in help_text(["-h"])
    assert help_text(["--read-only", "--help"]) == help_text()


@pytest.mark.parametrize("args, said", [
    (["--bogus"], "unknown argument --bogus"),
    (["-x"], "unknown argument -x"),
    (["serve"], "unknown argument serve"),
    ([""], 'unknown argument ""'),
    (["--x\nrest"], 'unknown argument "--x\\nrest"'),
    (["--toolsets"], "--toolsets needs a value: --toolsets LIST"),
    (["--toolsets", "--read-only"], "--toolsets needs a value"),
    (["--node-url="], "--node-url needs a value"),
    (["--read-only=yes"], "--read-only takes no value"),
    (["--log-level", "loud"], '--log-level "loud" is no level: debug, info, warning, error'),
    (["--toolsets", "core,blob"], "--toolsets names unknown toolsets blob"),
    (["--nodes", "node1"], '--nodes entry "node1" is not name=url'),
    (["--node-url", "localhost:2528"], "--node-url"),
    (["--check", "--nodes", "a=http://x,a=http://y"], '--nodes names "a" twice'),
    (["--version", "--log-level"], "--log-level needs a value"),
])
def test_a_flag_we_do_not_take_is_one_stderr_line_and_exit_2(args, said):
    done = run(args)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("mero-mcp: ") and said in done.stderr, done.stderr


# ---- --check names where each node came from ----

def test_check_names_where_each_node_came_from(network, tmp_path):
    node1, node2 = network.add("node1"), network.add("node2")
    env = minimal_env(tmp_path / "home", {"CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                          "CALIMERO_NODE_HOME": tmp_path / "nodes"})
    two = "node1=%s,node2=%s" % (node1.url, node2.url)
    done = run_check(dict(env, CALIMERO_NODES=two))
    assert "Node:      %s, found by CALIMERO_NODES, the default as the first named node (name: node1)\n" \
        % node1.url in done.stdout, done.stdout
    assert "  node2:   %s from CALIMERO_NODES: alive" % node2.url in done.stdout, done.stdout
    assert "node home" not in done.stdout and "CALIMERO_NODE_NAME" not in done.stdout, done.stdout
    lone = run_check(dict(env, CALIMERO_NODES="node2=%s" % node2.url))     # the server's node: --check's too
    assert lone.returncode == 0 and "Node:      %s, found by CALIMERO_NODES (name: node2)\n" % node2.url \
        in lone.stdout, lone.stdout
    flagged = run(["--check", "--nodes", two, "--node-name", "node2"], env=env, timeout=60)
    assert "Node:      %s, found by the --nodes flag, the default by the --node-name flag (name: node2)\n" \
        % node2.url in flagged.stdout, flagged.stdout
    by_url = run(["--check", "--node-url", node1.url], env=dict(env, CALIMERO_NODE_URL=DEAD_NODE), timeout=60)
    assert by_url.returncode == 0 and "Node:      %s, found by the --node-url flag (name: none)\n" % node1.url \
        in by_url.stdout, by_url.stdout


def test_a_node_home_is_named_as_where_its_node_came_from(network, tmp_path):
    node1 = network.add("node1")
    home = tmp_path / "nodes" / "alpha"
    home.mkdir(parents=True)
    (home / "config.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/%s"]\n' % node1.url.rsplit(":", 1)[1])
    env = minimal_env(tmp_path / "home", {"CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                          "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_NODES": "beta=%s" % DEAD_NODE})
    done = run_check(env)
    assert "  alpha:   http://localhost:%s from the node home %s: alive" % (node1.url.rsplit(":", 1)[1], home) \
        in done.stdout, done.stdout
