"""The one-file forms (issue 35): mero-mcp.pyz, built by packaging/build.py from the pinned pure wheels, run by a bare
Python (`-I -S`: no package of its own), and the Claude Desktop bundle wrapping it; and the CA bundle settings every
form honours. The pyz is built once per test session (or taken from MERO_MCP_TEST_SERVER under `make test-pyz`); each
building step skips in one line without a package index."""
from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import held
from mcp_client import ROOT, SERVER, SERVER_COMMAND, McpServer, minimal_env
from test_packaging import VERSION, old_python


def packaging_build():
    """packaging/build.py, under a name no installed package has (PyPA's `build` is one)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mero_mcp_packaging_build", str(ROOT / "packaging" / "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = packaging_build()

# MERO_MCP_TEST_SERVER naming a pyz (`make test-pyz`): that file is the one tested, not a fresh build.
GIVEN_PYZ = SERVER_COMMAND[-1] if SERVER_COMMAND[-1].endswith(".pyz") else None


def wheel_cache():
    """Downloaded wheels are kept outside the checkout, between runs (the hashes decide whether one is taken)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mero-mcp-tests" / "wheels"


def built(target, out):
    try:
        with held(wheel_cache().parent / "locks" / "wheels.lock"):     # one download at a time into the cache
            if target == "pyz":
                return build.build_pyz(out, wheel_cache())[0]
            return build.build_mcpb(out, wheel_cache())
    except build.Offline as error:
        pytest.skip("no package index answers (%s), so the %s cannot be built" % (error, target))
    except SystemExit as error:            # the build's one-line refusals; only a Python without pip is no failure
        if "has no pip" in str(error):
            pytest.skip(str(error))
        raise AssertionError(str(error)) from None


