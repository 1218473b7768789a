"""A release a registry could list (issue 44): the Claude Desktop bundle's settings form, valid by the official MCPB
schema and signing in with the form's values; `python -m build`'s sdist and wheel, their metadata, and the wheel
installed into a fresh venv; server.json, valid by the MCP registry's schema. Each step that needs the npm registry
or a package index downloads into the tests' cache and skips in one line without it."""
from __future__ import annotations

import base64
import configparser
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import venv
import zipfile
from pathlib import Path

import jsonschema
import pytest

from conftest import cache_root, held
from mcp_client import ROOT, McpServer
from node_double import sample_double
from test_packaging import OFFLINE_SIGNS, VERSION, checkout_copy
from test_pyz import build, built, host_command, pyz_env

# The official MCPB toolchain, pinned: its package ships the JSON schemas of every manifest version (generated from
# its zod schemas; `mcpb validate` checks the same), under dist/ and schemas/.
MCPB_PACKAGE = "@anthropic-ai/mcpb"
MCPB_VERSION = "2.1.2"
MCPB_INTEGRITY = "sha512-goRbBC8ySo7SWb7tRzr+tL6FxDc4JPTRCdgfD2omba7freofvjq5rom1lBnYHZHo6Mizs1jAHJeN53aZbDoy8A=="
PASSWORD = "pw-Bundle-0815"
# What each field of the bundle's form sets: the variables mero_node_config, mero_node_http and mero_runtime read.
FORM_VARIABLES = {"node_url": "CALIMERO_NODE_URL", "nodes": "CALIMERO_NODES", "node_name": "CALIMERO_NODE_NAME",
                  "username": "CALIMERO_USERNAME", "password": "CALIMERO_PASSWORD",
                  "ca_bundle": "CALIMERO_CA_BUNDLE", "registry_url": "CALIMERO_REGISTRY_URL",
                  "toolsets": "CALIMERO_MCP_TOOLSETS", "read_only": "CALIMERO_MCP_READ_ONLY"}


# ── the bundle's settings form

@pytest.fixture(scope="module")
def mcpb_schemas():
    """{manifest_version: JSON schema} from the pinned @anthropic-ai/mcpb tarball (`npm pack`, kept in the cache
    while its hash is the pinned one)."""
    folder = cache_root() / "npm-pack"
    tarball = folder / ("anthropic-ai-mcpb-%s.tgz" % MCPB_VERSION)
    with held(folder / "pack.lock"):
        if not (tarball.is_file() and integrity(tarball) == MCPB_INTEGRITY):
            npm = shutil.which("npm")
            if npm is None:
                pytest.skip("no npm on PATH to fetch %s@%s (its manifest schemas) with" % (MCPB_PACKAGE, MCPB_VERSION))
            done = subprocess.run([npm, "pack", "%s@%s" % (MCPB_PACKAGE, MCPB_VERSION), "--pack-destination",
                                   str(folder), "--silent"], capture_output=True, text=True, timeout=60)
            if done.returncode != 0 or not tarball.is_file():
                said = (done.stderr.strip().splitlines() or ["npm pack failed"])[-1]
                pytest.skip("the npm registry did not give %s@%s (%s)" % (MCPB_PACKAGE, MCPB_VERSION, said))
    assert integrity(tarball) == MCPB_INTEGRITY, "%s is not the pinned %s@%s" % (tarball, MCPB_PACKAGE, MCPB_VERSION)
    schemas = {}
    with tarfile.open(str(tarball)) as archive:
        for member in archive.getmembers():
            name = member.name.rsplit("/", 1)[-1]
            if member.name.startswith("package/dist/") and name.startswith("mcpb-manifest-v"):
                schemas[name[len("mcpb-manifest-v"):-len(".schema.json")]] = json.load(archive.extractfile(member))
    assert schemas, "no mcpb-manifest-v*.schema.json in %s" % tarball
    return schemas


def integrity(path):
    """npm's integrity string (sha512, base64) of a file."""
    return "sha512-" + base64.b64encode(hashlib.sha512(Path(path).read_bytes()).digest()).decode("ascii")


