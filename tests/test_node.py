"""node.py against the node double: discovery, the shared token files, refresh and revocation, error texts, check.

Every test builds its own environment mapping (discover(env) and Node(env) take it explicitly) with its own
state dir and node home under tmp_path; the probe rung is given the double's port, never the real ones.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import mero_node_config
import mero_node_http
import node
from node import Location, Node, NodeError
from node_double import COUNTER_MANIFEST, NODE_ACCOUNT, NODE_PUBLIC_KEY, NodeDouble, sample_double

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "pw-Sekrit-4711"
ADMIN = {"users": {"admin": PASSWORD}, "access_ttl": 3600}
GOOD_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


# ── Helpers ───────────────────────────────────────────────────────────────────────────────────────

def make_env(tmp_path, **extra):
    env = {"HOME": str(tmp_path / "home"), "CALIMERO_MCP_STATE_DIR": str(tmp_path / "state"),
           "CALIMERO_NODE_HOME": str(tmp_path / "nodes")}
    env.update({key: str(value) for key, value in extra.items()})
    return env


def token_env(tmp_path, authed, **extra):
    """Token mode against the authed double: the env, and the access and refresh tokens it carries."""
    access, refresh = authed.issue_tokens()
    env = make_env(tmp_path, CALIMERO_NODE_URL=authed.url, CALIMERO_AUTH_TOKEN=access,
                   CALIMERO_REFRESH_TOKEN=refresh, **extra)
    return env, access, refresh


def add_node(env, name, config):
    """A node home directory with the given config.toml text (or a port for the usual merod layout)."""
    directory = Path(env["CALIMERO_NODE_HOME"]) / name
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(config, int):
        config = ('[swarm]\nlisten = ["/ip4/0.0.0.0/tcp/%d"]\n\n[server]\nlisten = [\n  "/ip4/127.0.0.1/tcp/%d",\n'
                  '  "/ip6/::1/tcp/%d",\n]\n\n[server.admin]\nenabled = true\n' % (config + 100, config, config))
    (directory / "config.toml").write_text(config)
    return directory


def write_handoff(env, data):
    state = Path(env["CALIMERO_MCP_STATE_DIR"])
    state.mkdir(parents=True, exist_ok=True)
    path = state / "agent.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def jwt(**claims):
    """An unsigned JWT-shaped token carrying `claims` (None values left out): enough for the iat rule."""
    def part(value):
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return "%s.%s.sig" % (part({"alg": "HS256"}), part({k: v for k, v in claims.items() if v is not None}))


def cache_file(env, url, username=""):
    digest = hashlib.sha256(("%s\0%s" % (url, username)).encode()).hexdigest()[:16]
    return Path(env["CALIMERO_MCP_STATE_DIR"]) / ("tokens-%s.json" % digest)


def closed_port():
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def requests_to(double, path):
    return [entry for entry in double.log if entry["path"] == path]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def plain():
    double = sample_double().start()
    yield double
    double.stop()


@pytest.fixture
def authed():
    double = sample_double(auth=ADMIN).start()
    yield double
    double.stop()


@pytest.fixture
def node_log():
    """Records of the "mero-mcp" logger (attached directly: it holds whatever propagation the server sets)."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("mero-mcp")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(previous)


def messages(records):
    return [record.getMessage() for record in records]


def credentials_env(tmp_path, double, **extra):
    return make_env(tmp_path, CALIMERO_NODE_URL=double.url, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD=PASSWORD,
                    **extra)


# ── Discovery (§1.3) ──────────────────────────────────────────────────────────────────────────────

def test_node_url_wins_over_handoff_and_node_home(tmp_path):
    env = make_env(tmp_path, CALIMERO_NODE_URL="  http://localhost:9999//  ")
    add_node(env, "default", 2428)
    write_handoff(env, {"nodeUrl": "http://localhost:2528", "accessToken": jwt(iat=1)})
    assert node.discover(env) == Location("http://localhost:9999", None, "env")
    env["CALIMERO_NODE_NAME"] = "work"
    assert node.discover(env) == Location("http://localhost:9999", "work", "env")


def test_node_url_that_is_not_http_is_refused(tmp_path):
    with pytest.raises(NodeError) as caught:
        node.discover(make_env(tmp_path, CALIMERO_NODE_URL="localhost:2528"))
    assert "CALIMERO_NODE_URL" in str(caught.value) and "http" in caught.value.fix


@pytest.mark.parametrize("url", ["http://localhost:2528", "http://127.0.0.1:2528/", "http://[::1]:2528",
                                 "https://localhost", "HTTP://LOCALHOST:2528"])
def test_handoff_with_a_loopback_url_is_used(tmp_path, url):
    env = make_env(tmp_path)
    add_node(env, "default", 2428)
    write_handoff(env, {"nodeUrl": url, "accessToken": jwt(iat=1)})
    assert node.discover(env) == Location(url.rstrip("/"), None, "handoff")


@pytest.mark.parametrize("url, origin", [
    ("http://evil.example.com:2528", "http://evil.example.com:2528"),
    ("https://10.0.0.5", "https://10.0.0.5"),
    ("http://localhost.evil.example.com", "http://localhost.evil.example.com"),
    ("http://127.0.0.1.evil.example.com", "http://127.0.0.1.evil.example.com"),
    ("http://user:hunter2@evil.example.com/private?key=v", "http://evil.example.com"),
    ("file:///etc/passwd", "file:"),
    ("ftp://files.example.com/x", "ftp://files.example.com"),
    ("not a url", "an unparseable url"),
    ("", "an unparseable url"),
    (42, "an unparseable url"),
])
def test_handoff_pointing_elsewhere_is_ignored_whole(tmp_path, node_log, url, origin):
    env = make_env(tmp_path)
    add_node(env, "solo", 2428)
    token = jwt(iat=1, sub="handoff-secret")
    path = write_handoff(env, {"nodeUrl": url, "accessToken": token})
    before = path.read_bytes()
    assert node.discover(env) == Location("http://localhost:2428", "solo", "config-scan")
    connected = Node(env).connect()               # mode none: nothing goes to the node
    assert connected.auth_mode == "none"
    assert messages(node_log) == ["%s points at %s, which is not a local node; ignoring the file." % (path, origin)]
    assert token not in " ".join(messages(node_log)) and "hunter2" not in " ".join(messages(node_log))
    assert sorted(os.listdir(path.parent)) == ["agent.json"] and path.read_bytes() == before


@pytest.mark.parametrize("url, carried", [
    ("http://desk:hunter2@localhost:2528", "user:password@"),
    ("http://localhost:2528/?token=hunter2", "a query (?...)"),
    ("http://localhost:2528#hunter2", "a fragment (#...)"),
])
def test_handoff_node_url_with_credentials_is_ignored_whole(tmp_path, node_log, url, carried):
    """A loopback nodeUrl carrying a secret would send it along (HTTP Basic, or a query before every path)."""
    env = make_env(tmp_path)
    add_node(env, "solo", 2428)
    path = write_handoff(env, {"nodeUrl": url, "accessToken": jwt(iat=1)})
    assert node.discover(env) == Location("http://localhost:2428", "solo", "config-scan")
    assert messages(node_log) == ["%s gives a nodeUrl that carries %s; ignoring the file." % (path, carried)]


@pytest.mark.parametrize("url, carried", [
    ("http://admin:hunter2@localhost:2528", "user:password@"),
    ("http://localhost:2528/?token=hunter2", "a query (?...)"),
    ("http://localhost:2528/#hunter2", "a fragment (#...)"),
    ("http://admin:hunter2@localhost:2528/?token=hunter2", "user:password@ and a query (?...)"),
])
def test_node_url_carrying_credentials_is_refused(tmp_path, url, carried):
    with pytest.raises(NodeError) as caught:
        node.discover(make_env(tmp_path, CALIMERO_NODE_URL=url))
    assert str(caught.value).startswith("CALIMERO_NODE_URL carries %s, which this server refuses" % carried)
    assert "hunter2" not in str(caught.value) + caught.value.fix and "http://localhost:2528" in caught.value.fix


@pytest.mark.parametrize("content, said", [
    ("{not json", "is not valid JSON; ignoring it."),
    (json.dumps({"nodeUrl": "http://localhost:2528"}), "has no accessToken; ignoring it."),
    (json.dumps({"nodeUrl": "http://localhost:2528", "accessToken": "  "}), "has no accessToken; ignoring it."),
    (json.dumps(["accessToken"]), "has no accessToken; ignoring it."),
])
def test_malformed_or_tokenless_handoff_is_ignored(tmp_path, node_log, content, said):
    env = make_env(tmp_path)
    add_node(env, "solo", 2428)
    path = write_handoff(env, content)
    assert node.discover(env).source == "config-scan"
    assert messages(node_log) == ["%s %s" % (path, said)]
    assert path.read_text() == content


def test_handoff_without_node_url_authenticates_the_discovered_node(tmp_path):
    env = make_env(tmp_path)
    add_node(env, "solo", 2428)
    token = jwt(iat=10, exp=4_000_000_000)
    write_handoff(env, {"accessToken": token, "refreshToken": "r1"})
    connected = Node(env).connect()
    assert (connected.source, connected.name, connected.auth_mode) == ("config-scan", "solo", "handoff")
    cached = json.loads(cache_file(env, "http://localhost:2428").read_text())
    assert cached == {"access_token": token, "refresh_token": "r1", "expires_at": 4_000_000_000_000}