@pytest.fixture(scope="session")
def pyz(tmp_path_factory):
    if GIVEN_PYZ:
        return Path(GIVEN_PYZ)
    return built("pyz", tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def mcpb(tmp_path_factory):
    return built("mcpb", tmp_path_factory.mktemp("mcpb"))


def python39():
    return old_python("3.9")


PYTHONS = [pytest.param(sys.executable, id="this-python"), pytest.param("3.9", id="python3.9")]


def interpreter(python):
    if python != "3.9":
        return python
    found = python39()
    if found is None:
        pytest.skip("no Python 3.9 here (python3.9 on PATH or under pyenv)")
    return found


def pyz_env(tmp_path, double=None, **extra):
    """A host's environment, its cache folder in the test's own home."""
    settings = {"CALIMERO_MCP_STATE_DIR": tmp_path / "state", "CALIMERO_NODE_HOME": tmp_path / "nodes",
                "TMPDIR": tmp_path / "tmp"}
    if double is not None:
        settings["CALIMERO_NODE_URL"] = double.url
    settings.update(extra)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return minimal_env(tmp_path / "home", settings)


def cache_of(env):
    return Path(env.get("XDG_CACHE_HOME") or Path(env["HOME"]) / ".cache") / "mero-mcp"


def build_name(pyz):
    """The cache folder's name of this pyz's build: <version>-<build>, read from its __main__.py."""
    text = zipfile.ZipFile(str(pyz)).read("__main__.py").decode("utf-8")
    return "%s-%s" % tuple(re.search(r'^%s = "([^"]+)"' % key, text, re.M).group(1) for key in ("VERSION", "BUILD"))


def packaging_module(name):
    """packaging/<name>.py as a module under a name of its own (pyz_main's main() is not run)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mero_mcp_" + name, str(ROOT / "packaging" / (name + ".py")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bootstrap():
    """The pyz's __main__: its build checker (damage)."""
    return packaging_module("pyz_main")


def run(python, pyz, args, env, **kw):
    return subprocess.run([python, "-I", "-S", str(pyz)] + args, env=env, capture_output=True, text=True, timeout=120,
                          **kw)


# ── the file itself

def test_the_pyz_is_small_pure_and_carries_licenses(pyz):
    data = pyz.read_bytes()
    assert len(data) < 1024 * 1024, len(data)
    assert data.startswith(b"#!/usr/bin/env python3\n") and os.access(str(pyz), os.X_OK)
    with zipfile.ZipFile(str(pyz)) as archive:
        names = archive.namelist()
        assert names == sorted(names)
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        compiled = [name for name in names if re.search(r"\.(so|pyd|dylib|dll|pyc)$|\.so\.", name)]
        assert compiled == [], compiled
        ours = [path.name for path in ROOT.glob("*.py") if path.name != "setup.py"]
        assert len(ours) >= 10 and "mero_mcp.py" in ours              # every module of ours (issue 40)
        for name in ours + ["LICENSE"]:
            assert archive.read(name) == (ROOT / name).read_bytes(), name
        notices = archive.read("THIRD_PARTY_NOTICES.txt").decode("utf-8")
        carried = json.loads(archive.read("mero_mcp_pyz.json"))["carries"]
        licenses = [name for name in names if ".dist-info/" in name and
                    re.search(r"/(licenses/)?(LICEN[CS]E|COPYING)[^/]*$", name)]
        packages = {name.split("-")[0] for name in names if name.endswith(".dist-info/METADATA")}
        for name in licenses:             # every license file, whole
            assert archive.read(name).decode("utf-8").strip() in notices, name
        texts = archive.read("__main__.py").decode("utf-8")
    pinned = {name: version for name, version, _ in build.pins()}
    assert carried == pinned and len(packages) == len(pinned) == len({n.split("-")[0] for n in licenses})
    for name, version in pinned.items():
        assert "\n%s %s\nLicense: " % (name, version) in notices, name
    assert 'VERSION = "%s"' % VERSION in texts and "@BUILD@" not in texts


def test_the_same_inputs_give_the_same_bytes(pyz, tmp_path):
    if GIVEN_PYZ:
        pytest.skip("the pyz under test was given (MERO_MCP_TEST_SERVER), not built here")
    again = built("pyz", tmp_path)
    assert again.read_bytes() == pyz.read_bytes()


def test_the_requirements_pin_every_wheel_by_hash():
    pinned = build.pins()
    assert [name for name, _, _ in pinned] == ["requests", "urllib3", "idna", "certifi", "charset-normalizer",
                                               "jsonschema", "attrs", "pyrsistent"]
    assert all(hashes for _, _, hashes in pinned) and dict((n, v) for n, v, _ in pinned)["jsonschema"] == "4.17.0"


def test_without_an_index_the_build_says_so_in_one_line(tmp_path):
    env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="", PIP_NO_INDEX="")
    done = subprocess.run([sys.executable, str(ROOT / "packaging" / "build.py"), "pyz", "--out", str(tmp_path / "out"),
                           "--wheels", str(tmp_path / "none")], env=env, capture_output=True, text=True, timeout=120)
    if "No module named pip" in done.stderr:
        pytest.skip("this Python has no pip")
    assert done.returncode == 3 and done.stdout == "", done
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("make pyz: no package index answers ("), done
    assert not (tmp_path / "out").exists()


# ── run by a bare Python

@pytest.mark.parametrize("python", PYTHONS)
def test_version_and_check_from_the_pyz(python, pyz, double, tmp_path):
    python = interpreter(python)
    env = pyz_env(tmp_path, double)
    version = run(python, pyz, ["--version"], env)
    assert version.stdout == "mero-mcp %s\n" % VERSION and version.returncode == 0, version
    check = run(python, pyz, ["--check"], env)
    assert check.returncode == 0 and check.stderr == "", check
    carried = json.loads(zipfile.ZipFile(str(pyz)).read("mero_mcp_pyz.json"))["carries"]
    assert "Python:    %s (requests %s, jsonschema %s)\n" % (python, carried["requests"], carried["jsonschema"]) \
        in check.stdout, check.stdout
    assert "Missing beside" not in check.stdout and "Health:    alive" in check.stdout, check.stdout
    assert "  - com.calimero.kv-store 1.0.0: " in check.stdout
    assert os.listdir(str(tmp_path / "tmp")) == []


