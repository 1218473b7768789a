"""The local side of authentication, as users' machines have it: the desktop app's handoff file (agent.json), the
token cache (tokens-*.json), its refresh lock, the password file and tokens given in the environment.

Every test runs the real server (or `--check`) as a subprocess against the node double: whatever is on disk or in
the environment, no traceback, a server that keeps answering, a message naming what was wrong, no secret shown.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat

import pytest

from mcp_client import McpServer, minimal_env, run_check
from node_double import sample_double

PASSWORD = "pw-Sekrit-4711"


@pytest.fixture
def authed():
    double = sample_double(auth={"users": {"admin": PASSWORD}}).start()
    yield double
    double.stop()


def local_env(tmp_path, double, **extra):
    """What a host passes, with the state dir and node home under tmp_path and the double as the node."""
    settings = {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                "CALIMERO_NODE_HOME": tmp_path / "nodes"}
    settings.update(extra)
    return minimal_env(tmp_path / "home", settings)


def state_file(env, name):
    directory = env["CALIMERO_MCP_STATE_DIR"]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, name)


def write(path, content):
    with open(path, "wb") as handle:
        handle.write(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def jwt(**claims):
    def part(value):
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return "%s.%s.sig" % (part({"alg": "HS256"}), part(claims))


def session(env):
    """A started server: its node_status answer and the server, whose stdout was pure; the caller closes it."""
    server = McpServer(env)
    server.initialize()
    status = server.call_tool("node_status")
    assert not status.get("isError"), status
    return json.loads(status["content"][-1]["text"]), server


def finished(server):
    server.close()
    server.assert_stdout_pure()
    assert "Traceback" not in server.stderr, server.stderr
    return server.stderr


# ── The handoff file (reference-behaviour.md §1.2) ────────────────────────────────────────────────

def make_fifo(path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this platform")
    os.mkfifo(path)


HANDOFF_NOT_A_FILE = {
    "nested past the decoder's depth": (lambda path: write(path, "[" * 100000 + "]" * 100000), "is not valid JSON"),
    "a directory": (os.mkdir, "is a directory"),
    "a named pipe": (make_fifo, "is not a regular file"),     # reading it would block the server for good
    "larger than a megabyte": (lambda path: write(path, '{"accessToken": "%s"}' % ("a" * (1 << 20))),
                               "is larger than 1024 KB"),
}


@pytest.mark.parametrize("name", sorted(HANDOFF_NOT_A_FILE))
def test_a_handoff_file_that_cannot_be_one_is_ignored_saying_why(tmp_path, double, name):
    make, reason = HANDOFF_NOT_A_FILE[name]
    env = local_env(tmp_path, double)
    path = state_file(env, "agent.json")
    make(path)
    said = "%s %s; ignoring it." % (path, reason)
    done = run_check(env, timeout=30)
    assert "Handoff:   ignored: " + said in done.stdout, done.stdout
    assert done.returncode == 0, done.stdout          # the node is still found through CALIMERO_NODE_URL
    status, server = session(env)
    assert (status["health"], status["authMode"]) == ({"status": "alive"}, "none"), status
    assert not server.call_tool("list_applications").get("isError")
    assert said in finished(server)


@pytest.mark.parametrize("token, reason", [
    ("t\u00f6k\u20acn.x.y", "is empty or holds a space, a line break or a non-ASCII character, which no token has"),
    ("\ud800.x.y", "is empty or holds a space, a line break or a non-ASCII character, which no token has"),
    ("Bearer a.b.c", 'starts with "Bearer " (the word belongs to the header, not the token)'),
])
def test_a_handoff_token_no_header_can_carry_voids_the_file(tmp_path, authed, token, reason):
    env = local_env(tmp_path, authed, CALIMERO_NODE_URL=None)
    path = write(state_file(env, "agent.json"), json.dumps({"nodeUrl": authed.url, "accessToken": token}))
    said = "%s gives an accessToken that %s; ignoring it." % (path, reason)
    done = run_check(env)
    assert "Handoff:   ignored: " + said in done.stdout, done.stdout
    status, server = session(env)
    assert status["authMode"] != "handoff", status
    assert said in finished(server)


def test_a_handoff_file_with_a_byte_order_mark_is_read(tmp_path, double):
    env = local_env(tmp_path, double, CALIMERO_NODE_URL=None)
    write(state_file(env, "agent.json"),
          b"\xef\xbb\xbf" + json.dumps({"nodeUrl": double.url, "accessToken": jwt(iat=1)}).encode())
    status, server = session(env)
    assert (status["discoverySource"], status["authMode"], status["url"]) == ("handoff", "handoff", double.url)
    assert "agent.json" not in finished(server)


# ── The token cache (reference-behaviour.md §1.2) ─────────────────────────────────────────────────

def cache_path_in(directory, url, username="admin"):
    digest = hashlib.sha256(("%s\0%s" % (url, username)).encode()).hexdigest()[:16]
    return os.path.join(directory, "tokens-%s.json" % digest)


def cache_path(env, url, username="admin"):
    return cache_path_in(os.path.dirname(state_file(env, "agent.json")), url, username)


def credentials_env(tmp_path, double, **extra):
    return local_env(tmp_path, double, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD=PASSWORD, **extra)


def assert_fresh_cache(path, double):
    """The cache holds a pair the node minted, in a file only its owner can read."""
    cached = json.loads(open(path, encoding="utf-8").read())
    assert double._auth.decode(cached["access_token"]) is not None, cached
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


CACHE_NOT_READABLE = {
    "nested past the decoder's depth": ("[" * 100000, "is not valid JSON; ignoring it."),
    "an empty access token": (json.dumps({"access_token": "", "refresh_token": "r", "expires_at": 1}),
                              "holds no usable access_token; ignoring it."),
    "a token no header can carry": (json.dumps({"access_token": "t\u00f6k\u20acn", "refresh_token": "r"}),
                                    "holds no usable access_token; ignoring it."),
    "another program's layout": (json.dumps({"accessToken": "a.b.c", "refreshToken": "r", "version": 2}),
                                 "holds no usable access_token; ignoring it."),
}


@pytest.mark.parametrize("name", sorted(CACHE_NOT_READABLE))
def test_a_token_cache_that_cannot_be_read_means_a_fresh_login(tmp_path, authed, name):
    content, said = CACHE_NOT_READABLE[name]
    env = credentials_env(tmp_path, authed)
    path = write(cache_path(env, authed.url), content)
    done = run_check(env)
    assert done.returncode == 0 and said in done.stderr, done.stdout + done.stderr
    write(path, content)
    status, server = session(env)
    assert (status["health"], status["authMode"]) == ({"status": "alive"}, "credentials"), status
    assert not server.call_tool("list_applications").get("isError")
    assert "%s %s" % (path, said) in finished(server)
    assert_fresh_cache(path, authed)


# ── Tokens and passwords in the environment ───────────────────────────────────────────────────────

@pytest.mark.parametrize("token, reason", [
    ("Bearer {token}", 'starts with "Bearer " (the word belongs to the header, not the token)'),
    ("{token}\u20ac", "is empty or holds a space, a line break or a non-ASCII character, which no token has"),
    ("{token}\nsecond line", "is empty or holds a space, a line break or a non-ASCII character, which no token "
                             "has"),
])
def test_an_auth_token_no_header_can_carry_is_refused_naming_the_variable(tmp_path, authed, token, reason):
    access, _ = authed.issue_tokens()
    env = local_env(tmp_path, authed, CALIMERO_AUTH_TOKEN=token.format(token=access))
    said = "CALIMERO_AUTH_TOKEN %s. Set CALIMERO_AUTH_TOKEN to the access token alone, as the node issued it." % reason
    done = run_check(env)
    assert done.returncode == 1 and "Auth:      failed: " + said in done.stdout, done.stdout
    status, server = session(env)
    assert status["health"] == {"status": "unreachable", "error": said}, status
    listed = server.call_tool("list_applications")
    assert listed.get("isError") and said in listed["content"][-1]["text"], listed
    stderr = finished(server)
    for text in (done.stdout, done.stderr, json.dumps(status), json.dumps(listed), stderr):
        assert access.split(".")[1] not in text


# ── Files holding secrets, and servers sharing the state directory ────────────────────────────────

@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_our_files_holding_secrets_are_made_private_again(tmp_path, authed):
    """A cache or handle key left readable by others (an older release, a copy, a restored backup) is made 0600:
    refusing it would only force a new login, and leaving it would leave the admin token readable."""
    env = credentials_env(tmp_path, authed)
    access, refresh = authed.issue_tokens()
    cache = write(cache_path(env, authed.url), json.dumps({"access_token": access, "refresh_token": refresh,
                                                           "expires_at": 4102444800000}))
    key = write(state_file(env, "handle.key"), os.urandom(32))
    for path in (cache, key):
        os.chmod(path, 0o644)
    status, server = session(env)
    assert status["authMode"] == "credentials" and status["health"] == {"status": "alive"}, status
    picked = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})
    assert not picked.get("isError"), picked
    stderr = finished(server)
    for path in (cache, key):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
        assert "%s was readable by other users (mode 644); it is 0600 now" % path in stderr, stderr
    assert json.loads(open(cache).read())["access_token"] == access          # the same login, kept
    assert access.split(".")[1] not in stderr and refresh.split(".")[1] not in stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork to start the processes at one instant")
def test_servers_starting_together_keep_the_one_handle_key_on_disk(tmp_path):
    """Each process must keep the key the file holds, or its handles die with it: three processes create the key
    at the same instant, a hundred times (the old create-then-rename lost about one round in fifteen)."""
    import mero_apps
    import mero_runtime
    mero_runtime.node_module()                     # loaded once here, not in every child
    lost = 0
    for round_ in range(100):
        folder = str(tmp_path / str(round_))
        go_read, go_write = os.pipe()
        children = []
        for _ in range(3):
            key_read, key_write = os.pipe()
            pid = os.fork()
            if pid == 0:                       # the child: wait for the start, then do what a server does
                try:
                    os.read(go_read, 1)
                    os.write(key_write, mero_apps.load_handle_key(folder))
                finally:
                    os._exit(0)
            os.close(key_write)
            children.append((pid, key_read))
        os.write(go_write, b"go!")
        kept = []
        for pid, key_read in children:
            kept.append(os.read(key_read, 64))
            os.close(key_read)
            os.waitpid(pid, 0)
        os.close(go_read)
        os.close(go_write)
        with open(os.path.join(folder, "handle.key"), "rb") as handle:
            on_disk = handle.read()
        lost += any(key != on_disk for key in kept)
    assert lost == 0, "%d of 100 rounds left a process with a key the file does not hold" % lost


# ── The refresh lock (reference-behaviour.md §1.2) ────────────────────────────────────────────────

def dead_pid():
    import subprocess
    import sys
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def expired_session(tmp_path, double):
    """A credentials session whose cached access token the node now calls expired: the next call refreshes it."""
    env = credentials_env(tmp_path, double)
    access, refresh = double.issue_tokens()
    cache = write(cache_path(env, double.url), json.dumps({"access_token": access, "refresh_token": refresh,
                                                           "expires_at": 4102444800000}))
    os.chmod(cache, 0o600)
    status, server = session(env)
    assert status["health"] == {"status": "alive"}, status
    double.expire_access_tokens()
    return env, cache, server


@pytest.mark.parametrize("owner", ["a process that has ended", "a number no pid can be"])
def test_a_lock_left_by_a_crashed_process_is_broken(tmp_path, authed, owner):
    env, cache, server = expired_session(tmp_path, authed)
    write(cache + ".lock", str(dead_pid()) if owner == "a process that has ended" else "9" * 30)
    refreshes = authed.refresh_count
    listed = server.call_tool("list_applications")
    assert not listed.get("isError"), listed
    assert authed.refresh_count == refreshes + 1 and not os.path.exists(cache + ".lock")
    finished(server)
    assert_fresh_cache(cache, authed)


def test_a_lock_that_cannot_be_removed_is_an_error_not_a_hang(tmp_path, authed):
    env, cache, server = expired_session(tmp_path, authed)
    lock = cache + ".lock"
    os.mkdir(lock)                                       # a directory in its place, as old as a stale lock
    os.utime(lock, (1, 1))
    listed = server.call_tool("list_applications", timeout=30)
    text = listed["content"][-1]["text"]
    assert listed.get("isError") and ("The token refresh lock %s is stale but cannot be removed" % lock) in text, text
    assert "Remove %s" % lock in text
    assert not server.call_tool("node_status").get("isError")           # the server keeps answering
    finished(server)


# ── The state directory ───────────────────────────────────────────────────────────────────────────

def test_a_state_directory_that_is_a_file_is_named_and_left_alone(tmp_path, authed):
    env = credentials_env(tmp_path, authed)
    state = write(str(tmp_path / "state"), "not a directory\n")
    os.chmod(state, 0o644)
    said = "Cannot save tokens to %s: %s is a file, not a directory" % (cache_path_in(state, authed.url), state)
    done = run_check(env)
    assert done.returncode == 1 and "Auth:      failed: " + said in done.stdout, done.stdout
    assert "  - The state directory %s is a file, not a directory" % state in done.stdout
    assert "Fix: Point CALIMERO_MCP_STATE_DIR at a directory this user can write" in done.stdout
    server = McpServer(env)
    server.initialize()
    listed = server.call_tool("list_applications")
    assert listed.get("isError") and said in listed["content"][-1]["text"], listed
    finished(server)
    assert open(state).read() == "not a directory\n" and stat.S_IMODE(os.stat(state).st_mode) == 0o644


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_check_says_when_the_handoff_file_is_readable_by_others(tmp_path, double):
    env = local_env(tmp_path, double, CALIMERO_NODE_URL=None)
    path = write(state_file(env, "agent.json"), json.dumps({"nodeUrl": double.url, "accessToken": jwt(iat=1)}))
    os.chmod(path, 0o644)
    done = run_check(env)
    assert done.returncode == 0, done.stdout
    assert "  - %s can be read by other users, and it holds an admin token\n    Fix: chmod 600 %s" % (path, path) \
        in done.stdout, done.stdout
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644                  # the desktop app's file: never changed


@pytest.mark.parametrize("content", [PASSWORD + "\n", PASSWORD + "\r\n", "\ufeff" + PASSWORD + "\r\n"],
                         ids=["newline", "CRLF", "BOM and CRLF"])
def test_a_password_file_as_editors_save_it_logs_in(tmp_path, authed, content):
    write(str(tmp_path / "home-pw"), content)
    os.makedirs(str(tmp_path / "home"), exist_ok=True)
    os.replace(str(tmp_path / "home-pw"), str(tmp_path / "home" / "pw"))
    env = local_env(tmp_path, authed, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD_FILE="~/pw",
                    CALIMERO_MCP_STATE_DIR="~/state")
    os.makedirs(str(tmp_path / "cwd"))
    done = run_check(env, cwd=tmp_path / "cwd")
    assert done.returncode == 0 and "Health:    alive" in done.stdout, done.stdout
    assert os.listdir(str(tmp_path / "cwd")) == []                 # no folder named ~ where it ran
    assert_fresh_cache(cache_path_in(str(tmp_path / "home" / "state"), authed.url), authed)
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork to start the processes at one instant")
def test_servers_logging_in_together_each_save_their_tokens(tmp_path, authed):
    """Four processes log in at the same instant with one empty cache, fifty times: each saves its pair (they
    shared one .tmp name, and about one round in three ended with "Cannot save tokens ...: No such file")."""
    import node
    node._requests()                           # imported once here, not in every child
    failures = []
    for round_ in range(50):
        env = credentials_env(tmp_path / str(round_), authed)
        go_read, go_write = os.pipe()
        children = []
        for _ in range(4):
            said_read, said_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.read(go_read, 1)
                    try:
                        node.Node(env).connect()
                        os.write(said_write, b"ok")
                    except node.NodeError as error:
                        os.write(said_write, str(error).encode("utf-8")[:300])
                finally:
                    os._exit(0)
            os.close(said_write)
            children.append((pid, said_read))
        os.write(go_write, b"go!!")
        for pid, said_read in children:
            said = os.read(said_read, 400)
            os.close(said_read)
            os.waitpid(pid, 0)
            if said != b"ok":
                failures.append(said.decode("utf-8", "replace"))
        os.close(go_read)
        os.close(go_write)
        assert_fresh_cache(cache_path(env, authed.url), authed)
        assert not [name for name in os.listdir(env["CALIMERO_MCP_STATE_DIR"]) if name.endswith(".tmp")]
    assert not failures, failures[:3]


@pytest.mark.parametrize("name", ["/dev/zero", "a two-megabyte file"])
def test_a_password_file_that_holds_no_password_is_refused_without_reading_it_all(tmp_path, authed, name):
    path = name if name.startswith("/") else write(str(tmp_path / "big.log"), "x" * (2 << 20))
    if not os.path.exists(path):
        pytest.skip("%s is absent here" % path)
    env = local_env(tmp_path, authed, CALIMERO_USERNAME="admin", CALIMERO_PASSWORD_FILE=path)
    said = "The file CALIMERO_PASSWORD_FILE names is larger than 1024 KB, which no password is"
    done = run_check(env, timeout=30)
    assert done.returncode == 1 and "Auth:      failed: " + said in done.stdout, done.stdout
    assert not [entry for entry in authed.log if entry["path"] == "/auth/token"]      # nothing sent to the node


def test_check_signs_in_afresh_so_a_cached_token_hides_no_wrong_password(tmp_path, authed):
    """--check said OK for a wrong CALIMERO_PASSWORD while a cached token still worked. It now signs in with the
    credentials every time; the cache stays as it was (a failed sign-in must not spoil it, and a running server may
    hold that pair), and is written only where it held none."""
    env = credentials_env(tmp_path, authed)
    assert run_check(env).returncode == 0
    path = cache_path(env, authed.url)
    cached = open(path, "rb").read()
    wrong = dict(env, CALIMERO_PASSWORD="not-the-password")
    done = run_check(wrong)
    assert done.returncode == 1, done.stdout
    assert "Auth:      failed: " in done.stdout and "Problems:\n  - " in done.stdout, done.stdout
    assert done.stdout.count("\nAuth:") == 1, done.stdout              # the failed login is the one Auth line
    assert "Result:    the server cannot work" in done.stdout
    assert "not-the-password" not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr
    assert open(path, "rb").read() == cached
    status, server = session(wrong)                  # the server itself still starts from the cache
    assert status["authMode"] == "credentials" and status["health"] == {"status": "alive"}, status
    finished(server)
    logins = len(authed.requests_to("POST", "/auth/token"))
    assert run_check(env).returncode == 0
    assert len(authed.requests_to("POST", "/auth/token")) == logins + 1
    assert open(path, "rb").read() == cached
    os.unlink(path)
    assert run_check(wrong).returncode == 1 and not os.path.exists(path)
    assert run_check(env).returncode == 0
    assert_fresh_cache(path, authed)