def test_named_node(tmp_path):
    env = make_env(tmp_path, CALIMERO_NODE_NAME="b")
    add_node(env, "a", 2428)
    add_node(env, "b", 2429)
    assert node.discover(env) == Location("http://localhost:2429", "b", "named")


def test_named_node_that_does_not_exist_lists_the_names(tmp_path):
    env = make_env(tmp_path, CALIMERO_NODE_NAME="zz")
    add_node(env, "b", 2429)
    add_node(env, "a", 2428)
    with pytest.raises(NodeError) as caught:
        node.discover(env, ports=[closed_port()])
    assert str(caught.value) == 'Node "zz" not found in %s. Available: a, b' % env["CALIMERO_NODE_HOME"]


def test_named_node_in_an_empty_home(tmp_path):
    env = make_env(tmp_path, CALIMERO_NODE_NAME="zz")
    with pytest.raises(NodeError) as caught:
        node.discover(env, ports=[closed_port()])
    home = env["CALIMERO_NODE_HOME"]            # the reference's text, then what is wrong with the home named
    assert str(caught.value) == 'Node "zz" not found in %s. Available: (none) CALIMERO_NODE_HOME (%s) does not ' \
        'exist.' % (home, home)


def test_the_single_configured_node_is_used(tmp_path):
    env = make_env(tmp_path)
    add_node(env, "mine", 2601)
    assert node.discover(env) == Location("http://localhost:2601", "mine", "config-scan")


def test_the_default_node_wins_among_several(tmp_path):
    env = make_env(tmp_path)
    add_node(env, "alpha", 2601)
    add_node(env, "default", 2602)
    assert node.discover(env) == Location("http://localhost:2602", "default", "config-scan")


def test_several_nodes_without_default_is_an_error(tmp_path):
    env = make_env(tmp_path)
    add_node(env, "beta", 2602)
    add_node(env, "alpha", 2601)
    with pytest.raises(NodeError) as caught:
        node.discover(env, ports=[closed_port()])
    assert str(caught.value) == ("Several nodes found in %s: alpha (http://localhost:2601), beta "
                                 "(http://localhost:2602). Set CALIMERO_NODE_NAME or CALIMERO_NODE_URL."
                                 % env["CALIMERO_NODE_HOME"])


@pytest.mark.parametrize("listen, url", [("/ip4/127.0.0.1/tcp/2601", "http://localhost:2601"),
                                         ("/ip4/0.0.0.0/tcp/2602", "http://localhost:2602"),
                                         ("/ip6/::1/tcp/2603", "http://[::1]:2603")])   # localhost may be ip4 only
def test_listen_address_forms(tmp_path, listen, url):
    env = make_env(tmp_path)
    add_node(env, "n", '[server]\nlisten = ["%s"]\n' % listen)
    assert node.configured_nodes(env) == [("n", url)]


def test_config_reading_rules(tmp_path):
    env = make_env(tmp_path)
    add_node(env, "swarm-only", '[swarm]\nlisten = ["/ip4/127.0.0.1/tcp/2701"]\n[server]\nenabled = true\n')
    add_node(env, "sub-table", '[server.admin]\nlisten = ["/ip4/127.0.0.1/tcp/2702"]\n')
    add_node(env, "commented", '[server]\n# listen = ["/ip4/127.0.0.1/tcp/2703"]\n')
    add_node(env, "remote-only", '[server]\nlisten = ["/ip4/10.1.2.3/tcp/2704"]\n')
    add_node(env, "real", 2705)
    (Path(env["CALIMERO_NODE_HOME"]) / "no-config").mkdir()
    (Path(env["CALIMERO_NODE_HOME"]) / "a-file.toml").write_text('[server]\nlisten = ["/ip4/127.0.0.1/tcp/2706"]\n')
    assert node.configured_nodes(env) == [("real", "http://localhost:2705")]
    assert node.configured_nodes(make_env(tmp_path / "nowhere")) == []


def test_probe_rung_finds_the_live_node(tmp_path, plain):
    env = make_env(tmp_path)
    assert node.probe([closed_port(), plain.port]) == ["http://localhost:%d" % plain.port]
    found = node.discover(env, ports=[closed_port(), plain.port])
    assert found == Location("http://localhost:%d" % plain.port, None, "probe")
    assert requests_to(plain, "/admin-api/health")[0]["headers"].get("authorization") is None


def test_probe_keeps_the_preference_order(plain):
    other = NodeDouble().start()
    try:
        assert node.probe([other.port, plain.port]) == ["http://localhost:%d" % p for p in (other.port, plain.port)]
        assert node.probe([plain.port, other.port]) == ["http://localhost:%d" % p for p in (plain.port, other.port)]
    finally:
        other.stop()


@pytest.mark.parametrize("fault", [{"garbage": True}, {"status": 200, "body": "hello from nginx"},
                                   {"json": [1, 2, 3]}, {"json": {"data": {"ok": True}}}, {"status": 204}],
                         ids=["html", "plain text", "a list", "no status", "empty"])
def test_probe_passes_over_an_http_server_that_is_not_a_node(tmp_path, plain, fault):
    other = NodeDouble().start()
    try:
        other.faults.update(fault, paths=["/admin-api/health"])
        assert node.probe([other.port, plain.port]) == ["http://localhost:%d" % plain.port]
        assert requests_to(other, "/admin-api/health")             # it was asked, and its answer not taken
        found = node.discover(make_env(tmp_path), ports=[other.port, plain.port])
        assert found == Location("http://localhost:%d" % plain.port, None, "probe")
    finally:
        other.stop()


def test_no_node_anywhere(tmp_path):
    env = make_env(tmp_path)
    with pytest.raises(NodeError) as caught:
        node.discover(env, ports=[closed_port()])
    assert str(caught.value) == ("No Calimero node found. Start one in the Calimero desktop app, or set "
                                 "CALIMERO_NODE_URL. (Looked in %s and probed local ports.)" % env["CALIMERO_NODE_HOME"]
                                 + " CALIMERO_NODE_HOME (%s) does not exist." % env["CALIMERO_NODE_HOME"])
    assert caught.value.status is None and caught.value.fix


def test_list_nodes_configured_first_then_probe_only(tmp_path, plain):
    other = NodeDouble().start()
    try:
        env = make_env(tmp_path)
        add_node(env, "work", plain.port)
        add_node(env, "stopped", closed_port())
        ports = [other.port, plain.port]
        active = "http://localhost:%d" % plain.port
        entries = node.list_nodes(env, active, ports=ports)
        assert entries == [                         # configured (in name order), then probe-only
            {"url": entries[0]["url"], "name": "stopped", "active": False},
            {"url": "http://localhost:%d" % plain.port, "name": "work", "active": True},
            {"url": "http://localhost:%d" % other.port, "name": None, "active": False},
        ]
        remote = node.list_nodes(env, "http://node.example.com:2528", ports=ports)
        assert remote[-1] == {"url": "http://node.example.com:2528", "name": None, "active": True}
        assert [e["active"] for e in remote[:-1]] == [False, False, False]
    finally:
        other.stop()


# ── The token cache and injection (§1.2, §1.4) ───────────────────────────────────────────────────

def test_credentials_login_writes_the_shared_cache_file(tmp_path, authed):
    env = credentials_env(tmp_path, authed)
    client = Node(env)
    assert client.get("/admin-api/applications")["apps"]
    login = requests_to(authed, "/auth/token")
    assert len(login) == 1
    body = login[0]["json"]
    assert isinstance(body.pop("timestamp"), int)
    assert body == {"auth_method": "user_password", "public_key": "admin", "client_name": "mero-mcp",
                    "permissions": ["admin"], "provider_data": {"username": "admin", "password": PASSWORD}}
    path = cache_file(env, authed.url, "admin")
    assert os.listdir(path.parent) == [path.name]
    assert mode_of(path) == 0o600 and mode_of(path.parent) == 0o700
    cached = json.loads(path.read_text())
    assert set(cached) == {"access_token", "refresh_token", "expires_at"}
    assert cached["expires_at"] == mero_node_config.jwt_claim(cached["access_token"], "exp") * 1000
    sent = requests_to(authed, "/admin-api/applications")[0]["headers"]["authorization"]
    assert sent == "Bearer " + cached["access_token"]
    assert (client.auth_mode, client.source, client.name) == ("credentials", "env", None)


def test_a_second_process_reuses_the_cached_tokens(tmp_path, authed):
    env = credentials_env(tmp_path, authed)
    Node(env).health()
    again = Node(env)
    again.get("/admin-api/contexts")
    assert len(requests_to(authed, "/auth/token")) == 1


def test_token_mode_cache_key_uses_an_empty_username(tmp_path):
    token = jwt(iat=5, exp=4_000_000_000)
    env = make_env(tmp_path, CALIMERO_NODE_URL="http://localhost:9", CALIMERO_AUTH_TOKEN=token)
    assert Node(env).connect().auth_mode == "token"
    cached = json.loads(cache_file(env, "http://localhost:9").read_text())
    assert cached == {"access_token": token, "refresh_token": "", "expires_at": 4_000_000_000_000}