def test_the_manifest_is_valid_by_the_official_mcpb_schema(mcpb_schemas):
    manifest = build.manifest()
    schema = mcpb_schemas[manifest["manifest_version"]]
    validator = jsonschema.Draft7Validator(schema)
    assert [error.message for error in validator.iter_errors(manifest)] == []
    # the schema bites: a field type the form cannot have, a key it does not know
    wrong = json.loads(json.dumps(manifest))
    wrong["user_config"]["password"]["type"] = "password"
    wrong["user_config"]["username"]["secret"] = True
    assert len(list(validator.iter_errors(wrong))) == 2


def test_each_field_of_the_form_sets_a_variable_the_server_reads():
    manifest = build.manifest()
    env = manifest["server"]["mcp_config"]["env"]
    assert env == {variable: "${user_config.%s}" % key for key, variable in FORM_VARIABLES.items()}
    assert set(manifest["user_config"]) == set(FORM_VARIABLES)
    fields = manifest["user_config"]
    assert [key for key, field in fields.items() if field.get("sensitive")] == ["password"]
    assert fields["ca_bundle"]["type"] == "file" and fields["read_only"]["type"] == "boolean"
    assert all(field["required"] is False and "default" in field for field in fields.values())
    sources = "".join((ROOT / (name + ".py")).read_text(encoding="utf-8")
                      for name in __import__("mero_runtime").OUR_MODULES)
    assert [variable for variable in env if '"%s"' % variable not in sources] == []


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The bundle `make mcpb` builds, unpacked: (its folder, its manifest)."""
    path = built("mcpb", tmp_path_factory.mktemp("mcpb"))
    folder = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(str(path)) as archive:
        archive.extractall(str(folder))
    return folder, json.loads((folder / "manifest.json").read_text(encoding="utf-8"))


@pytest.fixture
def authed():
    double = sample_double(auth={"users": {"admin": PASSWORD}}).start()
    yield double
    double.stop()


@pytest.mark.parametrize("where", ["node_url", "nodes"])
def test_the_bundle_signs_in_with_the_forms_values(bundle, authed, tmp_path, where):
    """As a host starts it: the form's node (one URL, or a one-entry node list), username and password substituted
    into mcp_config, every other field its default (blank: unset to the server)."""
    folder, manifest = bundle
    env = pyz_env(tmp_path)
    node = authed.url if where == "node_url" else "local=%s" % authed.url
    command, settings = host_command(manifest, folder, {where: node, "username": "admin", "password": PASSWORD},
                                     env["PATH"])
    assert settings["CALIMERO_PASSWORD"] == PASSWORD and settings["CALIMERO_CA_BUNDLE"] == ""
    server = McpServer(dict(env, **settings), command=command)
    try:
        server.initialize()
        status = server.call_tool("list_applications")
    finally:
        server.close()
    server.assert_stdout_pure()
    assert not status.get("isError") and "com.calimero.kv-store" in status["content"][-1]["text"], status
    logins = [entry["json"] for entry in authed.log if entry["path"] == "/auth/token"]
    assert logins and logins[0]["provider_data"] == {"username": "admin", "password": PASSWORD}, logins
    admin = [entry for entry in authed.log if entry["path"].startswith("/admin-api/")]
    assert admin and all(entry["headers"].get("authorization", "").startswith("Bearer ") for entry in admin)
    assert PASSWORD not in server.stderr and "Traceback" not in server.stderr, server.stderr


def test_the_bundle_without_the_password_is_refused_by_that_node(bundle, authed, tmp_path):
    """The control: with the password field left empty that node refuses the admin API, and no login is tried."""
    folder, manifest = bundle
    env = pyz_env(tmp_path)
    command, settings = host_command(manifest, folder, {"node_url": authed.url, "username": "admin"}, env["PATH"])
    server = McpServer(dict(env, **settings), command=command)
    try:
        server.initialize()
        status = server.call_tool("list_applications")
    finally:
        server.close()
    assert status.get("isError") is True, status
    assert not [entry for entry in authed.log if entry["path"] == "/auth/token"]


# ── the sdist and the wheel

@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(sdist, wheel) that `python -m build` makes of a copy of this checkout (the build backend from the index)."""
    pytest.importorskip("build", reason="PyPA's build is not installed (it is in the test extras: pip install "
                                        "'.[test]')")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(checkout_copy(tmp_path_factory))],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and any(sign in done.stdout + done.stderr for sign in OFFLINE_SIGNS):
        pytest.skip("the package index is out of reach, so the build backend cannot be fetched")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sdist, wheel = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdist) == 1 and len(wheel) == 1, sorted(os.listdir(str(out)))
    assert sdist[0].name == "mero_mcp-%s.tar.gz" % VERSION and wheel[0].name == "mero_mcp-%s-py3-none-any.whl" % VERSION
    return sdist[0], wheel[0]


