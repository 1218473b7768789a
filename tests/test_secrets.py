"""No secret ever leaves where it belongs (reference-behaviour.md §1.2, §1.4, §6).

Whole sessions against a node double in embedded-auth mode, once with CALIMERO_AUTH_TOKEN +
CALIMERO_REFRESH_TOKEN and once with CALIMERO_USERNAME + CALIMERO_PASSWORD, through a token refresh and a
revocation, then `--check`: no access token, refresh token or password may appear on stdout, on stderr, in any
error text, or in any file under HOME or the state dir other than the `tokens-*.json` cache, which is 0600 in
a 0700 directory.
"""
from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time

import pytest

from mcp_client import SERVER, McpServer, minimal_env
from node_double import sample_double

PASSWORD = 'pw-%s-"quoted"\\slash-é' % secrets.token_hex(8)


@pytest.fixture
def authed():
    node = sample_double(auth={"users": {"admin": PASSWORD}}).start()
    minted = []
    mint = node._auth.mint_pair

    def recording(*args, **kwargs):            # every token the node ever hands out is a secret to look for
        pair = mint(*args, **kwargs)
        minted.extend(pair)
        return pair
    node._auth.mint_pair = recording
    node.minted = minted
    yield node
    node.stop()


def secret_forms(secret):
    """The secret as written, and as it looks inside a JSON string; a JWT's payload and signature on their own."""
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    parts = secret.split(".")
    if len(parts) == 3:
        forms.update(part for part in parts[1:] if len(part) >= 16)
    return forms


def assert_nowhere(secrets_, places):
    for secret in secrets_:
        for form in secret_forms(secret):
            for where, text in places.items():
                assert form not in text, "a secret (%s...) leaked into %s" % (form[:6], where)


def files_under(*roots):
    found = []
    for root in roots:
        for folder, _, names in os.walk(root):
            found.extend(os.path.join(folder, name) for name in names)
    return found


def check_store(home):
    """The token cache: 0600 files in a 0700 directory; every other file checked for secrets separately."""
    caches = [path for path in files_under(home) if os.path.basename(path).startswith("tokens-")
              and path.endswith(".json")]
    for path in caches:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700, os.path.dirname(path)
    return caches


def other_files(home):
    contents = {}
    for path in files_under(home):
        name = os.path.basename(path)
        if name.startswith("tokens-") and name.endswith(".json"):
            continue
        with open(path, "rb") as handle:
            contents[path] = handle.read().decode("utf-8", "replace")
    return contents


def run_check(env):
    out = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                         timeout=60)
    return out.stdout + out.stderr


def session(env, double, mode):
    """select_app, generated calls, a failing call, node_status, a forced refresh, a revocation."""
    server = McpServer(env)
    outputs = {}
    try:
        server.initialize()
        deadline = time.monotonic() + 20
        while "kv_store_set" not in server.tool_names():
            assert time.monotonic() < deadline, server.stderr
            time.sleep(0.1)
        handle = server.call_tool("select_app", {"app": "kv-store", "context": "demo"})["structuredContent"]["app_handle"]
        stored = server.call_tool("kv_store_set", {"app_handle": handle, "key": "k", "value": "v"})["content"]
        assert stored[0] == {"type": "text", "text": "null"} and stored[1]["text"].startswith("set ran in context ")
        failing = server.call_tool("kv_store_get_result", {"app_handle": handle, "key": "missing"})
        assert failing.get("isError") is True and "key not found: missing" in failing["content"][-1]["text"]
        refused = server.call_tool("call", {"app": "kv-store", "context": "nope", "method": "len"})
        assert refused.get("isError") is True
        status = server.tool_json("node_status")
        assert status["authMode"] == mode and status["health"] == {"status": "alive"}
        outputs["--check (valid tokens)"] = run_check(env)

        refreshes = double.refresh_count
        double.expire_access_tokens()
        got = server.call_tool("kv_store_get", {"app_handle": handle, "key": "k"})
        assert got.get("structuredContent") == {"result": "v"}, got
        assert double.refresh_count == refreshes + 1, "the expired token was not refreshed"
        assert check_store(env["HOME"]), "no token cache was written"

        double.revoke_all()
        after = server.call_tool("kv_store_len", {"app_handle": handle})
        if mode == "token":           # nothing to recover with: a clear error that says what to set
            assert after.get("isError") is True, after
            text = after["content"][-1]["text"]
            assert "Authentication revoked (token_revoked)" in text and "CALIMERO_AUTH_TOKEN" in text, text
            assert server.call_tool("list_applications").get("isError") is True
        else:                         # credentials log in again
            assert after.get("structuredContent") == {"result": 1}, after
            assert not server.call_tool("list_applications").get("isError")
        outputs["--check (after revocation)"] = run_check(env)
    finally:
        server.close()
    server.assert_stdout_pure()
    outputs["stdout"] = b"".join(server.raw_lines).decode("utf-8")
    outputs["stderr"] = server.stderr
    return outputs