def test_help_from_the_pyz_says_how_to_register_the_pyz_itself(pyz, tmp_path):
    """Unpacked into its cache and run from the zip as is (no cache folder can be made): --help names the pyz as
    what to register, lists the flags, and names no file the pyz does not carry."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for extra in ({}, {"XDG_CACHE_HOME": blocked / "cache"}):
        done = run(sys.executable, pyz, ["--help"], pyz_env(tmp_path, **extra))
        assert done.returncode == 0 and done.stderr == "", done
        assert "Register it with your agent as the command: python3 %s [FLAG ...]\n" % pyz.resolve() in done.stdout, \
            done.stdout
        assert "--read-only " in done.stdout and "CALIMERO_REGISTRY_URL " in done.stdout, done.stdout
        assert not re.search(r"README|mero_mcp\.py|\.md\b", done.stdout), done.stdout
    assert list(cache_of(pyz_env(tmp_path)).glob("%s-*/mero_mcp.py" % VERSION)), "the first run was not the unpacked one"
    bad = run(sys.executable, pyz, ["--toolsets"], pyz_env(tmp_path))
    assert (bad.returncode, bad.stdout, bad.stderr) == (2, "", "mero-mcp: --toolsets needs a value: --toolsets LIST\n")


def session_against(command, env):
    """initialize, tools/list, a set/get round trip and a wrong-typed argument, over stdio; the server closed."""
    server = McpServer(env, command=command)
    try:
        assert server.initialize()["serverInfo"] == {"name": "mero-mcp", "version": VERSION}
        names = server.tool_names()
        assert "node_status" in names and "call" in names, names
        where = {"app": "kv-store", "context": "demo"}
        done = server.call_tool("call", dict(where, method="set", args={"key": "from-pyz", "value": "one file"}))
        assert not done.get("isError"), done
        got = server.call_tool("call", dict(where, method="get", args={"key": "from-pyz"}))
        assert not got.get("isError") and got["content"][0]["text"] == '"one file"', got
        assert got["content"][1]["text"].startswith("get ran in context "), got        # where it ran
        wrong = server.call_tool("call", dict(where, method="set", args={"key": 5, "value": "x"}))
        assert wrong.get("isError") and "- key: expected string, got 5" in wrong["content"][-1]["text"], wrong
    finally:
        server.close()
    server.assert_stdout_pure()
    assert "Traceback" not in server.stderr, server.stderr
    return server


@pytest.mark.parametrize("python", PYTHONS)
def test_a_session_over_stdio_from_the_pyz(python, pyz, double, tmp_path):
    """Nothing left in the temp folder afterwards: certifi's CA file is read where the build unpacked it."""
    python = interpreter(python)
    env = pyz_env(tmp_path, double)
    session_against([python, "-I", "-S", str(pyz)], env)
    assert sorted(p.name for p in cache_of(env).iterdir()) == [".lock", build_name(pyz)]
    assert os.listdir(str(tmp_path / "tmp")) == []


def test_a_second_start_reuses_the_unpacked_build(pyz, tmp_path):
    env = pyz_env(tmp_path)
    run(sys.executable, pyz, ["--version"], env)
    folder = cache_of(env) / build_name(pyz)
    compiled = sorted((folder / "__pycache__").glob("mero_mcp.*.pyc"))
    assert compiled, "the first start precompiles"
    stamp = (folder.stat().st_ino, compiled[0].stat().st_mtime_ns)
    assert run(sys.executable, pyz, ["--version"], env).returncode == 0
    assert sorted(p.name for p in cache_of(env).iterdir()) == [".lock", folder.name]
    assert (folder.stat().st_ino, compiled[0].stat().st_mtime_ns) == stamp


