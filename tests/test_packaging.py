"""`pip install .` gives a `mero-mcp` command (setup.cfg's console script) that serves MCP on stdio; the three
modules travel together."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from mcp_client import ROOT, McpServer, minimal_env, tuned_server

OFFLINE_SIGNS = ("NewConnectionError", "No matching distribution", "Could not find a version", "Temporary failure")


PROJECT_URL = "https://github.com/calimero-network/mero-mcp"
BUILD_LEFTOVERS = ("build", "*.egg-info", "dist")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the `mero-mcp` command, the checkout it was installed from): a fresh venv with a copy of this checkout
    installed (without requests/jsonschema: --no-deps)."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(home)
    copy = checkout_copy(tmp_path_factory)
    pip = subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                          "--disable-pip-version-check", str(copy)],
                         capture_output=True, text=True, timeout=300)
    if pip.returncode != 0 and any(sign in pip.stdout + pip.stderr for sign in OFFLINE_SIGNS):
        pytest.skip("the package index is out of reach, so the build backend cannot be fetched")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return home / "bin" / "mero-mcp", copy


@pytest.fixture(scope="module")
def installed(built):
    return built[0]


def checkout_copy(tmp_path_factory):
    """The checkout's files as a clone has them, without what an earlier build left in this one."""
    import shutil
    copy = tmp_path_factory.mktemp("checkout") / "mero-mcp"
    shutil.copytree(str(ROOT), str(copy), ignore=shutil.ignore_patterns(
        ".git", ".venv", ".venv-oldest", "node_modules", "__pycache__", ".pytest_cache", *BUILD_LEFTOVERS))
    return copy


def test_pip_install_leaves_nothing_in_the_checkout(built):
    """setup.py builds in a scratch folder it removes: the checkout gets no build/ or *.egg-info."""
    copy = built[1]
    assert (copy / "setup.cfg").is_file(), copy
    left = sorted(str(path.relative_to(copy)) for pattern in BUILD_LEFTOVERS for path in copy.glob(pattern))
    assert left == [], left