def assert_no_leak(env, double, outputs, injected):
    secrets_ = set(double.minted) | set(injected) | {PASSWORD}
    assert len(double.minted) >= 2, "the double minted no tokens: nothing was tested"
    places = dict(outputs)
    places.update(other_files(env["HOME"]))
    assert_nowhere(secrets_, places)
    check_store(env["HOME"])
    assert not [p for p in files_under(env["HOME"]) if p.endswith(".tmp")], "a half-written file was left"


def test_token_mode_session_leaks_nothing(tmp_path, authed):
    access, refresh = authed.issue_tokens()
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_AUTH_TOKEN": access, "CALIMERO_REFRESH_TOKEN": refresh})
    outputs = session(env, authed, "token")
    assert_no_leak(env, authed, outputs, [access, refresh])


def test_credentials_session_leaks_nothing(tmp_path, authed):
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_USERNAME": "admin", "CALIMERO_PASSWORD": PASSWORD})
    outputs = session(env, authed, "credentials")
    assert_no_leak(env, authed, outputs, [])
    assert "logging in again as admin" in outputs["stderr"]


def test_wrong_password_error_leaks_nothing(tmp_path, authed):
    wrong = PASSWORD + "-wrong"
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_USERNAME": "admin", "CALIMERO_PASSWORD": wrong})
    server = McpServer(env)
    try:
        server.initialize()
        result = server.call_tool("list_applications")
        assert result.get("isError") is True and "Authentication failed" in result["content"][-1]["text"], result
        status = server.tool_json("node_status")
        # the node answered (HTTP 401 to the login): "error", not "unreachable", and the reason in its words
        assert status["health"]["status"] == "error", status
        assert status["health"]["error"].startswith("Authentication failed"), status
    finally:
        server.close()
    places = {"stdout": b"".join(server.raw_lines).decode("utf-8"), "stderr": server.stderr,
              "--check": run_check(env)}
    places.update(other_files(env["HOME"]))
    assert_nowhere({wrong, PASSWORD}, places)


def test_a_refusal_echoing_our_secrets_quotes_none_of_them(tmp_path, authed):
    """A proxy's error page may echo the request: the login body (its password JSON-escaped) on POST /auth/token,
    the bearer token on an admin route. The node's words are quoted, our secrets never."""
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_USERNAME": "admin", "CALIMERO_PASSWORD": PASSWORD})
    login = json.dumps({"username": "admin", "password": PASSWORD})
    authed.faults.update({"status": 400, "body": "bad request: " + login, "paths": ["/auth/token"], "times": 1})
    server = McpServer(env)
    texts = []
    try:
        server.initialize()
        texts.append(server.call_tool("list_namespaces")["content"][-1]["text"])   # or the catalog's login meets it
        assert not server.call_tool("list_namespaces").get("isError")              # logged in now
        echoed = 'bad request: {"username": "admin", "password": "[redacted]"}'
        deadline = time.monotonic() + 10                # the catalog logs its failure on its own thread
        while echoed not in texts[0] + server.stderr:
            assert time.monotonic() < deadline, texts[0] + server.stderr
            time.sleep(0.05)
        access, refresh = authed.minted[-2:]
        for status in (400, 403, 500, 502):
            authed.faults.update({"status": status, "paths": ["/admin-api/namespaces"], "times": 1,
                                  "body": "echo: Authorization: Bearer %s %s %s" % (access, refresh, login)})
            texts.append(server.call_tool("list_namespaces")["content"][-1]["text"])
            assert "echo: Authorization: Bearer [redacted] [redacted] " in texts[-1], texts[-1]
    finally:
        server.close()
    places = {"results": "\n".join(texts), "stderr": server.stderr,
              "stdout": b"".join(server.raw_lines).decode("utf-8")}
    assert_nowhere(set(authed.minted) | {PASSWORD}, places)


URL_SECRET = "url-secret-%s" % secrets.token_hex(6)


@pytest.mark.parametrize("form", ["http://admin:{secret}@127.0.0.1:{port}", "http://127.0.0.1:{port}/?token={secret}",
                                  "http://127.0.0.1:{port}/#{secret}", "http://admin:p/w?x#{secret}@127.0.0.1:{port}"])
def test_a_node_url_carrying_credentials_is_refused_and_never_shown(tmp_path, form):
    """CALIMERO_NODE_URL with userinfo, a query or a fragment: refused at start, named by what it carries, and the
    secret appears nowhere - not in node_status, list_nodes, a tool error, --check or stderr - and is never sent."""
    double = sample_double().start()
    url = form.format(secret=URL_SECRET, port=double.port)
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state"})
    server = McpServer(env)
    try:
        server.initialize()
        status = server.tool_json("node_status")
        nodes = server.tool_json("list_nodes")["nodes"]
        failed = server.call_tool("list_applications")
    finally:
        server.close()
        double.stop()
    check = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                           timeout=60)
    text = failed["content"][-1]["text"]
    assert failed.get("isError") is True and "CALIMERO_NODE_URL carries " in text, text
    assert "CALIMERO_USERNAME" in text and "CALIMERO_PASSWORD" in text and "CALIMERO_AUTH_TOKEN" in text
    assert status["url"] is None and "CALIMERO_NODE_URL carries" in status["health"]["error"]
    assert all(entry["url"].startswith("http://localhost:") for entry in nodes), nodes
    assert check.returncode == 1 and "CALIMERO_NODE_URL carries" in check.stdout
    assert double.log == [], "a request went to a node whose address carries a secret"
    places = {"stdout": b"".join(server.raw_lines).decode("utf-8"), "stderr": server.stderr,
              "--check": check.stdout + check.stderr}
    assert "CALIMERO_NODE_URL carries" in server.stderr          # said once at start, by the catalog's first read
    for where, output in places.items():
        assert URL_SECRET not in output and "p/w" not in output, where


@pytest.mark.parametrize("variable", ["CALIMERO_PASSWORD", "CALIMERO_PASSWORD_FILE"])
def test_a_password_without_a_username_is_warned_about_once_and_in_check(tmp_path, variable):
    """Without CALIMERO_USERNAME there is no login: today's silence left the agent with "no credentials"."""
    double = sample_double().start()
    secret_file = tmp_path / "password"
    secret_file.write_text(PASSWORD)
    value = PASSWORD if variable == "CALIMERO_PASSWORD" else secret_file
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": double.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_MCP_STATE_DIR": tmp_path / "state", variable: value})
    warning = "%s is set but CALIMERO_USERNAME is not, so there is no login and the password is not used" % variable
    server = McpServer(env)
    try:
        server.initialize()
        assert server.tool_json("node_status")["authMode"] == "none"
        server.tool_json("list_namespaces")
        server.tool_json("node_status")
    finally:
        server.close()
        check = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                               timeout=60)
        double.stop()
    assert server.stderr.count(warning) == 1, server.stderr
    assert "  - %s\n    Fix: Set CALIMERO_USERNAME to the account the password belongs to, or unset the " \
           "password.\n" % warning in check.stdout, check.stdout
    assert check.returncode == 0                      # a warning: the node itself works without auth
    assert_nowhere({PASSWORD}, {"stderr": server.stderr, "stdout": b"".join(server.raw_lines).decode(),
                                "--check": check.stdout + check.stderr})


def encoded_forms(secret):
    """The encodings an echo may use: URL-encoded (two ways), base64 (two alphabets) and every character \\u-escaped."""
    import base64
    from urllib.parse import quote, quote_plus
    raw = secret.encode("utf-8")
    return {quote(secret, safe=""), quote_plus(secret), base64.b64encode(raw).decode().rstrip("="),
            base64.urlsafe_b64encode(raw).decode().rstrip("="), "".join("\\u%04x" % ord(c) for c in secret)}


def test_a_login_refusal_quoting_the_password_encoded_quotes_none_of_it(tmp_path, authed):
    """URL-encoded, base64 or \\u-escaped, the password is quoted by neither the tools nor --check."""
    forms = encoded_forms(PASSWORD) | encoded_forms("admin:" + PASSWORD)
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_USERNAME": "admin", "CALIMERO_PASSWORD": PASSWORD})
    authed.faults.update({"status": 400, "body": "bad request: " + " | ".join(sorted(forms)),
                          "paths": ["/auth/token"]})
    server = McpServer(env)
    try:
        server.initialize()
        text = server.call_tool("list_namespaces")["content"][-1]["text"]
    finally:
        server.close()
    assert text.count("[redacted]") == len(forms), text
    places = {"result": text, "stderr": server.stderr, "--check": run_check(env)}
    assert places["--check"].count("[redacted]") >= len(forms), places["--check"]
    for form in forms | {PASSWORD}:
        for where, said in places.items():
            assert form not in said, "the password (%s...) leaked into %s" % (form[:8], where)