def test_injected_token_without_exp_expires_in_an_hour(tmp_path):
    env = make_env(tmp_path, CALIMERO_NODE_URL="http://localhost:9", CALIMERO_AUTH_TOKEN="opaque",
                   CALIMERO_REFRESH_TOKEN="r")
    Node(env).connect()
    cached = json.loads(cache_file(env, "http://localhost:9").read_text())
    assert abs(cached["expires_at"] - (time.time() + 3600) * 1000) < 60_000


@pytest.mark.parametrize("cached_iat, injected_iat, injected_wins", [
    (100, 200, True), (200, 100, False), (200, 200, False), (None, 200, False), (100, None, False)])
def test_injected_token_replaces_the_cache_only_when_newer(tmp_path, cached_iat, injected_iat, injected_wins):
    injected = jwt(iat=injected_iat, sub="injected")
    env = make_env(tmp_path, CALIMERO_NODE_URL="http://localhost:9", CALIMERO_AUTH_TOKEN=injected,
                   CALIMERO_USERNAME="ops")
    path = cache_file(env, "http://localhost:9", "ops")
    path.parent.mkdir(parents=True)
    cached = {"access_token": jwt(iat=cached_iat, sub="cached"), "refresh_token": "rc", "expires_at": 1}
    path.write_text(json.dumps(cached))
    Node(env).connect()
    now = json.loads(path.read_text())
    assert now["access_token"] == (injected if injected_wins else cached["access_token"])


def test_handoff_token_is_never_sent_to_another_node(tmp_path, plain):
    env = make_env(tmp_path, CALIMERO_NODE_URL=plain.url)
    token = jwt(iat=1)
    write_handoff(env, {"nodeUrl": "http://localhost:2528", "accessToken": token})
    client = Node(env)
    client.health()
    assert client.auth_mode == "none"
    assert "authorization" not in requests_to(plain, "/admin-api/health")[0]["headers"]


def test_handoff_end_to_end(tmp_path, authed):
    """The desktop app's cycle: mint a client key, write agent.json; the server finds and uses it alone."""
    env = make_env(tmp_path)
    access, refresh = authed.issue_tokens()
    path = write_handoff(env, {"nodeUrl": authed.url, "accessToken": access, "refreshToken": refresh})
    before = path.read_bytes()
    client = Node(env, ports=[closed_port()])
    assert client.get("/admin-api/contexts")["contexts"]
    assert (client.source, client.auth_mode, client.url, client.name) == ("handoff", "handoff", authed.url, None)
    assert sorted(os.listdir(path.parent)) == sorted(["agent.json", cache_file(env, authed.url).name])
    assert path.read_bytes() == before


# ── Refresh (§1.4) and the refresh lock (§1.2) ────────────────────────────────────────────────────

def test_expired_token_is_refreshed_once_and_rotated(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed)
    client = Node(env)
    client.get("/admin-api/contexts")
    authed.expire_access_tokens()
    assert client.get("/admin-api/contexts")["contexts"]
    assert authed.refresh_count == 1
    assert requests_to(authed, "/auth/refresh")[0]["json"] == {"access_token": access, "refresh_token": refresh}
    cached = json.loads(cache_file(env, authed.url).read_text())
    assert cached["access_token"] != access and cached["refresh_token"] != refresh
    last = requests_to(authed, "/admin-api/contexts")[-1]
    assert last["headers"]["authorization"] == "Bearer " + cached["access_token"]
    client.get("/admin-api/contexts")
    assert authed.refresh_count == 1


def test_thirty_two_threads_share_one_refresh(tmp_path, monkeypatch):
    # The double listens with socketserver's backlog of 5: 32 simultaneous connects overflow it and some are
    # reset. A real merod listens with a deep backlog; give the double one too (test-only workaround).
    import node_double
    monkeypatch.setattr(node_double._Server, "request_queue_size", 128)
    authed = sample_double(auth=ADMIN).start()
    try:
        run_thirty_two_threads(tmp_path, authed)
    finally:
        authed.stop()


def run_thirty_two_threads(tmp_path, authed):
    client = Node(credentials_env(tmp_path, authed))
    client.health()
    client.get("/admin-api/contexts")
    authed.expire_access_tokens()
    barrier, results, failures = threading.Barrier(32), [], []

    def call():
        barrier.wait()
        try:
            results.append(client.get("/admin-api/contexts"))
        except NodeError as error:
            failures.append(str(error))
    threads = [threading.Thread(target=call) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == [] and len(results) == 32
    assert authed.refresh_count == 1
    assert len(requests_to(authed, "/auth/token")) == 1


CHILD = """
import sys, time
import node
client = node.Node()
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
print(client.get('/admin-api/applications')['apps'][0]['package'])
"""


def test_two_processes_never_spend_the_same_refresh_token(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed, PYTHONPATH=ROOT, PATH=os.environ.get("PATH", ""))
    Node(env).connect()                           # both children start from this shared cache file
    authed.expire_access_tokens()
    authed.faults.update({"delay": 0.5, "paths": ["/auth/refresh"]})   # hold the lock while the other waits
    start_at = time.time() + 1.5
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(start_at)], env=env, cwd=str(tmp_path),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate(timeout=60) for child in children]
    assert [child.returncode for child in children] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["com.calimero.kv-store"] * 2
    assert authed.refresh_count == 1
    assert not any(entry["headers"].get("x-auth-error") for entry in authed.log)
    assert not os.path.exists(str(cache_file(env, authed.url)) + ".lock")


def test_file_lock_breaks_stale_locks_and_waits_for_live_ones(tmp_path):
    path = str(tmp_path / "tokens-x.json.lock")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Path(path).write_text(str(dead.pid))
    with mero_node_config.file_lock(path):                    # owner is gone: broken at once
        assert Path(path).read_text() == str(os.getpid()) and mode_of(path) == 0o600
    assert not os.path.exists(path)
    Path(path).write_text(str(os.getpid()))       # a live owner: wait until it lets go
    acquired = threading.Event()

    def take():
        with mero_node_config.file_lock(path):
            acquired.set()
    waiter = threading.Thread(target=take)
    waiter.start()
    assert not acquired.wait(0.3)
    os.unlink(path)
    assert acquired.wait(5)
    waiter.join(5)
    Path(path).write_text(str(os.getpid()))       # a live owner that has held it too long
    old = time.time() - 60
    os.utime(path, (old, old))
    with mero_node_config.file_lock(path):
        assert Path(path).read_text() == str(os.getpid())


def test_adopts_a_token_another_process_rotated(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed)
    client = Node(env)
    client.health()
    authed.expire_access_tokens()
    rotated = authed.issue_tokens()               # what the other process stored after its refresh
    cache_file(env, authed.url).write_text(json.dumps(node.token_bundle(*rotated)))
    assert client.get("/admin-api/contexts")["contexts"]
    assert authed.refresh_count == 0
    assert requests_to(authed, "/admin-api/contexts")[-1]["headers"]["authorization"] == "Bearer " + rotated[0]


def test_a_failed_refresh_is_tried_again_by_the_next_call(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed)
    client = Node(env)
    client.health()
    authed.expire_access_tokens()
    authed.faults.update({"reset": True, "paths": ["/auth/refresh"], "times": 1})
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert str(caught.value) == ("The access token expired and could not be refreshed: Cannot reach the node at "
                                 "%s/auth/refresh: the connection was reset. Set a fresh CALIMERO_AUTH_TOKEN (and "
                                 "CALIMERO_REFRESH_TOKEN)." % authed.url)
    assert client.get("/admin-api/contexts")["contexts"]
    assert authed.refresh_count == 1


def test_expired_token_without_refresh_token(tmp_path, authed):
    access, _ = authed.issue_tokens()
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=authed.url, CALIMERO_AUTH_TOKEN=access))
    client.get("/admin-api/contexts")
    authed.expire_access_tokens()
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert str(caught.value) == ("The access token expired and could not be refreshed: no refresh token is "
                                 "available. Set a fresh CALIMERO_AUTH_TOKEN (and CALIMERO_REFRESH_TOKEN).")
    assert caught.value.status == 401 and authed.refresh_count == 0


# ── Revocation and re-login ───────────────────────────────────────────────────────────────────────

def test_revocation_clears_the_cache_and_says_so(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed)
    client = Node(env)
    client.get("/admin-api/contexts")
    assert cache_file(env, authed.url).exists()
    authed.revoke_all()
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert str(caught.value) == ("Authentication revoked (token_revoked): HTTP 403 Forbidden from %s/admin-api/"
                                 "contexts. The cached tokens were cleared. Set a fresh CALIMERO_AUTH_TOKEN (and "
                                 "CALIMERO_REFRESH_TOKEN)." % authed.url)
    assert not cache_file(env, authed.url).exists()
    with pytest.raises(NodeError) as again:         # it stays revoked, and says so, until a new token comes
        client.get("/admin-api/contexts")
    assert str(again.value) == str(caught.value)


def test_replayed_refresh_token_is_reported_as_reuse(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed)
    client = Node(env)
    client.health()
    authed.expire_access_tokens()
    import requests                              # someone else spends our refresh token first
    spent = requests.post(authed.url + "/auth/refresh", json={"access_token": access, "refresh_token": refresh})
    assert spent.status_code == 200
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert str(caught.value) == ("Authentication revoked (token_reuse): HTTP 401 Unauthorized from %s/auth/refresh. "
                                 "The cached tokens were cleared. Set a fresh CALIMERO_AUTH_TOKEN (and "
                                 "CALIMERO_REFRESH_TOKEN)." % authed.url)
    assert not cache_file(env, authed.url).exists()


def test_credentials_log_in_again_after_revocation(tmp_path, authed):
    env = credentials_env(tmp_path, authed)
    client = Node(env)
    client.get("/admin-api/contexts")
    first = json.loads(cache_file(env, authed.url, "admin").read_text())["access_token"]
    authed.revoke_all()
    assert client.get("/admin-api/contexts")["contexts"]
    assert len(requests_to(authed, "/auth/token")) == 2
    assert json.loads(cache_file(env, authed.url, "admin").read_text())["access_token"] != first


def test_credentials_log_in_again_over_a_cache_the_node_does_not_know(tmp_path, authed):
    """A cache left by a node that was re-initialised on the same port: its tokens are plain 401s now."""
    env = credentials_env(tmp_path, authed)
    path = cache_file(env, authed.url, "admin")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(node.token_bundle(jwt(iat=1, sub="old-node"), "old-refresh")))
    client = Node(env)
    assert client.get("/admin-api/contexts")["contexts"]
    assert len(requests_to(authed, "/auth/token")) == 1 and authed.refresh_count == 0
    assert json.loads(path.read_text())["refresh_token"] != "old-refresh"


def test_credentials_log_in_again_when_the_refresh_fails(tmp_path, authed):
    client = Node(credentials_env(tmp_path, authed))
    client.get("/admin-api/contexts")
    authed.expire_access_tokens()
    authed.faults.update({"status": 500, "paths": ["/auth/refresh"]})
    assert client.get("/admin-api/contexts")["contexts"]
    assert authed.refresh_count == 0 and len(requests_to(authed, "/auth/refresh")) == 1
    assert len(requests_to(authed, "/auth/token")) == 2


def test_handoff_reconnect_after_revocation_is_adopted(tmp_path, authed):
    """The desktop app re-connects: new key in agent.json, old one revoked. The live process follows."""
    env = make_env(tmp_path)
    path = write_handoff(env, dict(zip(("accessToken", "refreshToken"), authed.issue_tokens()), nodeUrl=authed.url))
    client = Node(env, ports=[closed_port()])
    client.get("/admin-api/contexts")
    time.sleep(1.1)                               # the new key's iat must be a later second
    authed.revoke_all()
    access, refresh = authed.issue_tokens()
    write_handoff(env, {"nodeUrl": authed.url, "accessToken": access, "refreshToken": refresh})
    before = path.read_bytes()
    assert client.get("/admin-api/contexts")["contexts"]
    assert json.loads(cache_file(env, authed.url).read_text())["access_token"] == access
    assert path.read_bytes() == before


def test_a_rewritten_handoff_naming_no_node_is_never_adopted_by_another_node_than_the_default(tmp_path, authed):
    """Issue 41: the handoff token belongs to the node it names, or to the default node when it names none. node2
    (not the default) took its token from a handoff naming it; after that family is revoked, the desktop app
    rewrites the file with node1's token and no node: node2 must fail rather than send node1's token."""
    node2 = sample_double(auth=ADMIN).start()
    try:
        env = make_env(tmp_path)
        write_handoff(env, dict(zip(("accessToken", "refreshToken"), node2.issue_tokens()), nodeUrl=node2.url))
        named = mero_node_config.NamedNode("node2", node2.url, False, "CALIMERO_NODES", None)
        client = Node(env, named=named, default=False)
        client.get("/admin-api/contexts")
        assert client.auth_mode == "handoff"
        time.sleep(1.1)                           # the new key's iat must be a later second
        node2.revoke_all()
        foreign, foreign_refresh = authed.issue_tokens()          # node1's, in a file that names no node
        write_handoff(env, {"accessToken": foreign, "refreshToken": foreign_refresh})
        with pytest.raises(NodeError):
            client.get("/admin-api/contexts")
        assert not [value for value in node2.authorizations() if value and foreign in value]
        default = Node(dict(env, CALIMERO_NODE_URL=authed.url), ports=[closed_port()])
        assert default.get("/admin-api/contexts")["contexts"] and default.auth_mode == "handoff"  # the default does
    finally:
        node2.stop()


# ── Passwords ─────────────────────────────────────────────────────────────────────────────────────

def test_password_file_is_read_and_trimmed(tmp_path, authed):
    secret = tmp_path / "password"
    secret.write_text("  %s\n" % PASSWORD)
    env = make_env(tmp_path, CALIMERO_NODE_URL=authed.url, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD_FILE=secret)
    client = Node(env)
    assert client.get("/admin-api/contexts")["contexts"] and client.auth_mode == "credentials"


def test_missing_password_file_is_a_clear_error_until_fixed(tmp_path, authed):
    secret = tmp_path / "password"
    env = make_env(tmp_path, CALIMERO_NODE_URL=authed.url, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD_FILE=secret)
    client = Node(env)
    with pytest.raises(NodeError) as caught:
        client.health()
    # The variable's value is not echoed: a password pasted into it by mistake must not reach a log.
    assert str(caught.value) == "Cannot read the file CALIMERO_PASSWORD_FILE names: No such file or directory"
    assert "CALIMERO_PASSWORD" in caught.value.fix
    secret.write_text(PASSWORD)
    assert client.health() == {"status": "alive"}


def test_wrong_password(tmp_path, authed):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=authed.url, CALIMERO_USERNAME="admin",
                           CALIMERO_PASSWORD="wrong-guess-99"))
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert str(caught.value) == "Authentication failed: invalid username or password"
    assert caught.value.status == 401


def test_login_against_a_node_without_auth(tmp_path, plain):
    client = Node(credentials_env(tmp_path, plain))
    with pytest.raises(NodeError) as caught:
        client.health()
    assert "has no login service" in str(caught.value) and "Unset CALIMERO_USERNAME" in caught.value.fix


def test_secrets_never_reach_logs_or_messages(tmp_path, authed, capsys):
    """Run the auth paths with every logger at DEBUG; no token or password may show up anywhere."""
    records = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    texts, seen_tokens = [], set()
    try:
        env = credentials_env(tmp_path, authed)
        client = Node(env)
        client.get("/admin-api/contexts", params={"token": "query-sekrit"})
        for step in (authed.expire_access_tokens, authed.revoke_all):
            seen_tokens.update(json.loads(cache_file(env, authed.url, "admin").read_text()).values())
            step()
            client.get("/admin-api/contexts")
        authed.faults.update({"status": 500, "body": ""})
        for call in (lambda: client.get("/admin-api/contexts", params={"token": "query-sekrit"}),
                     lambda: Node(dict(env, CALIMERO_PASSWORD="not-" + PASSWORD,
                                       CALIMERO_USERNAME="root")).health()):
            with pytest.raises(NodeError) as caught:
                call()
            texts.append(str(caught.value))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    seen_tokens.update(json.loads(cache_file(env, authed.url, "admin").read_text()).values())
    captured = capsys.readouterr()
    everything = "\n".join(texts + [r.getMessage() for r in records] + [captured.out, captured.err])
    ours = "\n".join(texts + [r.getMessage() for r in records if r.name == "mero-mcp"])
    assert "logging in again as admin" in ours
    assert "query-sekrit" not in ours             # urllib3's own DEBUG lines show the caller's query; ours never
    for secret in [PASSWORD, "Bearer"] + [t for t in seen_tokens if isinstance(t, str)]:
        assert secret not in everything
    assert captured.out == ""


# ── HTTP: traceparent, timeouts, error texts (§6) ────────────────────────────────────────────────

@pytest.mark.parametrize("traceparent, forwarded", [
    (GOOD_TRACE, True),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", False),
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", False),
    (None, False),
])
def test_traceparent_is_forwarded_only_when_well_formed(tmp_path, plain, traceparent, forwarded):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    with client.traced(traceparent):
        client.health()
    client.get("/admin-api/contexts")
    inside, after = requests_to(plain, "/admin-api/health")[0], requests_to(plain, "/admin-api/contexts")[0]
    assert inside["headers"].get("traceparent") == (traceparent if forwarded else None)
    assert "traceparent" not in after["headers"]


def test_a_request_carries_the_sessions_headers_and_cookies_beside_ours(tmp_path, plain):
    """Requests are prepared without Session.request's merging (node._prepared): the session's headers and cookie
    jar must still reach the node, with the request's own headers and query."""
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    jar = client.session.cookies
    jar.set("route", "b7")
    try:
        with client.traced(GOOD_TRACE):
            client.get("/admin-api/contexts", params={"offset": 0, "note": "2 of 3"})
    finally:
        jar.clear()
    seen = requests_to(plain, "/admin-api/contexts")[0]
    assert {key: seen["headers"].get(key) for key in ("user-agent", "accept", "connection", "cookie", "traceparent",
                                                       "content-type")} == {
        "user-agent": mero_node_http.USER_AGENT, "accept": "*/*", "connection": "keep-alive", "cookie": "route=b7",
        "traceparent": GOOD_TRACE, "content-type": None}
    assert seen["query"] == {"offset": "0", "note": "2 of 3"}


def test_concurrent_calls_keep_their_own_traceparent(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    plain.faults.update({"delay": 0.05})

    def run(traceparent, path):
        with client.traced(traceparent):
            for _ in range(5):
                client.get(path)
    threads = [threading.Thread(target=run, args=(GOOD_TRACE, "/admin-api/health")),
               threading.Thread(target=run, args=(other, "/admin-api/contexts"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [e["headers"].get("traceparent") for e in requests_to(plain, "/admin-api/health")] == [GOOD_TRACE] * 5
    assert [e["headers"].get("traceparent") for e in requests_to(plain, "/admin-api/contexts")] == [other] * 5


def test_unreachable_node(tmp_path):
    port = closed_port()
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL="http://127.0.0.1:%d" % port))
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts", params={"token": "sekrit"})
    assert str(caught.value) == "Cannot reach the node at http://127.0.0.1:%d/admin-api/contexts: connection refused" % port
    assert (caught.value.status, caught.value.retryable) == (None, False)


def test_timeout_says_how_long_it_waited(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update({"delay": 1.0})
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts", timeout=0.25)
    assert str(caught.value) == "Cannot reach the node at %s/admin-api/contexts: timed out after 0.25 s" % plain.url


@pytest.mark.parametrize("fault, path, text, status, retryable", [
    ({"status": 500, "body": ""}, "/admin-api/contexts",
     "HTTP 500 Internal Server Error from {url}/admin-api/contexts - the node returned no message", 500, False),
    ({"status": 500}, "/admin-api/contexts", "Internal server error", 500, False),
    ({"status": 500, "body": "Registry returned HTTP 404 Not Found for https://r.example/x.mpk"},
     "/admin-api/install-application", "HTTP 500 Internal Server Error from {url}/admin-api/install-application - "
     "the node said: Registry returned HTTP 404 Not Found for https://r.example/x.mpk", 500, False),
    ({"status": 400, "json": {"error": {"message": "nested reason"}}}, "/admin-api/contexts", "nested reason", 400,
     False),
    ({"status": 503, "json": {"data": {"status": "store_unavailable"}}}, "/admin-api/health",
     'HTTP 503 Service Unavailable from {url}/admin-api/health - the node said: '
     '{"data":{"status":"store_unavailable"}}', 503, True),
    ({"status": 404, "body": ""}, "/admin-api/applications/%s/abi" % ("ab" * 32), mero_node_http.OLD_NODE_ABI, 404, False),
    ({"status": 404, "body": ""}, "/admin-api/nowhere",
     "HTTP 404 Not Found from {url}/admin-api/nowhere - the node returned no message", 404, False),
    ({"garbage": True}, "/admin-api/health", "Unreadable response from {url}/admin-api/health: HTTP 200 with a body "
     "that is not valid JSON (35 bytes; garbled or cut off)", None, False),
    ({"truncated": True}, "/admin-api/health",
     "Unreadable response from {url}/admin-api/health: the connection closed mid-response", None, False),
    ({"reset": True}, "/admin-api/health", "Cannot reach the node at {url}/admin-api/health: the connection was reset",
     None, False),
    ({"down": True}, "/admin-api/health", "Cannot reach the node at {url}/admin-api/health: the node closed the "
     "connection without answering", None, False),
])
def test_error_texts(tmp_path, plain, fault, path, text, status, retryable):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update(fault)
    with pytest.raises(NodeError) as caught:
        client.get(path, params={"context_id": "sekrit"})
    assert str(caught.value) == text.replace("{url}", plain.url)
    assert (caught.value.status, caught.value.retryable) == (status, retryable)


def test_503_from_the_node_is_retryable(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update({"status": 503})
    with pytest.raises(NodeError) as caught:
        client.post("/admin-api/contexts", {"applicationId": "x"})
    assert caught.value.retryable and caught.value.status == 503
    assert str(caught.value).startswith("authority for ")


def test_the_nodes_own_error_text(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/applications/" + "0" * 64)
    assert (str(caught.value), caught.value.status) == ("Application not found", 404)


def test_unauthenticated_call_to_an_auth_node_says_what_to_set(tmp_path, authed):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=authed.url))
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert str(caught.value) == ("HTTP 401 Unauthorized from %s/admin-api/contexts - the node returned no message. "
                                 "%s" % (authed.url, node.auth_advice("none")))


def test_a_failure_is_not_memoised(tmp_path):
    port = closed_port()
    client = Node(credentials_env(tmp_path, type("D", (), {"url": "http://127.0.0.1:%d" % port})))
    with pytest.raises(NodeError) as caught:
        client.health()
    assert str(caught.value).startswith("Cannot reach the node at http://127.0.0.1:%d/auth/token" % port)
    assert client.url is None
    late = sample_double(auth=ADMIN, port=port).start()
    try:
        assert client.get("/admin-api/contexts")["contexts"] and client.url == late.url
    finally:
        late.stop()


def test_discovery_runs_again_until_a_node_appears(tmp_path):
    port = closed_port()
    client = Node(make_env(tmp_path), ports=[port])
    with pytest.raises(NodeError) as caught:
        client.health()
    assert str(caught.value).startswith("No Calimero node found.")
    late = NodeDouble(port=port).start()
    try:
        assert client.health() == {"status": "alive"}
        assert (client.source, client.name, client.url) == ("probe", None, "http://localhost:%d" % port)
    finally:
        late.stop()


def test_status_describes_a_node_that_is_down(tmp_path, plain):
    status = Node(make_env(tmp_path), ports=[closed_port()]).status()
    assert status["health"]["status"] == "unreachable"
    assert status["health"]["error"].startswith("No Calimero node found.")
    assert (status["peers"], status["identity"]) == (None, None)         # never asked of a node not found
    assert (status["url"], status["nodeName"], status["discoverySource"], status["authMode"]) == (
        None, None, None, "none")
    env = make_env(tmp_path, CALIMERO_NODE_URL=plain.url, CALIMERO_NODE_NAME="desk")
    client = Node(env)
    status = client.status()
    assert status.pop("registryNote").startswith("No registry address is known: this server found no node "
                                                 "directory")      # desk has no home here
    assert status == {"health": {"status": "alive"}, "url": plain.url, "nodeName": "desk",
                      "discoverySource": "env", "authMode": "none", "peers": 0, "registry": None,
                      "identity": NODE_ACCOUNT, "publicKey": NODE_PUBLIC_KEY}
    plain.stop()
    down = client.status()["health"]
    assert down == {"status": "unreachable",
                    "error": "Cannot reach the node at %s/admin-api/health: connection refused" % plain.url}


# ── Error kinds: each failure shape raises its NodeError subclass (issue 40) ─────────────────────────

KINDS = (node.NotSent, node.Unreachable, node.NoAnswer, node.AnswerTooLarge, node.UnexpectedAnswer, node.BadRequest,
         node.Unauthorized, node.Forbidden, node.NotFound, node.ServerError)


def kind_of(error):
    """The one kind of ours `error` is (None: a plain NodeError or Refused), checked against the tree's rules: a
    Refused always has a status, nothing else has one, and no error is of two kinds."""
    kinds = [kind for kind in KINDS if isinstance(error, kind)]
    assert len(kinds) <= 1, kinds
    assert isinstance(error, node.Refused) == (error.status is not None), (type(error), error.status)
    return kinds[0] if kinds else None


@pytest.mark.parametrize("fault, method, kind, status", [
    ({"status": 400, "json": {"error": "Invalid context id"}}, "GET", node.BadRequest, 400),
    ({"status": 422, "body": "Failed to deserialize the JSON body"}, "POST", node.BadRequest, 422),
    ({"status": 403, "json": {"error": "node is not a member of group"}}, "GET", node.Forbidden, 403),
    ({"status": 404, "body": ""}, "GET", node.NotFound, 404),
    ({"status": 404, "json": {"error": "Context not found"}}, "POST", node.NotFound, 404),
    ({"status": 409, "json": {"error": "alias already exists"}}, "POST", None, 409),
    ({"status": 429, "body": "slow down"}, "GET", None, 429),
    ({"status": 500}, "GET", node.ServerError, 500),
    ({"status": 502, "json": {"error": "no application published"}}, "POST", node.ServerError, 502),
    ({"status": 503}, "POST", node.ServerError, 503),
    ({"garbage": True}, "GET", node.UnexpectedAnswer, None),
    ({"deep": 300}, "GET", node.UnexpectedAnswer, None),
    ({"truncated": True}, "GET", node.NoAnswer, None),
    ({"truncated": True}, "POST", node.NoAnswer, None),
    ({"down": True}, "GET", node.Unreachable, None),
    ({"reset": True}, "GET", node.Unreachable, None),
    ({"down": True}, "POST", node.NoAnswer, None),
    ({"delay": 1.0}, "GET", node.Unreachable, None),
    ({"delay": 1.0}, "POST", node.NoAnswer, None),
    ({"huge": 2 << 20}, "GET", node.AnswerTooLarge, None),
])
def test_each_failure_shape_is_its_kind(tmp_path, plain, fault, method, kind, status):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url, CALIMERO_MCP_MAX_RESPONSE_BYTES=1 << 20))
    client.get("/admin-api/contexts")        # connected first: on a busy machine a slow connect would read as
    plain.faults.update(dict(fault, paths=["/admin-api/contexts"]))      # "never sent" within the short timeout
    with pytest.raises(NodeError) as caught:
        if method == "GET":
            client.get("/admin-api/contexts", timeout=0.5)
        else:
            client.post("/admin-api/contexts", {"applicationId": "x"}, timeout=0.5)
    assert (kind_of(caught.value), caught.value.status) == (kind, status)
    assert caught.value.retryable == (status in (503, 504))


def test_a_closed_port_and_no_node_found_are_unreachable(tmp_path):
    port = closed_port()
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL="http://127.0.0.1:%d" % port))
    for send in (lambda: client.get("/admin-api/contexts"), lambda: client.post("/admin-api/contexts", {})):
        with pytest.raises(NodeError) as caught:       # a write that never connected was never sent
            send()
        assert kind_of(caught.value) is node.Unreachable
    with pytest.raises(NodeError) as caught:
        Node(make_env(tmp_path), ports=[port]).health()
    assert kind_of(caught.value) is node.Unreachable and str(caught.value).startswith("No Calimero node found.")


def test_auth_refusals_are_their_kinds(tmp_path, authed, plain):
    with pytest.raises(NodeError) as caught:               # no token at all
        Node(make_env(tmp_path, CALIMERO_NODE_URL=authed.url)).get("/admin-api/contexts")
    assert (kind_of(caught.value), caught.value.status) == (node.Unauthorized, 401)
    with pytest.raises(NodeError) as caught:               # a login refused
        Node(make_env(tmp_path, CALIMERO_NODE_URL=authed.url, CALIMERO_USERNAME="admin",
                      CALIMERO_PASSWORD="wrong-guess-99")).get("/admin-api/contexts")
    assert (kind_of(caught.value), caught.value.status) == (node.Unauthorized, 401)
    with pytest.raises(NodeError) as caught:               # a login where the node has no auth service
        Node(credentials_env(tmp_path, plain)).health()
    assert (kind_of(caught.value), caught.value.status) == (node.NotFound, 404)
    env, _, _ = token_env(tmp_path, authed)
    client = Node(env)
    client.get("/admin-api/contexts")
    authed.revoke_all()                                    # the auth guard's 403 (x-auth-error: token_revoked)
    with pytest.raises(NodeError) as caught:
        client.get("/admin-api/contexts")
    assert (kind_of(caught.value), caught.value.status, caught.value.auth_error) == (
        node.Forbidden, 403, "token_revoked")


def test_blob_and_absent_record_refusals_are_their_kinds(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url, CALIMERO_MCP_MAX_RESPONSE_BYTES=1024))
    with pytest.raises(NodeError) as caught:
        client.blob_info("ab" * 32)
    assert kind_of(caught.value) is node.NotFound and str(caught.value) == "Blob %s is not on this node" % ("ab" * 32)
    with pytest.raises(NodeError) as caught:
        client.blob_info("not-a-blob")
    assert kind_of(caught.value) is node.BadRequest and str(caught.value).startswith('"not-a-blob" is not a blob id')
    blob = client.upload_blob(b"x" * 2048)["blobId"]
    with pytest.raises(NodeError) as caught:
        client.download_blob(blob)
    assert kind_of(caught.value) is node.AnswerTooLarge
    # a NotFound or BadRequest is the node's "no such thing" where a method answers None for it
    assert client.context("ab" * 32) is None and client.context("not-an-id") is None
    assert client.application("ab" * 32) is None