def wheel_metadata(wheel):
    with zipfile.ZipFile(str(wheel)) as archive:
        info = "mero_mcp-%s.dist-info/" % VERSION
        return (email.parser.Parser().parsestr(archive.read(info + "METADATA").decode("utf-8")),
                archive.read(info + "entry_points.txt").decode("utf-8"), archive.namelist())


def test_the_wheel_says_everything_an_index_shows(release):
    metadata, entry_points, names = wheel_metadata(release[1])
    assert metadata["Name"] == "mero-mcp" and metadata["Version"] == VERSION
    assert metadata["Summary"] and metadata["Requires-Python"] == ">=3.9"
    assert metadata["Description-Content-Type"] == "text/markdown"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert metadata.get_payload().strip() == readme.strip()
    assert "mcp-name: %s" % build.REGISTRY_NAME in metadata.get_payload()    # the MCP registry's PyPI ownership check
    classifiers = metadata.get_all("Classifier")
    assert {"Programming Language :: Python :: 3.%d" % minor for minor in range(9, 14)} <= set(classifiers)
    assert any(c.startswith("Development Status :: ") for c in classifiers), classifiers
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert set(urls) == {"Source", "Issues", "Changelog"} and all(u.startswith(build.PROJECT_URL) for u in urls.values())
    assert "MIT" in (metadata["License-Expression"] or metadata["License"] or "")
    assert set(metadata.get_all("Requires-Dist")) >= {"requests>=2.25", "jsonschema>=3.2"}
    scripts = configparser.ConfigParser()
    scripts.read_string(entry_points)
    assert dict(scripts["console_scripts"]) == {"mero-mcp": "mero_mcp:main"}
    modules = sorted(name for name in names if "/" not in name)
    assert modules == sorted(name + ".py" for name in __import__("mero_runtime").OUR_MODULES)


def test_the_sdist_carries_the_project_and_no_half_of_the_tests(release):
    with tarfile.open(str(release[0])) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    wanted = {name + ".py" for name in __import__("mero_runtime").OUR_MODULES} | {
        "README.md", "LICENSE", "CHANGELOG.md", "server.json", "setup.cfg", "setup.py", "pyproject.toml", "PKG-INFO"}
    assert wanted <= names, sorted(wanted - names)
    assert not [name for name in names if name.startswith("tests")], sorted(names)


def installed_into(home, wheel):
    """A fresh venv at `home` with `wheel` and what it requires from the index: pip's run. The venv gets no pip of
    its own (8 s of ensurepip) where this Python's pip can install into another (`--python`, pip 22.3)."""
    venv.EnvBuilder(with_pip=False).create(str(home))
    python, install = str(home / "bin" / "python"), ["install", "-q", "--disable-pip-version-check", str(wheel)]
    done = subprocess.run([sys.executable, "-m", "pip", "--python", python] + install, capture_output=True, text=True,
                          timeout=120)
    if "no such option: --python" in done.stderr or "No module named pip" in done.stderr:
        venv.EnvBuilder(with_pip=True).create(str(home))
        done = subprocess.run([python, "-m", "pip"] + install, capture_output=True, text=True, timeout=120)
    return done


def test_the_wheel_in_a_fresh_venv_gives_a_working_command(release, double, tmp_path):
    home = tmp_path / "venv"
    pip = installed_into(home, release[1])
    if pip.returncode != 0 and any(sign in pip.stdout + pip.stderr for sign in OFFLINE_SIGNS):
        pytest.skip("the package index is out of reach, so requests and jsonschema cannot be installed")
    assert pip.returncode == 0, pip.stdout + pip.stderr
    command = home / "bin" / "mero-mcp"
    env = pyz_env(tmp_path, double)
    version = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=30, env=env)
    assert version.stdout == "mero-mcp %s\n" % VERSION, version
    check = subprocess.run([str(command), "--check"], capture_output=True, text=True, timeout=60, env=env,
                           cwd=str(tmp_path))
    assert check.returncode == 0 and check.stderr == "", check
    assert "Python:    %s (requests " % (home / "bin" / "python") in check.stdout, check.stdout
    assert "Result:    OK" in check.stdout and "Missing beside" not in check.stdout, check.stdout
    where = subprocess.run([str(home / "bin" / "python"), "-c", "import mero_mcp, node, abi; print(mero_mcp.__file__,"
                            " mero_mcp.__version__)"], capture_output=True, text=True, timeout=30, cwd="/")
    assert where.stdout.startswith(str(home / "lib")) and where.stdout.rstrip().endswith(" " + VERSION), where


