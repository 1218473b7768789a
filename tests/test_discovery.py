"""Finding the node on a real machine: node homes as merod writes them (and as people edit them), and the
environment variables that point the server somewhere (reference-behaviour.md §1.1, §1.3; README "Finding the node").

The real server runs as a subprocess (`--check`, or a session over stdio) against the node double; the node home
is a folder of `<name>/config.toml` under tmp_path. A probe of the real local ports is never relied on: the tests
name the node (CALIMERO_NODE_NAME) or run with the probe pointed at a closed port.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from mcp_client import ROOT, TOOLSETS, McpServer, fixed_names, minimal_env, run_check
from node_double import sample_double


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def home_env(tmp_path, **extra):
    settings = {"CALIMERO_MCP_STATE_DIR": tmp_path / "state", "CALIMERO_NODE_HOME": tmp_path / "nodes"}
    settings.update(extra)
    return minimal_env(tmp_path / "home", settings)


def add_node(env, name, config):
    folder = os.path.join(env["CALIMERO_NODE_HOME"], name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.toml")
    with open(path, "wb") as handle:
        handle.write(config if isinstance(config, bytes) else config.encode("utf-8"))
    return path


def check_without_probe(env):
    """--check with the probe pointed at a closed port, so a node running on this machine cannot answer it."""
    script = ("import sys; sys.path.insert(0, %r); import node, mero_mcp; node.PROBE_PORTS = (%d,); "
              "sys.exit(mero_mcp.main(['--check']))" % (str(ROOT), closed_port()))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def node_status(env):
    server = McpServer(env)
    try:
        server.initialize()
        status = server.call_tool("node_status")
        assert not status.get("isError"), status
        listed = server.call_tool("list_nodes")
        assert not listed.get("isError"), listed
    finally:
        server.close()
    server.assert_stdout_pure()
    assert "Traceback" not in server.stderr, server.stderr
    return json.loads(status["content"][-1]["text"]), json.loads(listed["content"][-1]["text"])["nodes"], server.stderr


# ── config.toml as merod writes it, and as people edit it ─────────────────────────────────────────

# What `merod init` writes (toml's to_string_pretty of calimero-network/core crates/config ConfigFile): the server
# listens on 127.0.0.1 and ::1, the swarm on every address and another port, subtables under [server].
MEROD_CONFIG = '''[identity]
peer_id = "12D3KooWQp6Y3mYzF1k7m2n4r5s6t7u8v9w1x2y3z4a5b6c7d8e9"
keypair = "23jhTaJ1mX6FvZ7k"

[swarm]
listen = [
    "/ip4/0.0.0.0/tcp/{decoy}",
    "/ip4/0.0.0.0/udp/{decoy}/quic-v1",
    "/ip6/::/tcp/{decoy}",
    "/ip6/::/udp/{decoy}/quic-v1",
]

[bootstrap]
nodes = []

[discovery]
mdns = false
advertise_address = false

[server]
listen = [
    "/ip4/127.0.0.1/tcp/{port}",
    "/ip6/::1/tcp/{port}",
]
auth_mode = "proxy"

[server.admin]
enabled = true

[server.jsonrpc]
enabled = true

[server.websocket]
enabled = true

[sync]
timeout_ms = 30000
interval_ms = 5000

[datastore]
path = "data"

[blobstore]
path = "blobs"

[context]
migration_v2 = true
'''

# Each holds `{port}` (the double) and maybe `{decoy}` (a closed port a wrong reading would pick).
CONFIG_FORMS = {
    "merod init": MEROD_CONFIG,
    "CRLF line ends": MEROD_CONFIG.replace("\n", "\r\n"),
    "a byte order mark before [server]": "\ufeff[server]\nlisten = [\"/ip4/127.0.0.1/tcp/{port}\"]\n",
    "one line, several entries": '[server]\nlisten = ["/ip6/::1/tcp/{port}", "/ip4/127.0.0.1/tcp/{port}"]\n',
    "every address": '[server]\nlisten = ["/ip4/0.0.0.0/tcp/{port}"]\n',
    "quoted key and header": "[ 'server' ]\n\"listen\" = [ '/ip4/127.0.0.1/tcp/{port}' ]\n",
    "tabs and spaces": "\t[server]   \n\tlisten\t=\t[\t\"/ip4/127.0.0.1/tcp/{port}\"\t]\t\n",
    "dotted key at the root": 'server.listen = ["/ip4/127.0.0.1/tcp/{port}"]\n[swarm]\nlisten = []\n',
    "inline table": 'server = {{ listen = ["/ip4/127.0.0.1/tcp/{port}"], auth_mode = "proxy" }}\n',
    "comments naming other addresses": ('# listen = ["/ip4/127.0.0.1/tcp/{decoy}"]\n'
                                        '[server] # was /ip4/127.0.0.1/tcp/{decoy}\n'
                                        'auth_mode = "proxy"  # not /ip4/127.0.0.1/tcp/{decoy}\nlisten = [\n'
                                        '  # "/ip4/127.0.0.1/tcp/{decoy}",\n'
                                        '  "/ip4/127.0.0.1/tcp/{port}", # current\n]\n'),
    "another key in [server] holding an address": ('[server]\nnote = "/ip4/127.0.0.1/tcp/{decoy}"\n'
                                                   'listen = ["/ip4/127.0.0.1/tcp/{port}"]\n'),
    "a subtable with a listen key of its own": ('[server]\nlisten = ["/ip4/127.0.0.1/tcp/{port}"]\n'
                                                '[server."legacy proxy"]\nlisten = ["/ip4/127.0.0.1/tcp/{decoy}"]\n'
                                                "[server.'x']\nlisten = [\"/ip4/127.0.0.1/tcp/{decoy}\"]\n"),
    "a string holding brackets and a hash": ('[server]\nbanner = "[swarm] # \\"listen\\""\n'
                                             'listen = ["/ip4/127.0.0.1/tcp/{port}"]\n'),
}


@pytest.mark.parametrize("form", sorted(CONFIG_FORMS))
def test_every_form_a_real_config_takes_finds_the_node(tmp_path, double, form):
    env = home_env(tmp_path)
    add_node(env, "default", CONFIG_FORMS[form].format(port=double.port, decoy=closed_port()))
    done = check_without_probe(env)
    url = "http://localhost:%d" % double.port
    assert "Node:      %s, found by the node home's only (or default) node (name: default)" % url in done.stdout, \
        done.stdout
    assert "Health:    alive" in done.stdout and done.returncode == 0, done.stdout


def test_a_node_listening_on_ip6_alone_is_reached_there(tmp_path):
    """localhost may resolve to 127.0.0.1 only (it does in many containers): an ip6-only node needs [::1]."""
    try:
        double = sample_double(host="::1").start()
    except OSError as error:
        pytest.skip("cannot listen on ::1 here: %s" % error)
    try:
        env = home_env(tmp_path, CALIMERO_NODE_NAME="solo")
        add_node(env, "solo", '[server]\nlisten = ["/ip6/::1/tcp/%d"]\n' % double.port)
        status, listed, _ = node_status(env)
    finally:
        double.stop()
    assert (status["health"], status["url"], status["nodeName"]) == \
        ({"status": "alive"}, "http://[::1]:%d" % double.port, "solo"), status
    assert {"url": "http://[::1]:%d" % double.port, "name": "solo", "active": True} in listed, listed


# A config.toml that gives no address the server can use, and the words that say why (after the file's path).
UNUSABLE_CONFIGS = {
    "remote addresses only": ('[server]\nlisten = ["/ip4/192.168.1.40/tcp/2528"]\n',
                              'has no address in its [server] listen that this machine reaches locally '
                              '("/ip4/192.168.1.40/tcp/2528")'),
    "a random port": ('[server]\nlisten = ["/ip4/127.0.0.1/tcp/0"]\n',
                      'has no address in its [server] listen that this machine reaches locally '
                      '("/ip4/127.0.0.1/tcp/0")'),
    "an empty list": ("[server]\nlisten = []\n",
                      "has no address in its [server] listen that this machine reaches locally (the list is empty)"),
    "a string, not a list": ('[server]\nlisten = "/ip4/127.0.0.1/tcp/2528"\n',
                             "has a [server] listen that is not a list of addresses"),
    "numbers, not addresses": ("[server]\nlisten = [2528]\n", "has a [server] listen that is not a list of addresses"),
    "listen only in [swarm]": ('[swarm]\nlisten = ["/ip4/127.0.0.1/tcp/2428"]\n[server]\nauth_mode = "proxy"\n',
                               "has no listen addresses in its [server] table"),
    "listen twice": ('[server]\nlisten = ["/ip4/127.0.0.1/tcp/2528"]\nlisten = ["/ip4/127.0.0.1/tcp/2529"]\n',
                     "sets listen in [server] more than once"),
    "an array that never ends": ('[server]\nlisten = [\n  "/ip4/127.0.0.1/tcp/2528",\n',
                                 "is not valid TOML (line 4: an array that does not end)"),
    "a string that never ends": ('[server]\nlisten = ["/ip4/127.0.0.1/tcp/2528]\n',
                                 "is not valid TOML (line 2: a string that does not end)"),
    "binary garbage": (b"\x00\xff\xfe[[[\x01", "is not valid TOML (line 1: expected a key)"),
    "arrays nested past any depth": ("[server]\nlisten = " + "[" * 50000 + "]" * 50000 + "\n",
                                     "is not valid TOML (arrays nested too deep)"),
    "larger than a megabyte": ("[server]\n" + "# padding\n" * 120000, "is larger than 1024 KB"),
}


@pytest.mark.parametrize("name", sorted(UNUSABLE_CONFIGS))
def test_a_named_node_whose_config_gives_no_address_says_why(tmp_path, name):
    config, reason = UNUSABLE_CONFIGS[name]
    env = home_env(tmp_path, CALIMERO_NODE_NAME="work")
    path = add_node(env, "work", config)
    said = 'Node "work" in %s cannot be used: %s %s' % (env["CALIMERO_NODE_HOME"], path, reason)
    done = run_check(env)
    assert done.returncode == 1 and said in done.stdout, done.stdout
    assert 'Fix: Give the node\'s config.toml a [server] listen list of local addresses' in done.stdout
    status, _, stderr = node_status(env)
    assert status["health"]["status"] == "unreachable" and said in status["health"]["error"], status
    assert said in stderr


def test_a_config_toml_that_is_a_named_pipe_is_not_read(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    env = home_env(tmp_path, CALIMERO_NODE_NAME="work")
    os.makedirs(os.path.join(env["CALIMERO_NODE_HOME"], "work"))
    path = os.path.join(env["CALIMERO_NODE_HOME"], "work", "config.toml")
    os.mkfifo(path)
    done = run_check(env, timeout=30)
    assert done.returncode == 1 and "%s is not a regular file" % path in done.stdout, done.stdout


def test_with_no_usable_node_directory_the_error_names_the_ones_passed_over(tmp_path):
    env = home_env(tmp_path)
    remote = add_node(env, "lan", '[server]\nlisten = ["/ip4/10.0.0.7/tcp/2528"]\n')
    broken = add_node(env, "old", "[server\nlisten = 1\n")
    os.makedirs(os.path.join(env["CALIMERO_NODE_HOME"], "logs"))              # no config.toml: not a node at all
    done = check_without_probe(env)
    assert done.returncode == 1, done.stdout
    assert ("No Calimero node found. Start one in the Calimero desktop app, or set CALIMERO_NODE_URL. (Looked in %s "
            "and probed local ports.) Passed over: %s has no address in its [server] listen that this machine reaches "
            'locally ("/ip4/10.0.0.7/tcp/2528"). Passed over: %s is not valid TOML (line 1: expected ])'
            % (env["CALIMERO_NODE_HOME"], remote, broken)) in done.stdout, done.stdout
    assert "logs" not in done.stdout


def test_a_usable_node_is_used_and_the_ones_passed_over_are_reported(tmp_path, double):
    env = home_env(tmp_path)
    add_node(env, "default", '[server]\nlisten = ["/ip4/127.0.0.1/tcp/%d"]\n' % double.port)
    broken = add_node(env, "old", '[server]\nlisten = "/ip4/127.0.0.1/tcp/2428"\n')
    done = check_without_probe(env)
    assert done.returncode == 0 and "Health:    alive" in done.stdout, done.stdout
    assert "  - %s has a [server] listen that is not a list of addresses" % broken in done.stdout, done.stdout


# ── Environment variables with odd values ─────────────────────────────────────────────────────────

@pytest.mark.parametrize("value, said", [
    ("abc", 'CALIMERO_MCP_TIMEOUT="abc" is not a positive number of seconds; using 10'),
    ("0", 'CALIMERO_MCP_TIMEOUT="0" is not a positive number of seconds; using 10'),
    ("-1", 'CALIMERO_MCP_TIMEOUT="-1" is not a positive number of seconds; using 10'),
    ("nan", 'CALIMERO_MCP_TIMEOUT="nan" is not a positive number of seconds; using 10'),
    ("1e10", 'CALIMERO_MCP_TIMEOUT="1e10" is more than a day; using 86400 s'),     # past the clock: a traceback
    ("inf", 'CALIMERO_MCP_TIMEOUT="inf" is more than a day; using 86400 s'),
    ("1e400", 'CALIMERO_MCP_TIMEOUT="1e400" is more than a day; using 86400 s'),
])
def test_an_odd_timeout_is_reported_and_a_sound_one_used(tmp_path, double, value, said):
    env = home_env(tmp_path, CALIMERO_NODE_URL=double.url, CALIMERO_MCP_TIMEOUT=value)
    done = run_check(env)
    assert done.returncode == 0 and "Health:    alive" in done.stdout, done.stdout + done.stderr
    assert "  - %s\n    Fix: Set CALIMERO_MCP_TIMEOUT to a number of seconds, e.g. 30" % said in done.stdout, \
        done.stdout
    status, _, stderr = node_status(env)
    assert status["health"] == {"status": "alive"}, status
    assert stderr.count(said) == 1, stderr


def test_a_sound_timeout_is_no_problem(tmp_path, double):
    done = run_check(home_env(tmp_path, CALIMERO_NODE_URL=double.url, CALIMERO_MCP_TIMEOUT=" 2.5 "))
    assert done.returncode == 0 and "Problems:" not in done.stdout and not done.stderr, done.stdout + done.stderr


def test_a_node_home_written_with_a_tilde_is_the_home_folder_one(tmp_path, double):
    """Hosts start the server without a shell: `~` must not become a folder named ~ where the host runs it."""
    env = home_env(tmp_path, CALIMERO_NODE_HOME="~/my-nodes", CALIMERO_MCP_STATE_DIR="~/state")
    add_node(dict(env, CALIMERO_NODE_HOME=str(tmp_path / "home" / "my-nodes")), "default",
             '[server]\nlisten = ["/ip4/127.0.0.1/tcp/%d"]\n' % double.port)
    os.makedirs(str(tmp_path / "cwd"))
    done = run_check(env, cwd=tmp_path / "cwd")
    assert "Node:      http://localhost:%d, found by the node home's only (or default) node (name: default)" \
        % double.port in done.stdout, done.stdout
    assert "Handoff:   none in %s" % (tmp_path / "home" / "state") in done.stdout, done.stdout
    assert os.listdir(str(tmp_path / "cwd")) == []


@pytest.mark.parametrize("kind, said", [("missing", "does not exist"), ("a file", "is a file, not a directory")])
def test_a_node_home_that_names_no_directory_says_so(tmp_path, kind, said):
    home = tmp_path / "calimero-dev"
    if kind == "a file":
        home.write_text("")
    env = home_env(tmp_path, CALIMERO_NODE_HOME=home)
    done = check_without_probe(env)
    assert done.returncode == 1, done.stdout
    assert "(Looked in %s and probed local ports.) CALIMERO_NODE_HOME (%s) %s." % (home, home, said) in done.stdout
    named = run_check(dict(env, CALIMERO_NODE_NAME="work"))
    assert 'Node "work" not found in %s. Available: (none) CALIMERO_NODE_HOME (%s) %s.' % (home, home, said) \
        in named.stdout, named.stdout


@pytest.mark.parametrize("suffix, route", [("/admin-api", "admin-api"), ("/admin-dashboard/", "admin-dashboard"),
                                           ("/node1/jsonrpc", "jsonrpc"), ("/admin-api/health", "admin-api")])
def test_a_node_url_copied_from_one_of_the_nodes_pages_names_the_base_address(tmp_path, double, suffix, route):
    base = double.url + ("/node1" if suffix.startswith("/node1") else "")
    env = home_env(tmp_path, CALIMERO_NODE_URL=double.url + suffix)
    fix = "Set CALIMERO_NODE_URL to the node's base address, %s." % base
    said = "CALIMERO_NODE_URL (%s) reaches into the node's /%s, a path this server adds itself. %s" % (
        double.url + suffix, route, fix)
    done = run_check(env)
    assert done.returncode == 1 and said in done.stdout and "Fix: " + fix in done.stdout, done.stdout
    status, _, _ = node_status(env)
    assert status["health"] == {"status": "unreachable", "error": said}, status


@pytest.mark.parametrize("value", ["localhost:2528", "127.0.0.1:2528"])
def test_a_node_url_without_its_scheme_gets_the_fix_spelled_out(tmp_path, value):
    done = run_check(home_env(tmp_path, CALIMERO_NODE_URL=value))
    assert done.returncode == 1 and "CALIMERO_NODE_URL (%s) is not an http(s) URL" % value in done.stdout, done.stdout
    assert "Fix: Set CALIMERO_NODE_URL with its scheme: http://%s." % value in done.stdout


@pytest.mark.parametrize("form", ["  {url}\n", "{url}///", "HTTP://LOCALHOST:{port}", "http://[::1]:{port}"])
def test_node_url_spellings_that_name_the_node(tmp_path, form):
    double = sample_double(host="::1" if "::1" in form else "127.0.0.1")
    try:
        double.start()
    except OSError as error:
        pytest.skip("cannot listen on %s here: %s" % (double.host, error))
    try:
        env = home_env(tmp_path, CALIMERO_NODE_URL=form.format(url=double.url, port=double.port))
        status, _, _ = node_status(env)
    finally:
        double.stop()
    assert status["health"] == {"status": "alive"} and status["discoverySource"] == "env", status


@pytest.mark.parametrize("value, said", [
    ("Core,BLOBS", "CALIMERO_MCP_TOOLSETS names unknown toolsets BLOBS, Core (names are lower case)"),
    ("blobs governance", "CALIMERO_MCP_TOOLSETS names unknown toolsets blobs governance (separate them with commas)"),
    ("core;blobs", "CALIMERO_MCP_TOOLSETS names unknown toolsets core;blobs (separate them with commas)"),
    ("All", "CALIMERO_MCP_TOOLSETS names unknown toolsets All (names are lower case)"),
])
def test_a_toolset_list_written_another_way_says_how_to_write_it(tmp_path, double, value, said):
    env = home_env(tmp_path, CALIMERO_NODE_URL=double.url, CALIMERO_MCP_TOOLSETS=value)
    done = run_check(env)
    assert done.returncode == 0 and "  - %s\n    Fix: Name toolsets among core, blobs, governance" % said \
        in done.stdout, done.stdout
    _, _, stderr = node_status(env)
    assert said in stderr


@pytest.mark.parametrize("value", [" core , blobs ", "core,,blobs,", "blobs,blobs", ","])
def test_toolset_lists_with_spaces_empty_items_or_repeats_are_read_as_meant(tmp_path, double, value):
    done = run_check(home_env(tmp_path, CALIMERO_NODE_URL=double.url, CALIMERO_MCP_TOOLSETS=value))
    assert done.returncode == 0 and "Problems:" not in done.stdout, done.stdout
    toolsets = TOOLSETS if value == "," else ("core", "blobs")         # "," is unset: every toolset
    assert "%d fixed" % len(fixed_names(toolsets)) in done.stdout, done.stdout


@pytest.mark.parametrize("value", ["http://local\thost:2528", "http://localhost:25\n28", "http://localhost\x1b:2528",
                                   "http://localhost:2528/\x7f"])
def test_a_node_url_with_a_control_character_is_refused_naming_the_variable(tmp_path, value):
    """urlsplit drops a tab or line break silently, which would point the server at another address."""
    env = home_env(tmp_path, CALIMERO_NODE_URL=value)
    done = run_check(env)
    assert done.returncode == 1 and "CALIMERO_NODE_URL holds a control character" in done.stdout, done.stdout
    status, _, _ = node_status(env)
    assert status["health"]["status"] == "unreachable"
    assert status["health"]["error"].startswith("CALIMERO_NODE_URL holds a control character"), status


def test_check_says_each_warning_once_and_ends_quietly_into_head(tmp_path, double):
    """--check says each setting warning once, not once per server it builds to count tools, and `--check | head`
    ends with no BrokenPipeError traceback."""
    from mcp_client import SERVER
    env = home_env(tmp_path, CALIMERO_NODE_URL=double.url, CALIMERO_MCP_TIMEOUT="abc", CALIMERO_MCP_READ_ONLY="ture",
                   CALIMERO_MCP_TOOLSETS="Core", CALIMERO_MCP_MAX_RESPONSE_BYTES="x",
                   CALIMERO_MCP_MAX_RESULT_CHARS="y")
    done = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                          timeout=60)
    lines = (done.stdout + done.stderr).splitlines()
    for variable in ("CALIMERO_MCP_TIMEOUT", "CALIMERO_MCP_READ_ONLY", "CALIMERO_MCP_TOOLSETS",
                     "CALIMERO_MCP_MAX_RESPONSE_BYTES", "CALIMERO_MCP_MAX_RESULT_CHARS"):
        said = [line for line in lines if line.lstrip("[mero-cp] -").startswith(variable + "=")
                or line.lstrip("[mero-cp] -").startswith(variable + " names")]
        assert len(said) == 1, (variable, said, done.stdout, done.stderr)
    piped = subprocess.run("%s %s --check | head -1" % (sys.executable, SERVER), shell=True, env=env,
                           capture_output=True, text=True, timeout=60)
    assert piped.stdout == "mero-mcp --check\n"
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr
