"""A node that is not on this machine, really reached: the server process resolves the TEST-NET address 192.0.2.10
to a local double (a sitecustomize on its PYTHONPATH rewrites that one address), so what would cross a network
crosses loopback and nothing leaves this machine (issue 41).

The username and password never travel to a node that is not loopback unless it is the default node; the default
node's own token never goes to another node."""
import json
import textwrap

import pytest

from mcp_client import minimal_env
from node_double import sample_double

REMOTE_HOST = "192.0.2.10"          # TEST-NET-1 (RFC 5737): never routed, so a miss could not reach anyone
ADMIN = {"users": {"admin": "dev-password"}}
REDIRECT = textwrap.dedent('''\
    """Test only: %(host)s is this machine (the server under test is told it is a remote node)."""
    import socket
    _real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        return _real("127.0.0.1" if host == "%(host)s" else host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    ''' % {"host": REMOTE_HOST})


@pytest.fixture
def remote():
    """An authed double the server reaches as http://192.0.2.10:<its port>."""
    double = sample_double(auth=ADMIN).start()
    yield double, double.url.replace("127.0.0.1", REMOTE_HOST)
    double.stop()


@pytest.fixture
def redirected(tmp_path):
    folder = tmp_path / "redirect"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(REDIRECT, encoding="utf-8")
    return {"PYTHONPATH": str(folder)}


def password_requests(double):
    return [entry for entry in double.log if entry["path"] == "/auth/token"]


def test_the_redirect_reaches_the_double_and_the_default_remote_node_signs_in(start_server, tmp_path, remote,
                                                                           redirected):
    """The one node, remote and the default: the user's own credentials are for it (the control case: the
    redirect really reaches the double, and a login there is accepted)."""
    double, url = remote
    server = start_server(minimal_env(tmp_path / "home", dict(redirected, CALIMERO_NODE_URL=url,
                                                              CALIMERO_USERNAME="admin",
                                                              CALIMERO_PASSWORD="dev-password",
                                                              CALIMERO_MCP_STATE_DIR=tmp_path / "state")))
    result = server.call_tool("list_contexts")
    assert not result.get("isError"), result
    assert len(password_requests(double)) == 1


def test_a_password_never_travels_to_a_remote_node_that_is_not_the_default(start_server, tmp_path, remote,
                                                                         redirected):
    local = sample_double(auth=ADMIN).start()
    try:
        double, url = remote
        env = minimal_env(tmp_path / "home", dict(
            redirected, CALIMERO_NODES="local=%s,far=%s" % (local.url, url), CALIMERO_USERNAME="admin",
            CALIMERO_PASSWORD="dev-password", CALIMERO_MCP_STATE_DIR=tmp_path / "state",
            CALIMERO_NODE_HOME=tmp_path / "nodes"))
        server = start_server(env)
        near = server.call_tool("list_contexts", {"node": "local"})
        assert not near.get("isError"), near                  # loopback: the credentials sign in there
        far = server.call_tool("list_contexts", {"node": "far"})
        assert far.get("isError"), far                       # the remote node asks for a token it never gets
        assert double.log, "the redirect did not reach the remote double"
        assert password_requests(double) == []
        assert not [entry for entry in double.log if "dev-password" in json.dumps(entry, default=str)]
        assert len(password_requests(local)) == 1
    finally:
        local.stop()
