"""Shared fixtures: the node double, and the real server started against it over stdio."""
from __future__ import annotations

import contextlib
import fcntl
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent))

from mcp_client import HANDSHAKE_VERSION, McpServer, minimal_env  # noqa: E402

SHARED = TESTS.parents[1] / "shared"
FIXTURES = SHARED / "fixtures"


def shared_fixture(*parts):
    """A file of ../shared/fixtures, or a skip naming what is missing (a plain clone has no ../shared)."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip("%s is absent: the shared fixtures live beside the checkout, not in it" % path)
    return path


NPM_INSTALL_TIMEOUT = 600


def node_with(folder, package, version, min_major=18):
    """The node binary, with `package`@`version` installed from the npm registry into folder/node_modules (as
    folder/package.json and its lock pin it); a skip saying why when node or npm is missing or the install fails."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("%s needs node and npm on PATH (missing: %s)"
                    % (package, ", ".join(name for name, path in (("node", node), ("npm", npm)) if not path)))
    try:
        found = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        major = int(found.lstrip("v").split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        pytest.skip("cannot read the node version: %s" % error)
    if major < min_major:
        pytest.skip("%s %s needs Node %d or newer; found %s" % (package, version, min_major, found))
    # One install at a time into a folder (test workers side by side, another checkout's run sharing the cache: two
    # npm installs in one node_modules leave it without some files), and only one that finished counts.
    with held(install_lock(folder)) as lock:
        if installed_version(folder, package) != version or lock.read_text(encoding="utf-8") != version:
            shutil.rmtree(str(Path(folder, "node_modules")), ignore_errors=True)     # what a cut install left
            command = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"]
            try:
                done = subprocess.run(command, cwd=str(folder), capture_output=True, text=True,
                                      timeout=NPM_INSTALL_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.skip("npm install of %s did not finish within %ss" % (package, NPM_INSTALL_TIMEOUT))
            except OSError as error:
                pytest.skip("npm install could not run: %s" % error)
            if done.returncode != 0:
                pytest.skip("npm install of %s failed (exit %s): %s"
                            % (package, done.returncode, (done.stderr or done.stdout).strip()[-800:]))
            if installed_version(folder, package) != version:
                pytest.skip("npm install finished but node_modules holds %s %r, not %s"
                            % (package, installed_version(folder, package), version))
            lock.write_text(version, encoding="utf-8")
    return node


def install_lock(folder):
    """The lock file of npm installs into `folder`; it holds the version of the last install that finished there."""
    return cache_root() / "locks" / (re.sub(r"[^\w.-]+", "_", str(Path(folder).resolve())).strip("_") + ".lock")


def cache_root():
    """Where tests keep what outlives a run (npm installs, downloaded wheels): outside the checkout."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mero-mcp-tests"


@contextlib.contextmanager
def held(path):
    """An exclusive lock on the file `path` (made if missing) while the block runs; yields the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def npm_cache(source, name):
    """A folder outside the checkout holding copies of source's package.json, lock and scripts, for a client whose
    node_modules is too big to keep in the tree (and carries Python files `make lint` would read)."""
    root = cache_root() / name
    root.mkdir(parents=True, exist_ok=True)
    with held(install_lock(root)):                 # not while node_with installs there
        for item in Path(source).iterdir():
            copy = root / item.name
            if item.is_file() and not (copy.exists() and filecmp.cmp(str(item), str(copy), shallow=False)):
                shutil.copyfile(item, copy)
    return root


def installed_version(folder, package):
    try:
        manifest = Path(folder, "node_modules", *package.split("/"), "package.json")
        return json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None


# The test files whose module- or session-wide fixtures take seconds to make (a venv and pip, an npm install, a Node
# client's session, the pyz build): under pytest-xdist their tests that use one run in one worker, so it is made
# once. Elsewhere such a fixture is cheap (a double of 3,000 rows takes 40 ms) and its tests go wherever a worker is
# free: grouped, test_bounded's would run one after another for two minutes.
COSTLY_SETUP = frozenset({"test_demo", "test_packaging", "test_ts_client", "test_gemini_cli", "test_pyz",
                          "test_release"})


def pytest_itemcollected(item):
    """Under pytest-xdist's --dist loadgroup (`make test`): the tests of a COSTLY_SETUP file that share one of its
    module- or session-wide fixtures go to one worker (an xdist_group); every other test to whichever is free."""
    info, module = getattr(item, "_fixtureinfo", None), getattr(item, "module", None)
    if info is None or module is None or module.__name__ not in COSTLY_SETUP \
            or not item.config.pluginmanager.hasplugin("xdist"):
        return
    if any(definition.scope != "function" and getattr(definition.func, "__module__", None) == module.__name__
           for definitions in info.name2fixturedefs.values() for definition in definitions):
        item.add_marker(pytest.mark.xdist_group(module.__name__))


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

    def start(env, args=(), initialize=HANDSHAKE_VERSION):
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


@pytest.fixture
def serve(start_server, tmp_path):
    """A server against a double of the test's own making (started here once, stopped at the end); `env` adds or
    overrides variables."""
    doubles = []

    def run(double, initialize=HANDSHAKE_VERSION, **env):
        if double not in doubles:
            doubles.append(double.start())
        settings = {"CALIMERO_NODE_URL": double.url, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                    "CALIMERO_NODE_HOME": tmp_path / "nodes"}
        settings.update(env)
        return start_server(minimal_env(tmp_path / "home", settings), initialize=initialize)
    yield run
    for double in doubles:
        double.stop()


# ---- several nodes: a Network of doubles, and a server over named nodes ----

@pytest.fixture
def network():
    from node_double import Network
    with Network(gossip_delay=0.05) as net:
        yield net


@pytest.fixture
def several(start_server, tmp_path):
    """Start a server over named nodes: several(("node1", url), ("node2", url, "ro"), **env)."""
    def run(*nodes, initialize=True, **env):
        entries = ",".join("%s=%s%s" % (n[0], n[1], " (ro)" if len(n) > 2 else "") for n in nodes)
        settings = {"CALIMERO_NODES": entries, "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                    "CALIMERO_NODE_HOME": tmp_path / "nodes"}
        settings.update(env)
        return start_server(minimal_env(tmp_path / "home", settings),
                            **({} if initialize else {"initialize": None}))
    return run