def test_the_package_names_its_project_and_help_says_it(installed):
    python = installed.parent / "python"
    out = subprocess.run([str(python), "-c", "from importlib.metadata import metadata; m = metadata('mero-mcp'); "
                          "print(m['Home-page']); print('\\n'.join(m.get_all('Project-URL')))"],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [PROJECT_URL, "Source, " + PROJECT_URL, "Issues, %s/issues" % PROJECT_URL,
                                       "Changelog, %s/blob/main/CHANGELOG.md" % PROJECT_URL]
    usage = subprocess.run([str(installed), "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "Documentation and bug reports: %s\n" % PROJECT_URL in usage, usage


def test_the_command_exists_and_reports_its_version(installed):
    out = subprocess.run([str(installed), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("mero-mcp ")


def test_the_command_answers_initialize_without_requests_or_jsonschema(installed, tmp_path):
    """The venv holds neither runtime package: answering initialize must need neither (cold start)."""
    message = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
    out = subprocess.run([str(installed)], input=json.dumps(message) + "\n", capture_output=True, text=True,
                         timeout=30, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                                          "CALIMERO_NODE_URL": "http://127.0.0.1:9",
                                          "CALIMERO_MCP_STATE_DIR": str(tmp_path / "state")})
    answer = json.loads(out.stdout.splitlines()[0])
    assert answer["id"] == 0 and answer["result"]["protocolVersion"] == "2025-06-18"
    assert answer["result"]["serverInfo"]["name"] == "mero-mcp"


def test_the_modules_are_installed_flat(installed):
    python = installed.parent / "python"
    out = subprocess.run([str(python), "-c", "import mero_mcp, abi, node, sys; print(mero_mcp.__file__)"],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "site-packages" in out.stdout


# ── a checkout run by a Python that lacks the runtime packages: tools and --check say what to install

APT = ("sudo apt install python3-requests python3-jsonschema (Debian, Ubuntu), or sudo dnf install python3-requests "
       "python3-jsonschema (Fedora, RHEL), or sudo pacman -S python-requests python-jsonschema (Arch)")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A fresh venv without pip, requests or jsonschema: the checkout's mero_mcp.py is run by it."""
    home = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False).create(home)
    return home / "bin" / "python"


@pytest.fixture(scope="module")
def requests_only(tmp_path_factory):
    """PYTHONPATH for the bare venv that brings requests (and what it needs) but not jsonschema."""
    import importlib
    lib = tmp_path_factory.mktemp("requests-only")
    for name in ("requests", "urllib3", "idna", "certifi", "charset_normalizer", "chardet", "six"):
        try:
            module = importlib.import_module(name)
        except ImportError:               # chardet or charset_normalizer, six only for Debian's urllib3 1.26
            continue
        source = Path(module.__file__)
        source = source.parent if source.name == "__init__.py" else source
        (lib / source.name).symlink_to(source)
    return lib


def bare_env(tmp_path, double, **extra):
    return minimal_env(tmp_path / "home", dict({"CALIMERO_NODE_URL": double.url,
                                                "CALIMERO_MCP_STATE_DIR": tmp_path / "state",
                                                "CALIMERO_NODE_HOME": tmp_path / "nodes"}, **extra))


def run_check(python, env):
    return subprocess.run([str(python), str(ROOT / "mero_mcp.py"), "--check"], env=env, capture_output=True,
                          text=True, timeout=60)


def test_without_the_packages_tools_say_what_to_install(bare_python, double, tmp_path):
    server = McpServer(bare_env(tmp_path, double), command=[str(bare_python), str(ROOT / "mero_mcp.py")])
    try:
        assert server.initialize()["serverInfo"]["name"] == "mero-mcp"
        assert "node_status" in server.tool_names()
        for name in ("node_status", "list_namespaces", "call"):
            result = server.call_tool(name, {"method": "len"} if name == "call" else {})
            text = result["content"][-1]["text"]
            assert result.get("isError") is True, result
            assert text.startswith("Error: mero-mcp needs the Python packages requests and jsonschema, which %s "
                                   "cannot import (No module named " % bare_python), text
            assert text.endswith(". Install them: %s -m pip install requests jsonschema." % bare_python), text
    finally:
        server.close()
    assert "Traceback" not in server.stderr and "Internal error" not in b"".join(server.raw_lines).decode()
    assert double.log == []


def test_a_missing_package_is_logged_once_however_often_the_catalog_retries(bare_python, double, tmp_path):
    """The catalog poll retries every 30 s; here every 0.2 s (the constant set before main runs), so a few polls
    go by while the test waits."""
    server = tuned_server(bare_env(tmp_path, double), "import mero_apps\nmero_apps.POLL_SECONDS = 0.2",
                          python=bare_python,
                          check="hasattr(__import__('mero_apps'), 'POLL_SECONDS')")
    try:
        server.initialize()
        assert "node_status" in server.tool_names()          # the catalog's first read fails, and polling starts
        time.sleep(2)
        assert server.call_tool("list_namespaces")["isError"] is True      # every tool call still says it
    finally:
        server.close()
    told = [line for line in server.stderr.splitlines() if "needs the Python packages requests and jsonschema" in line]
    assert len(told) == 1 and "app list unavailable at connect" in told[0], server.stderr
    assert "Traceback" not in server.stderr


def test_without_the_packages_check_says_what_to_install(bare_python, double, tmp_path):
    """One problem naming both packages, its fix this Python's: a venv installs with its own pip."""
    out = run_check(bare_python, bare_env(tmp_path, double))
    assert out.returncode == 1 and out.stderr == "", out.stderr
    assert "Python:    %s (requests missing, jsonschema missing)" % bare_python in out.stdout
    problems = out.stdout[out.stdout.index("Problems:\n"):].splitlines()[1:-1]
    assert problems == ["  - mero-mcp needs the Python packages requests and jsonschema, which %s cannot import (No "
                        "module named 'requests')" % bare_python,
                        "    Fix: %s -m pip install requests jsonschema" % bare_python], out.stdout


@pytest.mark.parametrize("prefix, executable, advice", [
    ("base", "/usr/bin/python3", APT),
    ("base", "/usr/local/bin/python3.12", "/usr/local/bin/python3.12 -m pip install requests jsonschema"),
    ("venv", "/usr/bin/python3", "/usr/bin/python3 -m pip install requests jsonschema"),
])
def test_the_install_advice_fits_the_python_it_runs_on(monkeypatch, prefix, executable, advice):
    """The distribution's own Python (in /usr/bin, no venv): its packages, since its pip may be refused
    (externally-managed-environment); a venv, or a Python of one's own: its pip."""
    import node
    monkeypatch.setattr(sys, "executable", executable)
    monkeypatch.setattr(sys, "prefix", sys.base_prefix if prefix == "base" else sys.base_prefix + "-venv")
    assert node.install_advice(["requests", "jsonschema"]) == advice
    assert node.install_advice(["jsonschema"]).count("jsonschema") == (3 if prefix == "base" and
                                                                       executable.startswith("/usr/bin/") else 1)


def test_with_requests_but_not_jsonschema_the_tools_name_jsonschema(bare_python, requests_only, double, tmp_path):
    env = bare_env(tmp_path, double, PYTHONPATH=requests_only)
    server = McpServer(env, command=[str(bare_python), str(ROOT / "mero_mcp.py")])
    try:
        server.initialize()
        text = server.call_tool("list_namespaces")["content"][-1]["text"]
    finally:
        server.close()
    assert text.startswith("Error: mero-mcp needs the Python package jsonschema, which ") and \
        text.endswith(". Install it: %s -m pip install jsonschema." % bare_python), text
    check = run_check(bare_python, env)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert "jsonschema missing" in check.stdout and "Health:    alive" in check.stdout, check.stdout


def test_the_server_modules_copied_alone_say_the_node_modules_are_missing(bare_python, tmp_path):
    """The import failure that is not a package: node.py, its siblings and abi.py left behind (the bare venv,
    because the test venv holds this checkout installed in editable mode)."""
    copied(tmp_path, *SERVER_FILES)
    env = minimal_env(tmp_path / "home", {"CALIMERO_NODE_URL": "http://127.0.0.1:9"})
    check = subprocess.run([str(bare_python), str(tmp_path / "mero_mcp.py"), "--check"], env=env, cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=60)
    missing = "Missing beside mero_mcp.py: node.py, mero_node_events.py, mero_node_http.py, mero_node_config.py, " \
              "mero_node_errors.py and abi.py (in %s)" % tmp_path
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert "  - %s\n    Fix: %s" % (missing, TOGETHER) in check.stdout, check.stdout
    server = McpServer(env, command=[str(bare_python), str(tmp_path / "mero_mcp.py")])
    try:
        server.initialize()
        text = server.call_tool("node_status")["content"][-1]["text"]
    finally:
        server.close()
    assert text == "Error: %s. %s" % (missing, TOGETHER), text


@pytest.mark.parametrize("args", [[], ["--check"], ["--version"]], ids=["server", "check", "version"])
def test_mero_mcp_py_copied_alone_cannot_start_and_says_why_in_one_line(args, tmp_path):
    """-S: no site-packages, where an editable install of this checkout would find the modules."""
    copied(tmp_path, "mero_mcp.py")
    out = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "mero_mcp.py")] + args, input="",
                         capture_output=True, text=True, timeout=30, cwd=str(tmp_path),
                         env=minimal_env(tmp_path / "home"))
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr == ("mero-mcp cannot start: No module named 'mero_runtime' (beside %s). %s\n"
                          % (tmp_path / "mero_mcp.py", TOGETHER)), out.stderr


# ── our modules as a set: every missing one named, a copy from another release named

TOGETHER = ("mero-mcp's modules travel together (mero_mcp.py, the mero_*.py beside it, node.py and abi.py): copy them "
            "all, from one release, into one folder, or install the checkout with pip.")
SERVER_FILES = ("mero_mcp.py", "mero_governance.py", "mero_tools.py", "mero_apps.py", "mero_runtime.py")
NODE_FILES = ("node.py", "mero_node_events.py", "mero_node_http.py", "mero_node_config.py", "mero_node_errors.py")
ALL_FILES = SERVER_FILES + NODE_FILES + ("abi.py",)


def copied(folder, *names, **versions):
    """Our modules copied into `folder`, a module's `__version__` line changed where `versions` says."""
    folder.mkdir(exist_ok=True)
    for name in names:
        text = (ROOT / name).read_text(encoding="utf-8")
        stem = name[:-3]
        if stem in versions:
            text = text.replace('\n__version__ = "%s"\n' % VERSION, '\n__version__ = "%s"\n' % versions[stem], 1)
        (folder / name).write_text(text, encoding="utf-8")
    return folder / "mero_mcp.py"


def module_version(name):
    found = re.search(r'^__version__ = "([^"]+)"$', (ROOT / name).read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else None


VERSION = module_version("mero_mcp.py")


def test_every_module_carries_the_project_version():
    """One version: every module states the same, setup.cfg takes mero_mcp's, serverInfo and --version say it."""
    import importlib
    import mero_mcp
    import mero_runtime
    assert VERSION and {name: module_version(name) for name in ALL_FILES} == dict.fromkeys(ALL_FILES, VERSION)
    assert {importlib.import_module(name[:-3]).__version__ for name in ALL_FILES} == {VERSION}
    assert tuple(name + ".py" for name in mero_runtime.OUR_MODULES) == ALL_FILES
    assert "version = attr: mero_mcp.__version__" in (ROOT / "setup.cfg").read_text(encoding="utf-8")
    assert mero_mcp.SERVER_INFO["version"] == VERSION
    out = subprocess.run([sys.executable, str(ROOT / "mero_mcp.py"), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout == "mero-mcp %s\n" % VERSION and out.returncode == 0


def check_in(script, env):
    return subprocess.run([sys.executable, str(script), "--check"], env=env, cwd=str(script.parent),
                          capture_output=True, text=True, timeout=60)


def test_without_abi_py_check_fails_and_every_tool_names_it(double, tmp_path):
    """mero_mcp.py and node.py copied, abi.py forgotten: --check said OK while every app tool was gone and `call`
    answered a bare -32603 (this test's Python can import the checkout's abi.py: it must not be taken instead)."""
    script = copied(tmp_path / "copy", *SERVER_FILES + NODE_FILES)
    env = bare_env(tmp_path, double)
    missing = "Missing beside mero_mcp.py: abi.py (in %s)" % script.parent
    check = check_in(script, env)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert "  - %s\n    Fix: %s" % (missing, TOGETHER) in check.stdout, check.stdout
    assert "Health:    alive" in check.stdout and "Result:    the server cannot work" in check.stdout
    # said once: no second problem for the same file, and nothing of the tool count's catalog on stderr
    problems = check.stdout[check.stdout.index("Problems:\n"):].splitlines()[1:-1]
    assert problems == ["  - " + missing, "    Fix: " + TOGETHER], check.stdout
    assert "  - com.calimero.kv-store 1.0.0: tools unknown\n" in check.stdout, check.stdout     # as the server has it
    assert check.stderr == "", check.stderr
    server = McpServer(env, command=[sys.executable, str(script)])
    try:
        server.initialize()
        assert not [name for name in server.tool_names() if name.startswith("kv_store_")]
        for name, arguments in (("call", {"app": "kv-store", "context": "demo", "method": "len"}),
                                ("describe_app", {"app": "kv-store"})):
            result = server.call_tool(name, arguments)
            assert result.get("isError") is True, result
            assert result["content"][-1]["text"] == "Error: %s. %s" % (missing, TOGETHER), result
    finally:
        server.close()
    assert "[mero-mcp] %s. %s" % (missing, TOGETHER) in server.stderr.splitlines()      # said at start too
    assert "Traceback" not in server.stderr and "Internal error" not in b"".join(server.raw_lines).decode()


@pytest.mark.parametrize("stale", ["node", "abi", "mero_tools", "mero_node_http"])
def test_a_copy_from_another_release_is_named_by_check_and_at_start(stale, double, tmp_path):
    script = copied(tmp_path / "copy", *ALL_FILES, **{stale: "0.0.9"})
    env = bare_env(tmp_path, double)
    named = "%s is from mero-mcp 0.0.9, this mero_runtime.py from %s" % (script.parent / (stale + ".py"), VERSION)
    check = check_in(script, env)
    assert check.returncode == 1 and "  - %s: one may call what the other lacks\n    Fix: %s" % (named, TOGETHER) \
        in check.stdout, check.stdout
    server = McpServer(env, command=[sys.executable, str(script)])
    try:
        server.initialize()
    finally:
        server.close()
    assert [line for line in server.stderr.splitlines() if line.startswith("[mero-mcp] " + named)], server.stderr
    ok = check_in(copied(tmp_path / "fine", *ALL_FILES), env)
    assert ok.returncode == 0 and "mero-mcp 0.0.9" not in ok.stdout, ok.stdout


# ── Python older than 3.9: one line, exit 1, no traceback (RHEL 8's python3 is 3.6)

def old_python(version):
    """An interpreter of `version` (pyenv's, or python3.6 on PATH but not a pyenv shim), or None."""
    import glob
    import os
    import shutil
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    matches = sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version)))
    found = matches[-1] if matches else shutil.which("python" + version)
    return found if found and "/shims/" not in found else None


@pytest.mark.parametrize("version", ["3.6", "3.7", "3.8"])
@pytest.mark.parametrize("args", [[], ["--check"]], ids=["server", "check"])
def test_an_older_python_gets_one_line_naming_it(version, args, tmp_path):
    """Everything before the version guard runs, and the whole file parses, there (no walrus, no f-string `=`)."""
    python = old_python(version)
    if python is None:
        pytest.skip("no Python %s here (python%s on PATH or under pyenv)" % (version, version))
    out = subprocess.run([python, str(ROOT / "mero_mcp.py")] + args, input="", capture_output=True, text=True,
                         timeout=30, env=minimal_env(tmp_path / "home"))
    line = "mero-mcp needs Python 3.9 or newer, and %s is Python %s." % (python, version)
    assert out.returncode == 1 and out.stdout == "", out
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith(line), out.stderr
    assert "absolute path as the command" in out.stderr


def test_python_2_gets_a_two_line_syntax_error(tmp_path):
    """README: Python 2.7 reads the whole file before running any of it, so no guard of ours runs there."""
    python = old_python("2.7")
    if python is None:
        pytest.skip("no Python 2.7 here (python2.7 on PATH or under pyenv)")
    out = subprocess.run([python, str(ROOT / "mero_mcp.py"), "--check"], input="", capture_output=True, text=True,
                         timeout=30, env=minimal_env(tmp_path / "home"))
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and out.stdout == "" and len(lines) == 2, out
    assert lines[0].startswith("  File ") and lines[1].startswith("SyntaxError: Non-ASCII character '\\x"
                                                                   ), lines
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "Python 2.7 reads the whole file before it runs any of it, so it prints a two-line `SyntaxError`" in readme