def test_a_cancelled_change_and_a_body_too_deep_are_not_sent(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    context = client.get("/admin-api/contexts")["contexts"][0]["id"]
    deep = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    with pytest.raises(NodeError) as caught:
        client.execute(context, "put", {"value": deep})
    assert kind_of(caught.value) is node.NotSent
    cancelled = threading.Event()
    cancelled.set()
    with client.scope(None, cancelled), pytest.raises(NodeError) as caught:
        client.post("/admin-api/contexts", {"applicationId": "x"})
    assert kind_of(caught.value) is node.NotSent and not requests_to(plain, "/jsonrpc")


# ── Requests and JSON-RPC ─────────────────────────────────────────────────────────────────────────

def test_bodies_envelopes_and_put_bytes(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    assert client.health() == {"status": "alive"}
    uploaded = client.put_bytes("/admin-api/blobs", b"hello")
    entry = requests_to(plain, "/admin-api/blobs")[0]
    assert entry["body"] == b"hello" and entry["headers"]["content-type"] == "application/octet-stream"
    deleted = client.delete("/admin-api/blobs/%s" % (uploaded.get("blob_id") or uploaded.get("blobId")))
    assert deleted.get("deleted") is True                  # a flat answer stays as it is
    namespace = client.get("/admin-api/namespaces")[0]["namespaceId"]
    client.delete("/admin-api/namespaces/%s" % namespace, {})
    sent = [e for e in plain.log if e["method"] == "DELETE" and "namespaces" in e["path"]][0]
    assert sent["json"] == {} and sent["headers"]["content-type"] == "application/json"


def test_execute_sends_the_envelope_and_returns_the_output(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    context = client.get("/admin-api/contexts")["contexts"][0]["id"]
    assert client.execute(context, "set", {"key": "k", "value": "v"}) is None
    assert client.execute(context, "get", {"key": "k"}) == "v"
    body = requests_to(plain, "/jsonrpc")[0]["json"]
    assert isinstance(body.pop("id"), int)
    assert body == {"jsonrpc": "2.0", "method": "execute",
                    "params": {"contextId": context, "method": "set", "argsJson": {"key": "k", "value": "v"}}}
    with pytest.raises(NodeError) as caught:
        client.execute(context, "get_result", {"key": "missing"})
    assert str(caught.value) == "key not found: missing"
    with pytest.raises(NodeError) as caught:
        client.execute("f" * 64, "get", {"key": "k"})
    assert str(caught.value) == "Context %s not found on this node (ContextNotFound)" % ("f" * 64)


def test_arguments_too_deep_to_encode_are_not_sent_and_say_so(tmp_path, plain):
    """Arguments json.dumps gives up on are not sent, and the error says so, not "put ran, but its output is
    nested too deeply": nothing reached the node. (The server's nesting limit keeps such arguments from
    reaching node.py; this is its own guard.)"""
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    context = client.get("/admin-api/contexts")["contexts"][0]["id"]
    deep = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    with pytest.raises(NodeError) as caught:
        client.execute(context, "put", {"value": deep})
    assert str(caught.value) == ("put was not sent to the node: its arguments are nested too deeply to encode "
                                 "(more levels than Python's JSON encoder allows)")
    assert not requests_to(plain, "/jsonrpc")
    with pytest.raises(NodeError) as caught:
        client.post("/admin-api/contexts", {"x": deep})
    assert str(caught.value).startswith("POST /admin-api/contexts was not sent: its body is nested too deeply")


def byte_list(text):
    return "the method call returned an error: [%s]" % ", ".join(str(b) for b in text.encode("utf-8"))


@pytest.mark.parametrize("error, text, retryable", [
    ({"type": "FunctionCallError", "data": byte_list('"boom"')}, "boom", False),
    ({"type": "FunctionCallError", "data": byte_list('{"kind": "NotFound", "data": "k"}')},
     '{"kind":"NotFound","data":"k"}', False),
    ({"type": "FunctionCallError", "data": byte_list("plain words é")}, "plain words é", False),
    ({"type": "FunctionCallError", "data": "guest panicked: key not found at src/lib.rs:1:2 "},
     "guest panicked: key not found at src/lib.rs:1:2", False),
    ({"type": "FunctionCallError", "data": 'method "nope" not found'}, 'method "nope" not found', False),
    ({"type": "FunctionCallError", "data": "returned an error: [300, 1]"},
     'FunctionCallError: "returned an error: [300, 1]"', False),
    ({"type": "ContextNotFound"}, "Context ctx-1 not found on this node (ContextNotFound)", False),
    ({"type": "UpgradeInProgress", "data": {"group_id": [1, 2]}},
     'Context ctx-1 is being upgraded: writes fail until it finishes, reads still work (UpgradeInProgress): '
     '{"group_id":[1,2]}', True),
    ({"type": "SerdeError", "data": {"message": "trailing characters"}},
     "Method get returned a value that is not JSON (SerdeError): trailing characters", False),
    ({"type": "InternalError", "data": {}}, "The node failed internally while running get (InternalError)", False),
    ({"type": "Mystery", "data": "odd"}, "Mystery: odd", False),
    ({"code": -32601, "message": "Method not found"}, "JSON-RPC error -32601: Method not found", False),
])
def test_json_rpc_errors_read_like_sentences(error, text, retryable):
    rendered = node.rpc_error(error, "ctx-1", "get")
    assert (str(rendered), rendered.retryable, rendered.status) == (text, retryable, None)


def test_unwrap_only_unwraps_a_data_object():
    assert mero_node_http.unwrap({"data": {"apps": []}}) == {"apps": []}
    assert mero_node_http.unwrap({"data": None, "error": None}) is None
    assert mero_node_http.unwrap({"members": [], "selfIdentity": "x"}) == {"members": [], "selfIdentity": "x"}
    assert mero_node_http.unwrap([{"data": 1}]) == [{"data": 1}]


def test_importing_node_does_not_import_requests(tmp_path):
    script = ("import sys, node\nn = node.Node({'CALIMERO_NODE_URL': 'http://localhost:9'})\n"
              "with n.traced('x'):\n    pass\nprint('requests' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], cwd=str(ROOT), capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "False", out.stderr


# ── The admin API: one method per operation, every answer's shape checked (node-api §3, §0.5) ────

SURPRISE = {"json": {"data": "surprise"}}


def by_package(apps):
    return {app["package"]: app for app in apps}


def test_only_node_py_knows_the_node_paths():
    """The admin API lives in node.py: the server's tool handlers hold no path and read no answer shape."""
    source = (ROOT / "mero_mcp.py").read_text(encoding="utf-8")
    for path in ('"/admin-api', '"/auth/', "'/admin-api", "'/auth/", "/jsonrpc"):
        assert path not in source, path
    for shape_reading in ("as_object(", "isinstance(page, list)", '.get("apps"', '.get("contexts"'):
        assert shape_reading not in source, shape_reading


def test_admin_api_reads_return_what_they_promise(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    assert client.health() == {"status": "alive"}
    apps = by_package(client.applications())
    kv = apps["com.calimero.kv-store"]
    assert set(apps) == {"com.calimero.kv-store", "com.example.counter"}
    assert client.application(kv["id"])["id"] == kv["id"]
    assert client.application("0" * 64) is None                    # 404: no such application
    assert client.abi(kv["id"])["schema_version"] == "wasm-abi/1"
    contexts = client.contexts()
    assert [c["id"] for c in client.contexts_of(kv["id"])] == [c["id"] for c in contexts]
    assert client.context(contexts[0]["id"])["applicationId"] == kv["id"]
    assert client.context("0" * 64) is None and client.context("not-an-id") is None
    assert client.lookup_alias("demo") == contexts[0]["id"]
    assert client.lookup_alias("nope") is None and client.lookup_alias("no such alias!") is None
    assert [n["name"] for n in client.namespaces()] == ["demo-team"]
    asked = [e["query"] for e in requests_to(plain, "/admin-api/namespaces")]
    assert asked == [{"offset": "0", "limit": "1000"}]
    assert client.context_aliases() == {"demo": contexts[0]["id"]}
    plain.alias_rows = True                  # one branch answers [{alias, value}] rows (node-api §0.6)
    assert client.context_aliases() == {"demo": contexts[0]["id"]}
    namespace = client.namespaces()[0]["namespaceId"]
    team = plain.add_group(namespace=namespace, name="team")
    deep = plain.add_group(parent=team)
    assert client.namespace_groups(namespace) == [{"groupId": team, "name": "team"}]
    assert client.subgroups(team) == [{"groupId": deep}]
    assert client.groups_in(namespace) == [{"groupId": team, "name": "team", "parentId": namespace},
                                           {"groupId": deep, "parentId": team}]


def test_an_alias_is_deleted_and_a_miss_is_no_failure(tmp_path, plain):
    """The node's delete is idempotent (node-api §0.6): the server looks an alias up first to tell a miss."""
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    client.delete_alias("demo")
    assert client.lookup_alias("demo") is None and client.context_aliases() == {}
    client.delete_alias("demo")


def test_admin_api_writes_send_their_bodies(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    blob = client.upload_blob(b"hello")
    assert blob == {"blobId": hashlib.sha256(b"hello").hexdigest(), "size": 5}      # camelCase, whatever the node
    assert blob in client.blobs()
    assert client.delete_blob(blob["blobId"]) == {"blobId": blob["blobId"], "deleted": True}
    namespace = client.namespaces()[0]["namespaceId"]
    group = client.create_group(namespace, "crew", "open")
    nested = client.create_nested_group(group, "inner")
    assert requests_to(plain, "/admin-api/groups")[-1]["json"] == {
        "applicationId": plain._app_key("com.calimero.kv-store"), "name": "inner", "parentGroupId": group}
    client.set_group_visibility(nested, "open")
    client.set_group_metadata(group, "named", {"k": "v"})
    assert client.group_metadata(group)["name"] == "named" and client.group_metadata(nested) is None
    client.add_group_members(group, [{"identity": "a" * 64, "role": "Member"}])
    assert {"identity": "a" * 64, "role": "Member"} in client.group_members(group)["members"]
    assert client.delete_namespace(namespace) == {"isDeleted": True}


def test_a_wrong_shaped_answer_names_the_operation_and_quotes_the_body(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update(SURPRISE)
    with pytest.raises(node.UnexpectedAnswer) as caught:
        client.applications()
    assert str(caught.value) == ('The node answered GET /admin-api/applications with an unexpected body (expected an '
                                 'object with an "apps" list): {"data":"surprise"}')
    assert caught.value.hint == ("Retry; if this keeps happening, check that %s is a Calimero node (merod) and read "
                                 "its log." % plain.url)


@pytest.mark.parametrize("answer, expected", [
    ({"data": {"apps": [{"id": "x"}, 1, "two"]}}, 'an object with an "apps" list of objects, each with an "id" string'),
    ({"data": {"apps": [{"package": "no id"}]}}, 'an object with an "apps" list of objects, each with an "id" string'),
    ({"data": [{"id": "x"}]}, 'an object with an "apps" list'),
    ({"apps": None}, 'an object with an "apps" list'),
])
def test_rows_and_their_ids_are_checked(tmp_path, plain, answer, expected):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update({"json": answer})
    with pytest.raises(node.UnexpectedAnswer) as caught:
        client.applications()
    assert "(expected %s): %s" % (expected, json.dumps(answer, separators=(",", ":"))) in str(caught.value)


KV_ID = sample_double()._app_key("com.calimero.kv-store")
ANY_ID = "ab" * 32
OPERATIONS = [   # (what the client calls, the request it makes, what the answer should have been)
    (lambda c: c.health(), "GET /admin-api/health", 'an object with a "status" string'),
    (lambda c: c.application(KV_ID), "GET /admin-api/applications/" + KV_ID,
     'an object whose "application" is an object with an "id" string, or null'),
    (lambda c: c.abi(KV_ID), "GET /admin-api/applications/%s/abi" % KV_ID, "an object"),
    (lambda c: c.install_application("com.x", "1.0.0"), "POST /admin-api/install-application",
     'an object with an "applicationId" string'),
    (lambda c: c.uninstall_application(KV_ID), "DELETE /admin-api/applications/" + KV_ID,
     'an object with an "applicationId" string'),
    (lambda c: c.contexts(), "GET /admin-api/contexts", 'an object with a "contexts" list'),
    (lambda c: c.contexts_of(KV_ID), "GET /admin-api/contexts/for-application/" + KV_ID,
     'an object with a "contexts" list'),
    (lambda c: c.context(ANY_ID), "GET /admin-api/contexts/" + ANY_ID, 'an object with an "id" string'),
    (lambda c: c.create_context(KV_ID, ANY_ID, []), "POST /admin-api/contexts", 'an object with a "contextId" string'),
    (lambda c: c.join_context(ANY_ID), "POST /admin-api/contexts/%s/join" % ANY_ID,
     'an object with a "contextId" string'),
    (lambda c: c.delete_context(ANY_ID), "DELETE /admin-api/contexts/" + ANY_ID, 'an object with an "isDeleted" boolean'),
    (lambda c: c.create_alias("a", ANY_ID), "POST /admin-api/alias/create/context", "an object or null"),
    (lambda c: c.lookup_alias("demo"), "POST /admin-api/alias/lookup/context/demo",
     'an object with a "value" string or null'),
    (lambda c: c.context_aliases(), "GET /admin-api/alias/list/context",
     'an object mapping each alias to its context id, or a list of {"alias", "value"} rows'),
    (lambda c: c.delete_alias("demo"), "POST /admin-api/alias/delete/context/demo", "an object or null"),
    (lambda c: c.upload_blob(b"x"), "PUT /admin-api/blobs", 'an object with a "blob_id" string'),
    (lambda c: c.blobs(), "GET /admin-api/blobs", 'an object with a "blobs" list'),
    (lambda c: c.delete_blob(ANY_ID), "DELETE /admin-api/blobs/" + ANY_ID, 'an object with a "blob_id" string'),
    (lambda c: c.namespaces(), "GET /admin-api/namespaces", "a list"),
    (lambda c: c.create_namespace(KV_ID), "POST /admin-api/namespaces", 'an object with a "namespaceId" string'),
    (lambda c: c.delete_namespace(ANY_ID), "DELETE /admin-api/namespaces/" + ANY_ID,
     'an object with an "isDeleted" boolean'),
    (lambda c: c.invite_to_namespace(ANY_ID), "POST /admin-api/namespaces/%s/invite" % ANY_ID,
     'a signed invitation: an object with "inviter_signature", bare or as its "invitation"'),
    (lambda c: c.join_namespace(ANY_ID, {}), "POST /admin-api/namespaces/%s/join" % ANY_ID,
     'an object with a "namespaceId" string'),
    (lambda c: c.leave_namespace(ANY_ID), "POST /admin-api/namespaces/%s/leave" % ANY_ID, "an object or null"),
    (lambda c: c.namespace_groups(ANY_ID), "GET /admin-api/namespaces/%s/groups" % ANY_ID, "a list"),
    (lambda c: c.subgroups(ANY_ID), "GET /admin-api/groups/%s/subgroups" % ANY_ID, 'an object with a "subgroups" list'),
    (lambda c: c.create_group(ANY_ID, None, "open"), "POST /admin-api/namespaces/%s/groups" % ANY_ID,
     'an object with a "groupId" string'),
    (lambda c: c.create_nested_group(ANY_ID), "GET /admin-api/groups/" + ANY_ID,
     'an object with a "targetApplicationId" string'),
    (lambda c: c.group_members(ANY_ID), "GET /admin-api/groups/%s/members" % ANY_ID, 'an object with a "members" list'),
    (lambda c: c.add_group_members(ANY_ID, []), "POST /admin-api/groups/%s/members" % ANY_ID, "an object or null"),
    (lambda c: c.group_metadata(ANY_ID), "GET /admin-api/groups/%s/metadata" % ANY_ID, "an object or null"),
    (lambda c: c.set_group_metadata(ANY_ID, None, {}), "PUT /admin-api/groups/%s/metadata" % ANY_ID,
     "an object or null"),
    (lambda c: c.set_group_visibility(ANY_ID, "open"),
     "PUT /admin-api/groups/%s/settings/subgroup-visibility" % ANY_ID, "an object or null"),
    (lambda c: c.join_open_group(ANY_ID), "POST /admin-api/groups/%s/join-via-inheritance" % ANY_ID,
     'an object with a "groupId" string'),
]


@pytest.mark.parametrize("operation, request_line, expected", OPERATIONS, ids=[o[1] for o in OPERATIONS])
def test_every_operation_checks_its_answer(tmp_path, plain, operation, request_line, expected):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update(SURPRISE)
    with pytest.raises(node.UnexpectedAnswer) as caught:
        operation(client)
    assert str(caught.value) == 'The node answered %s with an unexpected body (expected %s): {"data":"surprise"}' % (
        request_line, expected)
    writes = not request_line.startswith("GET ")
    assert ("may have carried it out anyway" in caught.value.hint) is writes


def test_an_excerpt_is_one_line_of_300_characters_and_an_empty_body_says_so(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    plain.faults.update({"status": 200, "body": '{"data":\n  {"apps": "%s"}}' % ("x" * 400)})
    with pytest.raises(node.UnexpectedAnswer) as caught:
        client.applications()
    excerpt = str(caught.value).split("list): ", 1)[1]
    assert excerpt == ('{"data": {"apps": "%s"}}' % ("x" * 400))[:300] and "\n" not in str(caught.value)
    plain.faults.update({"status": 200, "body": ""})
    with pytest.raises(node.UnexpectedAnswer) as caught:
        client.health()
    assert str(caught.value) == ('The node answered GET /admin-api/health with an empty body (expected an object '
                                 'with a "status" string)')


def test_an_echoing_proxy_never_gets_our_token_into_a_message(tmp_path, authed):
    env, access, refresh = token_env(tmp_path, authed)
    client = Node(env)
    authed.faults.update({"json": {"headers": {"Authorization": "Bearer " + access}, "refresh": refresh}})
    with pytest.raises(node.UnexpectedAnswer) as caught:
        client.applications()
    assert access not in str(caught.value) and refresh not in str(caught.value)
    assert '"Authorization":"Bearer [redacted]"' in str(caught.value)


def test_creation_retries_with_upgrade_policy_only_when_an_older_node_asks(tmp_path):
    with sample_double(legacy_upgrade_policy=True) as old:
        client = Node(make_env(tmp_path, CALIMERO_NODE_URL=old.url))
        created = client.create_namespace(old._app_key("com.calimero.kv-store"), name="again")
        assert created["namespaceId"] in [n["namespaceId"] for n in client.namespaces()]
        sent = [e["json"] for e in requests_to(old, "/admin-api/namespaces") if e["method"] == "POST"]
        assert sent == [{"applicationId": old._app_key("com.calimero.kv-store"), "name": "again"},
                        {"upgradePolicy": "LazyOnAccess", "applicationId": old._app_key("com.calimero.kv-store"),
                         "name": "again"}]


def test_group_members_reads_every_page(tmp_path, plain):
    client = Node(make_env(tmp_path, CALIMERO_NODE_URL=plain.url))
    namespace = client.namespaces()[0]["namespaceId"]
    accounts = ["%064x" % n for n in range(1, 1502)]
    client.add_group_members(namespace, [{"identity": a, "role": "Member"} for a in accounts])
    members = client.group_members(namespace)["members"]
    assert {m["identity"] for m in members} >= set(accounts) and len(members) == len(accounts) + 1
    asked = [e["query"]["offset"] for e in requests_to(plain, "/admin-api/groups/%s/members" % namespace)
             if e["method"] == "GET"]
    assert asked == ["0", "1000"]


# ── check (`mero-mcp --check`) ───────────────────────────────────────────────────────────────────

def multi_service_spec():
    handle_taker = dict(COUNTER_MANIFEST, methods=COUNTER_MANIFEST["methods"] + [
        {"name": "adopt", "params": [{"name": "app_handle", "type": {"kind": "string"}}],
         "returns": {"kind": "unit"}}])
    return {"package": "com.example.duo", "version": "2.0.0", "signer_id": "did:key:z6Mkduo",
            "metadata": {"name": "Duo"}, "services": {"api": handle_taker, "worker": COUNTER_MANIFEST}}


def test_check_against_a_healthy_node(tmp_path, authed, capsys):
    pytest.importorskip("abi")
    authed.add_app(multi_service_spec())
    out = io.StringIO()
    assert node.check(credentials_env(tmp_path, authed), out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "mero-mcp --check"
    assert "Node:      %s, found by CALIMERO_NODE_URL (name: none)" % authed.url in lines
    assert "Auth:      credentials (CALIMERO_USERNAME + password)" in lines
    assert "Health:    alive" in lines
    assert "Apps:      3 installed" in lines
    assert "  - com.calimero.kv-store 1.0.0: 9 tools" in lines
    assert "  - com.example.counter 0.1.0: 2 tools" in lines
    assert "  - com.example.duo 2.0.0: api: 2 tools, worker: 2 tools" in lines
    assert lines[-1] == "Result:    OK, the server can work with this node."
    abi_calls = [e["query"] for e in authed.log if e["path"].endswith("/abi")]
    assert {"service_name": "api"} in abi_calls and {"service_name": "worker"} in abi_calls
    assert capsys.readouterr().out == ""


def test_check_without_a_node(tmp_path):
    out = io.StringIO()
    env = make_env(tmp_path)
    assert node.check(env, out, ports=[closed_port()]) == 1
    text = out.getvalue()
    assert "Node:      none: No Calimero node found." in text
    assert "Auth:      none (no credentials set; fine for a node that runs without auth)" in text
    assert "    Fix: Start a node (Calimero desktop app, or `merod --node <name> run`)" in text
    assert text.rstrip().endswith("until the problems above are fixed.")


def test_check_when_the_node_refuses_us(tmp_path, authed):
    out = io.StringIO()
    assert node.check(make_env(tmp_path, CALIMERO_NODE_URL=authed.url), out) == 1
    text = out.getvalue()
    assert "Health:    alive" in text
    assert "Apps:      failed: HTTP 401 Unauthorized from %s/admin-api/applications" % authed.url in text
    assert "    Fix: %s" % node.auth_advice("none") in text


def test_check_reports_an_ignored_handoff_and_a_missing_abi_route(tmp_path, plain):
    pytest.importorskip("abi")
    env = make_env(tmp_path, CALIMERO_NODE_URL=plain.url)
    path = write_handoff(env, {"nodeUrl": "https://10.0.0.5", "accessToken": "t"})
    plain.faults.update({"status": 404, "body": "", "paths": ["/admin-api/applications/"]})
    out = io.StringIO()
    assert node.check(env, out) == 0                 # the server still works, with fewer tools
    text = out.getvalue()
    assert "Handoff:   ignored: %s points at https://10.0.0.5, which is not a local node" % path in text
    assert "  - com.calimero.kv-store 1.0.0: no tools (ABI unavailable)" in text
    assert "    Fix: Upgrade merod to a release with the ABI endpoint." in text


def test_userinfo_never_shows_even_in_a_url_that_cannot_be_parsed(tmp_path):
    env = make_env(tmp_path, CALIMERO_NODE_URL="http://admin:s3cret@localhost:99999/x?token=abc")
    with pytest.raises(NodeError) as caught:
        Node(env).health()
    assert "s3cret" not in str(caught.value) and "abc" not in str(caught.value) and "admin" not in str(caught.value)


def test_a_token_cache_that_cannot_be_written_is_an_error(tmp_path, authed):
    """A rotated refresh token only this process knew would be replayed by the next one (§1.2)."""
    state = tmp_path / "state"
    state.write_text("a file where the state directory should be")       # unwritable even for root
    env, access, refresh = token_env(tmp_path, authed, CALIMERO_MCP_STATE_DIR=state)
    with pytest.raises(NodeError) as caught:
        Node(env).health()
    assert str(caught.value).startswith("Cannot save tokens to ")