# ── server.json for the MCP registry

def server_schema():
    """The registry's schema for server.json, as its `$schema` names it: outside data, so never committed here.
    Read from MERO_MCP_SERVER_SCHEMA (a path) or fetched once into the tests' cache; skipped when neither can be."""
    address = json.loads((ROOT / "server.json").read_text(encoding="utf-8"))["$schema"]
    given = os.environ.get("MERO_MCP_SERVER_SCHEMA")
    kept = cache_root() / "registry-schema" / address.split("/")[-2] / "server.schema.json"
    if given:
        return json.loads(Path(given).read_text(encoding="utf-8"))
    if not kept.exists():
        try:
            with urllib.request.urlopen(address, timeout=5) as answer:
                text = answer.read().decode("utf-8")
        except OSError as error:
            pytest.skip("the registry's schema %s is out of reach (%s); MERO_MCP_SERVER_SCHEMA may name a copy"
                        % (address, error))
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(text, encoding="utf-8")
    return json.loads(kept.read_text(encoding="utf-8"))


def test_server_json_is_valid_by_the_registry_schema():
    server = json.loads((ROOT / "server.json").read_text(encoding="utf-8"))
    schema = server_schema()
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    assert [error.message for error in validator.iter_errors(server)] == []
    assert server["$schema"] == schema["$id"]
    # the schema bites: too long a description, a package without its transport
    wrong = json.loads(json.dumps(server))
    wrong["description"] = "x" * 101
    del wrong["packages"][0]["transport"]
    assert len(list(validator.iter_errors(wrong))) == 2


def test_server_json_is_this_release_and_names_the_bundles_variables():
    server = json.loads((ROOT / "server.json").read_text(encoding="utf-8"))
    (package,) = server["packages"]
    assert server["version"] == package["version"] == VERSION
    assert (package["registryType"], package["identifier"], package["transport"]) == ("pypi", "mero-mcp",
                                                                                        {"type": "stdio"})
    assert [variable["name"] for variable in package["environmentVariables"]] == list(FORM_VARIABLES.values())
    assert [v["name"] for v in package["environmentVariables"] if v["isSecret"]] == ["CALIMERO_PASSWORD"]
    assert "mcp-name: %s" % server["name"] in (ROOT / "README.md").read_text(encoding="utf-8")
    # the registry's own rules, written out here so they hold where its schema cannot be fetched
    assert re.fullmatch(r"io\.github\.[\w.-]+/[\w.-]+", server["name"]), server["name"]
    assert 0 < len(server["description"]) <= 100 and server["$schema"].startswith("https://static.modelcontext")


def test_server_json_is_the_one_the_build_writes():
    assert (ROOT / "server.json").read_text(encoding="utf-8") == build.server_json_text(), \
        "server.json is stale: python3 packaging/build.py server-json"


# ── uvx and pipx, where they are installed

@pytest.mark.parametrize("runner", ["uvx", "pipx"])
def test_uvx_and_pipx_run_the_checkout_as_the_readme_says(runner, tmp_path_factory, tmp_path):
    found = shutil.which(runner)
    if found is None:
        pytest.skip("no %s on PATH" % runner)
    copy = checkout_copy(tmp_path_factory)
    spec = ["--from", str(copy)] if runner == "uvx" else ["run", "--spec", str(copy)]
    env = dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uv"), PIPX_HOME=str(tmp_path / "pipx"))
    done = subprocess.run([found] + spec + ["mero-mcp", "--version"], capture_output=True, text=True, timeout=120,
                          env=env)
    if done.returncode != 0 and any(sign in done.stdout + done.stderr for sign in OFFLINE_SIGNS):
        pytest.skip("the package index is out of reach for %s" % runner)
    assert done.stdout == "mero-mcp %s\n" % VERSION, done
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (" ".join([runner] + spec).replace(str(copy), "/path/to/mero-mcp") + " mero-mcp") in readme