def test_an_execute_error_echoing_the_token_quotes_none_of_it(tmp_path, authed):
    """A JSON-RPC execute error echoing Authorization is redacted, as the admin routes' errors are."""
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_USERNAME": "admin", "CALIMERO_PASSWORD": PASSWORD})
    server = McpServer(env)
    try:
        server.initialize()
        assert not server.call_tool("list_namespaces").get("isError")
        access = authed.minted[-2]
        texts = []
        for error in ({"code": -32000, "message": "echo: Authorization: Bearer %s" % access},
                      {"type": "FunctionCallError", "data": "echo: Bearer %s" % access},
                      {"type": "InternalError", "data": {"header": "Bearer " + access}}):
            authed.faults.update({"json": {"jsonrpc": "2.0", "id": 1, "error": error}, "paths": ["/jsonrpc"],
                                  "times": 1})
            result = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"})
            texts.append(result["content"][-1]["text"])
            assert result["isError"] is True and "[redacted]" in texts[-1], texts[-1]
    finally:
        server.close()
    assert_nowhere(set(authed.minted), {"results": "\n".join(texts), "stderr": server.stderr})


def test_a_refresh_token_read_from_the_shared_cache_is_never_quoted(tmp_path, authed):
    """Another process's login, read from the shared token cache and spent on a refresh the node refuses echoing
    it: that refresh token was never this process's own to begin with, and is redacted all the same."""
    access, refresh = authed.issue_tokens()
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_AUTH_TOKEN": access, "CALIMERO_REFRESH_TOKEN": refresh})
    server = McpServer(env)
    try:
        server.initialize()
        assert not server.call_tool("list_namespaces").get("isError")
        authed.expire_access_tokens()
        assert not server.call_tool("list_namespaces").get("isError")       # refreshed: the cache is written
        [cache] = check_store(env["HOME"])
        other_access, other_refresh = authed.issue_tokens()                  # another process's newer login
        with open(cache, "w") as handle:
            json.dump({"access_token": other_access, "refresh_token": other_refresh, "expires_at": 1000}, handle)
        authed.expire_access_tokens()
        authed.faults.update({"status": 400, "paths": ["/auth/refresh"], "times": 1,
                              "body": "refresh refused: %s" % json.dumps({"refresh_token": other_refresh})})
        refused = server.call_tool("list_namespaces")
        text = refused["content"][-1]["text"]
        assert refused.get("isError") is True and 'refresh refused: {"refresh_token": "[redacted]"}' in text, text
        assert [e for e in authed.log if e["path"] == "/auth/refresh"][-1]["json"]["refresh_token"] == other_refresh
    finally:
        server.close()
    assert_nowhere({other_access, other_refresh, access, refresh},
                   {"result": text, "stderr": server.stderr, "stdout": b"".join(server.raw_lines).decode("utf-8")})


def test_an_answer_quoting_a_sent_secret_is_redacted_by_the_last_guard(tmp_path, authed):
    """An app (or any handler) handing back a token this server sent: the last guard on every answer takes it
    out, from the text and from structuredContent alike."""
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": authed.url, "CALIMERO_NODE_HOME": tmp_path / "nodes",
                                          "CALIMERO_USERNAME": "admin", "CALIMERO_PASSWORD": PASSWORD})
    server = McpServer(env)
    try:
        server.initialize()
        assert not server.call_tool("list_namespaces").get("isError")
        access = authed.minted[-2]
        authed.faults.update({"json": {"jsonrpc": "2.0", "id": 1, "result": {"output": {
            "echo": "Bearer " + access, "password": PASSWORD}}}, "paths": ["/jsonrpc"], "times": 2})
        plain = server.call_tool("call", {"app": "kv-store", "context": "demo", "method": "len"})
        many = server.call_tool("call_many", {"calls": [{"app": "kv-store", "context": "demo", "method": "len"}]})
    finally:
        server.close()
    for result in (plain, many):
        assert not result.get("isError") and "Bearer [redacted]" in result["content"][0]["text"], result
    assert_nowhere({access, PASSWORD}, {"results": json.dumps([plain, many], ensure_ascii=False),
                                        "stderr": server.stderr})