def test_first_starts_at_once_leave_one_folder(pyz, tmp_path):
    env = pyz_env(tmp_path)
    starts = [subprocess.Popen([sys.executable, "-I", "-S", str(pyz), "--version"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for _ in range(4)]
    outs = [start.communicate(timeout=120) for start in starts]
    assert all(out == (b"mero-mcp %s\n" % VERSION.encode(), b"") for out in outs), outs
    assert sorted(p.name for p in cache_of(env).iterdir()) == [".lock", build_name(pyz)]   # no scratch folder left


def unwritable_home(tmp_path):
    """A home no cache folder can be made in, even by root: its path runs through a file."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    return blocker / "home"


def test_a_read_only_home_runs_from_the_zip(pyz, double, tmp_path):
    """Run from the zip itself, --check still finds node.py and abi.py (read through the loader) and the versions
    carried, and nothing lands in the temp folder (certifi is pointed at the system's bundle, not unpacked). It says
    so, and why: once on stderr, and in --check's report (not on its stderr as well)."""
    env = pyz_env(tmp_path, double)
    env["HOME"] = str(unwritable_home(tmp_path))
    server = session_against([sys.executable, "-I", "-S", str(pyz)], env)
    said = "[mero-mcp] runs from %s itself, not unpacked (each start reads its modules from the zip, about 6x " \
           "slower: the cache folder %s/.cache/mero-mcp cannot be made (Not a directory))\n" % (pyz, env["HOME"])
    assert server.stderr.count("runs from %s itself" % pyz) == 1 and said in server.stderr, server.stderr
    check = run(sys.executable, pyz, ["--check"], env)
    assert check.returncode == 0 and check.stderr == "", check
    assert "\nPyz:       runs from the zip itself, not unpacked (each start reads its modules from the zip, about 6x " \
           "slower: the cache folder %s/.cache/mero-mcp cannot be made (Not a directory))\n" % env["HOME"] \
        in check.stdout, check.stdout
    carried = json.loads(zipfile.ZipFile(str(pyz)).read("mero_mcp_pyz.json"))["carries"]
    assert "(requests %(requests)s, jsonschema %(jsonschema)s)" % carried in check.stdout, check.stdout
    assert "Missing beside" not in check.stdout
    assert "  - com.calimero.kv-store 1.0.0: " in check.stdout, check.stdout
    assert os.listdir(str(tmp_path / "tmp")) == [], "certifi's CA file unpacked into the temp folder"


# ── the cache folder: only whole builds of ours run (issue 43)

def entries(root):
    """What the cache folder holds, but its lock file."""
    return sorted(p.name for p in root.iterdir() if p.name != ".lock")


def scratch_of(root, pyz):
    return sorted(root.glob(".%s.*.tmp" % build_name(pyz))) if root.is_dir() else []


def test_a_start_killed_mid_unpack_leaves_no_build_and_the_next_start_runs(pyz, double, tmp_path):
    """The first start is watched while it unpacks: the build's name never appears before the build is whole (an
    unpack into the folder itself, or a rename before the precompile, would show it), and a SIGKILL while it
    precompiles leaves only its scratch folder, which the next start removes after unpacking anew."""
    env = pyz_env(tmp_path, double)
    root, name = cache_of(env), build_name(pyz)
    first = subprocess.Popen([sys.executable, "-I", "-S", str(pyz), "--version"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not any((scratch / "__pycache__").is_dir() for scratch in scratch_of(root, pyz)):
            assert not (root / name).exists(), "the build's folder appeared before the unpack was whole"
            assert first.poll() is None, "the first start ended before it could be killed mid-unpack"
            assert time.monotonic() < deadline, "no scratch folder being precompiled within 60 s"
            time.sleep(0.001)
        first.kill()
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert not os.path.lexists(str(root / name)), "a killed unpack left a build folder under the build's name"
    assert len(scratch_of(root, pyz)) == 1
    server = session_against([sys.executable, "-I", "-S", str(pyz)], env)
    assert "[mero-mcp] the unpacked build" not in server.stderr, server.stderr          # nothing to put aside
    assert entries(root) == [name], "the dead start's scratch folder is left"
    assert bootstrap().damage(str(root / name)) is None


PLANTS = ["other-writable", "group-writable", "writable-module", "linked-module", "symlink", "foreign-owner"]


@pytest.mark.parametrize("how", PLANTS)
def test_a_build_folder_planted_in_the_cache_is_not_run(how, pyz, tmp_path):
    """A build folder under the build's own name, whole and with a manifest that matches (as one planted on purpose
    would be), whose mero_mcp.py leaves a mark when imported: not ours alone, it is never run but put aside and
    unpacked anew."""
    if how == "foreign-owner" and (os.name == "nt" or os.geteuid() != 0):
        pytest.skip("only root can give a folder to another user")
    name = build_name(pyz)
    (tmp_path / "source").mkdir()
    source = pyz_env(tmp_path / "source")
    assert run(sys.executable, pyz, ["--version"], source).returncode == 0
    planted = tmp_path / "planted" / name
    shutil.copytree(str(cache_of(source) / name), str(planted), symlinks=True)
    mark = tmp_path / "it-ran"
    with open(str(planted / "mero_mcp.py"), "a", encoding="utf-8") as module:
        module.write("\nopen(%r, 'w').close()\n" % str(mark))
    for compiled in (planted / "__pycache__").glob("mero_mcp.*.pyc"):
        compiled.unlink()
    pyz_main = bootstrap()
    packaging_module("pyz_unpack").write_manifest(pyz_main, str(planted))
    assert pyz_main.damage(str(planted)) is None, "the planted build would pass every check but ownership"
    env = pyz_env(tmp_path)
    root = cache_of(env)
    root.mkdir(parents=True, mode=0o700)
    if how == "symlink":
        (root / name).symlink_to(planted, target_is_directory=True)
    else:
        shutil.move(str(planted), str(root / name))
        target = root / name
        if how == "other-writable":
            target.chmod(0o702)
        elif how == "group-writable":
            target.chmod(0o770)
        elif how == "writable-module":
            (target / "mero_mcp.py").chmod(0o666)
        elif how == "linked-module":           # the same bytes, read through a link to a file outside
            shutil.move(str(target / "mero_mcp.py"), str(tmp_path / "outside.py"))
            (target / "mero_mcp.py").symlink_to(tmp_path / "outside.py")
        else:
            for parent, folders, files in os.walk(str(target)):
                for entry in [parent] + [os.path.join(parent, f) for f in files]:
                    os.lchown(entry, 65534, 65534)
    done = run(sys.executable, pyz, ["--version"], env)
    assert not mark.exists(), "the planted mero_mcp.py was run"
    assert done.returncode == 0 and done.stdout == "mero-mcp %s\n" % VERSION, done
    assert "[mero-mcp] the unpacked build %s is unpacked anew: " % (root / name) in done.stderr, done.stderr
    assert not (root / name).is_symlink() and (root / name).stat().st_uid == os.getuid()
    assert pyz_main.damage(str(root / name)) is None
    assert entries(root) == [name]


@pytest.mark.parametrize("damage", ["deleted", "changed", "bytecode"])
def test_a_damaged_build_is_unpacked_anew(damage, pyz, double, tmp_path):
    """node.py (every tool needs it) deleted, or changed with its bytecode gone so the change would run, or its
    bytecode replaced (the source left as it was: the unpack's bytecode is never checked against it, so the
    manifest must cover the bytecode too): the next start finds it out against the manifest, says so and unpacks
    the build anew; the session then works."""
    import importlib.util
    import py_compile
    env = pyz_env(tmp_path, double)
    assert run(sys.executable, pyz, ["--version"], env).returncode == 0
    folder = cache_of(env) / build_name(pyz)
    compiled = folder / "__pycache__" / ("node.%s.pyc" % sys.implementation.cache_tag)
    if damage == "deleted":
        (folder / "node.py").unlink()
    elif damage == "bytecode":
        assert compiled.is_file(), "the unpack precompiles node.py"
        (tmp_path / "changed.py").write_text("raise SystemExit('changed')\n", encoding="utf-8")
        py_compile.compile(str(tmp_path / "changed.py"), cfile=str(compiled), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        assert importlib.util.source_hash((folder / "node.py").read_bytes()) != compiled.read_bytes()[8:16]
    else:
        with open(str(folder / "node.py"), "a", encoding="utf-8") as module:
            module.write("\nraise SystemExit('changed')\n")
        for compiled in (folder / "__pycache__").glob("node.*.pyc"):
            compiled.unlink()
    server = session_against([sys.executable, "-I", "-S", str(pyz)], env)
    why = {"deleted": "node.py is missing", "changed": "node.py has changed",
           "bytecode": "__pycache__/%s has changed" % compiled.name}[damage]
    said = "[mero-mcp] the unpacked build %s is unpacked anew: %s\n" % (folder, why)
    assert server.stderr.startswith(said) and server.stderr.count("unpacked anew") == 1, server.stderr
    assert bootstrap().damage(str(folder)) is None
    assert entries(cache_of(env)) == [folder.name]


def test_under_umask_000_every_folder_made_is_ours_alone(pyz, tmp_path):
    env = pyz_env(tmp_path)
    assert not (tmp_path / "home" / ".cache").exists()
    done = subprocess.run([sys.executable, "-I", "-S", str(pyz), "--version"], env=env, capture_output=True,
                          text=True, timeout=120, umask=0)
    assert done.returncode == 0 and done.stderr == "", done
    cache = tmp_path / "home" / ".cache"
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    assert oct(cache_of(env).stat().st_mode & 0o777) == oct(0o700)
    loose = []
    for parent, folders, files in os.walk(str(cache_of(env))):
        for entry in [parent] + [os.path.join(parent, f) for f in files]:
            if os.lstat(entry).st_mode & 0o077:
                loose.append(entry)
    assert loose == [], loose[:5]


def old_build(root, name, age):
    """A build folder of an older pyz, `age` seconds old."""
    folder = root / name
    (folder / "__pycache__").mkdir(parents=True, mode=0o700)
    (folder / "mero_mcp.py").write_text("")
    (folder / ".in-use").write_text("")
    stamp = time.time() - age
    os.utime(str(folder), (stamp, stamp))
    return folder


def test_old_builds_go_but_the_previous_and_any_in_use(pyz, tmp_path):
    """Of three older builds the newest (the previous) stays, the one a running process holds stays until it is let
    go, the last goes; a scratch folder a dead start left goes."""
    import fcntl
    env = pyz_env(tmp_path)
    root = cache_of(env)
    root.mkdir(parents=True, mode=0o700)
    old_build(root, "0.0.1-aaaaaaaaaaaa", 300)
    held_build = old_build(root, "0.0.2-bbbbbbbbbbbb", 200)
    old_build(root, "0.0.3-cccccccccccc", 100)
    dead = root / (".%s.dead1234.tmp" % build_name(pyz))
    (dead / "attr").mkdir(parents=True)
    with open(str(held_build / ".in-use"), "rb") as in_use:
        fcntl.flock(in_use.fileno(), fcntl.LOCK_SH)            # as a running server of that build does
        assert run(sys.executable, pyz, ["--version"], env).returncode == 0
        assert entries(root) == ["0.0.2-bbbbbbbbbbbb", "0.0.3-cccccccccccc", build_name(pyz)]
    assert run(sys.executable, pyz, ["--version"], env).returncode == 0           # let go: it goes
    assert entries(root) == ["0.0.3-cccccccccccc", build_name(pyz)]
    dead.mkdir()                   # a start that died since, and nothing else to tidy: a start whose build is whole
    assert run(sys.executable, pyz, ["--version"], env).returncode == 0           # removes its scratch folder
    assert entries(root) == ["0.0.3-cccccccccccc", build_name(pyz)]


def test_a_cache_folder_others_may_write_to_is_not_used(pyz, tmp_path):
    env = pyz_env(tmp_path)
    root = cache_of(env)
    root.mkdir(parents=True)
    root.chmod(0o777)
    version = run(sys.executable, pyz, ["--version"], env)      # answered at once: nothing said about the zip
    assert (version.returncode, version.stdout, version.stderr) == (0, "mero-mcp %s\n" % VERSION, ""), version
    served = run(sys.executable, pyz, [], env, input="")          # a server's start, ended by stdin's end
    assert served.returncode == 0 and served.stdout == "", served
    assert served.stderr.startswith("[mero-mcp] runs from %s itself, not unpacked (%s: %s may be written by others "
                                    "(mode 777) (chmod 700 it, or remove it))\n" % (pyz, bootstrap().SLOW, root)), \
        served.stderr
    assert served.stderr.count("runs from") == 1 and list(root.iterdir()) == []
    check = run(sys.executable, pyz, ["--check"], env)
    assert check.stderr == "" and "\nPyz:       runs from the zip itself, not unpacked (%s: %s may be written by " \
        "others (mode 777) (chmod 700 it, or remove it))\n" % (bootstrap().SLOW, root) in check.stdout, check.stdout


def test_an_old_python_gets_one_line_naming_the_pyz(pyz, tmp_path):
    python = old_python("3.6") or old_python("3.8")
    if python is None:
        pytest.skip("no Python 3.6 or 3.8 here")
    out = subprocess.run([python, str(pyz)], input="", capture_output=True, text=True, timeout=30,
                         env=minimal_env(tmp_path / "home"))
    assert out.returncode == 1 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    assert out.stderr.startswith("mero-mcp needs Python 3.9 or newer, and %s is Python 3." % python)
    assert out.stderr.endswith(", with %s as the argument.\n" % pyz), out.stderr


# ── the Claude Desktop bundle

def host_command(manifest, folder, values, path):
    """What a host runs for the bundle: ${__dirname} is where it unpacked, every ${user_config.X} the user's value or
    its default, `command` looked up on PATH."""
    config = manifest["server"]["mcp_config"]
    settings = manifest["user_config"]

    def resolved(text):
        def one(found):
            key = found.group(1)
            if key == "__dirname":
                return str(folder)
            name = key.split(".", 1)[1]
            value = values.get(name, settings[name]["default"])
            return json.dumps(value) if isinstance(value, bool) else str(value)
        return re.sub(r"\$\{([^}]+)\}", one, text)
    command = shutil.which(config["command"], path=path)
    assert command, "no %s on PATH" % config["command"]
    return [command] + [resolved(arg) for arg in config["args"]], {k: resolved(v) for k, v in config["env"].items()}


def test_the_bundle_runs_as_a_host_starts_it(mcpb, double, tmp_path):
    folder = tmp_path / "unpacked"
    with zipfile.ZipFile(str(mcpb)) as bundle:
        bundle.extractall(str(folder))
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["version"] == VERSION and manifest["server"]["type"] == "python"
    assert (folder / manifest["server"]["entry_point"]).is_file()
    placeholders = re.findall(r"\$\{user_config\.([^}]+)\}", json.dumps(manifest["server"]))
    assert placeholders and all(not settings["required"] and "default" in settings
                                for settings in manifest["user_config"].values())
    assert set(placeholders) == set(manifest["user_config"])
    env = pyz_env(tmp_path)
    command, settings = host_command(manifest, folder, {"node_url": double.url}, env["PATH"])
    assert settings["CALIMERO_MCP_READ_ONLY"] == "false" and settings["CALIMERO_MCP_TOOLSETS"] == "all"
    server = McpServer(dict(env, **settings), command=command)
    try:
        server.initialize()
        assert "call" in server.tool_names() and any(name.startswith("kv_store_") for name in server.tool_names())
    finally:
        server.close()
    server.assert_stdout_pure()
    assert os.listdir(str(tmp_path / "tmp")) == []


# ── trust: the CA bundle an https node is verified with, in every form

@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem), made by openssl."""
    folder = tmp_path_factory.mktemp("tls")
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl on PATH to make a certificate with")
    done = subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                           "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                           str(folder / "key.pem"), "-out", str(folder / "cert.pem")], capture_output=True, timeout=60)
    if done.returncode != 0:
        pytest.skip("openssl could not make a certificate: %s" % done.stderr[-300:])
    return folder


@pytest.fixture
def https_double(double, certificate):
    """The double behind TLS (its listening socket wrapped): its https:// URL."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certificate / "cert.pem"), str(certificate / "key.pem"))
    server = double._server
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return double.url.replace("http://", "https://")


FORMS = [pytest.param("checkout", id="checkout"), pytest.param("pyz", id="pyz")]


def check_command(form, request):
    if form == "checkout":
        return [sys.executable, str(SERVER), "--check"]
    return [sys.executable, "-I", "-S", str(request.getfixturevalue("pyz")), "--check"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("variable", ["CALIMERO_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"])
def test_a_ca_setting_verifies_an_https_node(form, variable, https_double, certificate, tmp_path, request):
    """Proxies stay off while the bundle is taken: an HTTPS_PROXY that answers nothing is not used."""
    bundle = str(certificate / "cert.pem")
    env = pyz_env(tmp_path, CALIMERO_NODE_URL=https_double, HTTPS_PROXY="http://127.0.0.1:9",
                  **{variable: bundle})
    check = subprocess.run(check_command(form, request), env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "TLS:       https is verified with %s (%s)\n" % (bundle, variable) in check.stdout, check.stdout
    assert "Health:    alive" in check.stdout


@pytest.mark.parametrize("form", FORMS)
def test_without_the_ca_the_check_names_the_bundle_it_used(form, https_double, tmp_path, request):
    env = pyz_env(tmp_path, CALIMERO_NODE_URL=https_double)
    check = subprocess.run(check_command(form, request), env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stdout + check.stderr
    assert "Health:    failed: Cannot reach the node at %s/admin-api/health: the TLS handshake failed" % https_double \
        in check.stdout, check.stdout
    used = re.search(r"TLS:       https is verified with (\S+) \(", check.stdout).group(1)
    assert "Fix: The certificate of %s was checked against %s (" % (https_double, used) in check.stdout, check.stdout
    if form == "pyz":                  # the system's bundle over the one the pyz carries
        assert "the system's, preferred over the one the pyz carries" in check.stdout, check.stdout


def test_a_ca_bundle_that_is_not_there_is_named(https_double, tmp_path):
    missing = str(tmp_path / "nowhere.pem")
    env = pyz_env(tmp_path, CALIMERO_NODE_URL=https_double, CALIMERO_CA_BUNDLE=missing)
    check = subprocess.run([sys.executable, str(SERVER), "--check"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert "TLS:       none: CALIMERO_CA_BUNDLE names %s, which does not exist" % missing in check.stdout, check.stdout


def test_the_ca_settings_are_read_in_order(monkeypatch):
    import mero_node_http
    assert mero_node_http.ca_bundle({"SSL_CERT_FILE": "/c", "REQUESTS_CA_BUNDLE": "/b", "CALIMERO_CA_BUNDLE": "/a"}) == \
        mero_node_http.CaBundle("/a", "CALIMERO_CA_BUNDLE")
    assert mero_node_http.ca_bundle({"SSL_CERT_FILE": "/c", "REQUESTS_CA_BUNDLE": " "}) == mero_node_http.CaBundle("/c", "SSL_CERT_FILE")
    assert mero_node_http.ca_bundle({}) == mero_node_http.CaBundle(None, "the one requests carries")     # the checkout: as before


# ── the README's One file section, as written

def one_file_section():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("### One file: `mero-mcp.pyz`")
    return text[start:text.index("\n### ", start + 1)]


def test_the_readme_snippet_starts_the_pyz_as_pasted(pyz, double, tmp_path):
    section = one_file_section()
    assert "dist/mero-mcp-%s.pyz" % VERSION in section and "python3 /opt/mero-mcp.pyz --check" in section
    (block,) = re.findall(r"^```json\n(.*?)^```", section, re.S | re.M)
    entry = json.loads(block)["mcpServers"]["mero-mcp"]
    assert entry["command"] == "python3" and entry["args"] == ["/opt/mero-mcp.pyz"]
    env = dict(pyz_env(tmp_path), **dict(entry["env"], CALIMERO_NODE_URL=double.url))
    server = McpServer(env, command=[sys.executable, str(pyz)])
    try:
        server.initialize()
        assert "kv_store_get" in server.tool_names()
    finally:
        server.close()
    server.assert_stdout_pure()
