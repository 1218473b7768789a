"""Shared fixtures: the node double, and the real server started against it over stdio."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent))

from mcp_client import McpServer, minimal_env  # noqa: E402

SHARED = TESTS.parents[1] / "shared"
FIXTURES = SHARED / "fixtures"


def shared_fixture(*parts):
    """A file of ../shared/fixtures, or a skip naming what is missing (a plain clone has no ../shared)."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip("%s is absent: the shared fixtures live beside the checkout, not in it" % path)
    return path


@pytest.fixture
def double():
    from node_double import sample_double
    node = sample_double().start()
    yield node
    node.stop()


@pytest.fixture
def server_env(tmp_path, double):
    """The environment a host gives the server, pointed at the double, with its own state dir."""
    return minimal_env(tmp_path / "home", {
        "CALIMERO_NODE_URL": double.url,
        "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
        "CALIMERO_NODE_HOME": tmp_path / "nodes",
    })


@pytest.fixture
def start_server():
    """Start servers on demand; each is closed at the end and its stdout checked for stray lines."""
    started = []

    def start(env, args=(), initialize="2025-11-25"):
        server = McpServer(env, args)
        started.append(server)
        if initialize:
            server.initialize(initialize)
        return server
    yield start
    for server in started:
        server.close()
        server.assert_stdout_pure()


@pytest.fixture
def server(start_server, server_env):
    return start_server(server_env)
