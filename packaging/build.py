#!/usr/bin/env python3
"""`make pyz` and `make mcpb`: mero-mcp as one file, with the standard library only.

    python3 packaging/build.py pyz  [--out DIR] [--wheels DIR]   -> DIR/mero-mcp-<version>.pyz
    python3 packaging/build.py mcpb [--out DIR] [--wheels DIR]   -> DIR/mero-mcp-<version>.mcpb (the pyz inside)
    python3 packaging/build.py server-json                       -> server.json, the MCP registry's entry

The pyz holds our modules (setup.cfg's py_modules), LICENSE, THIRD_PARTY_NOTICES.txt, the build file node.py recognises it by,
its __main__.py (pyz_main.py) and pyz_unpack.py, and the pure-Python wheels packaging/requirements.txt pins by hash (their tests, benchmarks, type stubs and RECORD
left out). The wheels are downloaded by pip at build time into --wheels (default build/wheels), and taken from there
while their hashes match. Members are sorted and dated 1980-01-01: the same inputs give the same bytes.
"""
import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"
REQUIREMENTS = PACKAGING / "requirements.txt"
PYZ_MARK = "mero_mcp_pyz.json"             # node.py's PYZ_MARK
NOTICES = "THIRD_PARTY_NOTICES.txt"
SIZE_LIMIT = 1024 * 1024
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
SHEBANG = b"#!/usr/bin/env python3\n"
# What a running server never reads: the packages' own tests and benchmarks, type stubs, the wheel's file list.
LEFT_OUT = re.compile(r"(^|/)tests/|^jsonschema/benchmarks/|\.pyi$|\.dist-info/RECORD$")
COMPILED = re.compile(r"\.(so|pyd|dylib|dll)$|\.so\.")
OFFLINE_SIGNS = ("NewConnectionError", "No matching distribution", "Could not find a version", "Temporary failure",
                 "Network is unreachable", "Name or service not known", "ConnectTimeout", "Max retries exceeded")
PYTHON_REQUIRES = ">=3.9"
PROJECT_URL = "https://github.com/calimero-network/mero-mcp"


class Offline(Exception):
    """No package index answered: the one line `make pyz` prints, exit 3."""


def our_files():
    """Our modules as setup.cfg's py_modules lists them (the one list: pip installs the same), and LICENSE."""
    import configparser
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg", encoding="utf-8")
    return tuple(name + ".py" for name in setup["options"]["py_modules"].split()) + ("LICENSE",)


def version():
    found = re.search(r'^__version__ = "([^"]+)"$', (ROOT / "mero_mcp.py").read_text(encoding="utf-8"), re.M)
    return found.group(1)


def pins():
    """[(name, version, {sha256, ...})] from requirements.txt."""
    text = REQUIREMENTS.read_text(encoding="utf-8").replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, pinned = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line).groups()
        found.append((name, pinned, set(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))))
    return found


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def wheel_for(folder, name, pinned, hashes):
    """The pinned wheel in `folder` whose hash is pinned, or None."""
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(Path(folder).glob("*.whl")):
        parts = path.name.split("-")
        if re.sub(r"[-_.]+", "_", parts[0]).lower() == stem and parts[1] == pinned and sha256(path) in hashes:
            return path
    return None


def wheels(folder):
    """Every pinned wheel, downloaded by pip into `folder` unless it is there already."""
    folder = Path(folder)
    wanted = pins()
    if any(wheel_for(folder, *pin) is None for pin in wanted):
        folder.mkdir(parents=True, exist_ok=True)
        download(folder)
    found = [wheel_for(folder, *pin) for pin in wanted]
    missing = [pin[0] for pin, path in zip(wanted, found) if path is None]
    if missing:
        raise SystemExit("build: pip downloaded no wheel matching the pinned hash for %s" % ", ".join(missing))
    return found


def download(folder):
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--require-hashes", "--only-binary=:all:", "--platform", "any", "--implementation", "py",
               "--python-version", "3.9", "--abi", "none", "--retries", "0", "--timeout", "15",
               "--dest", str(folder), "--requirement", str(REQUIREMENTS)]
    done = subprocess.run(command, capture_output=True, text=True)
    said = done.stdout + done.stderr
    if done.returncode == 0:
        return
    if "No module named pip" in said:
        raise SystemExit("build: %s has no pip to download the pinned wheels with: run it with a Python that has "
                         "(make pyz PYTHON=/path/to/python3)" % sys.executable)
    why = [line.strip() for line in said.splitlines() if line.strip().startswith(("ERROR", "error"))]
    if any(sign in said for sign in OFFLINE_SIGNS):
        raise Offline(why[-1] if why else "pip download failed")
    raise SystemExit("build: pip download failed:\n" + said)


def wheel_members(path):
    """{name: bytes} of a wheel, less what a running server never reads; a compiled member stops the build."""
    members = {}
    with zipfile.ZipFile(str(path)) as wheel:
        for name in wheel.namelist():
            if name.endswith("/") or LEFT_OUT.search(name):
                continue
            if COMPILED.search(name):
                raise SystemExit("build: %s holds a compiled member %s: only pure wheels may travel" % (path.name, name))
            members[name] = wheel.read(name)
    return members


def metadata(members):
    """(name, version, license, home page, [(license file, text)]) of one wheel's members."""
    info = next(name for name in members if name.endswith(".dist-info/METADATA"))
    fields = {}
    for line in members[info].decode("utf-8").split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    home = next((url.split(", ", 1)[1] for url in fields.get("Project-URL", ())
                 if url.lower().startswith(("source", "homepage", "home", "code"))), None)
    licence = (fields.get("License-Expression") or [""])[0] or (fields.get("License") or [""])[0] or ", ".join(
        c.split(" :: ")[-1] for c in fields.get("Classifier", ()) if c.startswith("License ::"))
    folder = info.rsplit("/", 1)[0]
    texts = [(name, members[name].decode("utf-8")) for name in sorted(members)
             if name.startswith(folder + "/") and re.search(r"/(licenses/)?(LICEN[CS]E|COPYING|NOTICE)[^/]*$", name)]
    return fields["Name"][0], fields["Version"][0], licence.splitlines()[0] if licence else "", home or (
        fields.get("Home-page") or [""])[0], texts


def notices(packages):
    out = ["Third-party software carried by mero-mcp.pyz", "",
           "mero-mcp itself is under the MIT License (LICENSE). The pyz also carries these packages, unchanged but",
           "for their tests, benchmarks and type stubs, each under its own license, given here in full.", ""]
    for name, pinned, licence, home, texts in packages:
        out += ["=" * 100, "%s %s" % (name, pinned), "License: %s" % (licence or "see the text below"),
                "Source: %s" % (home or "https://pypi.org/project/%s/%s/" % (name, pinned)), "=" * 100, ""]
        for file_name, text in texts:
            out += ["--- %s" % file_name, "", text.rstrip("\n"), ""]
    return "\n".join(out) + "\n"


def pyz_members(wheel_folder):
    """{name: bytes} of the pyz, its __main__.py with the build's id, and that id."""
    members, packages, vendored = {}, [], {}
    for path in wheels(wheel_folder):
        found = wheel_members(path)
        members.update(found)
        package = metadata(found)
        packages.append(package)
        if not package[4]:
            raise SystemExit("build: %s carries no license file" % path.name)
        vendored[package[0]] = package[1]
    for name in our_files():
        members[name] = (ROOT / name).read_bytes()
    members[NOTICES] = notices(packages).encode("utf-8")
    members["pyz_unpack.py"] = (PACKAGING / "pyz_unpack.py").read_bytes()      # __main__'s unpacking, imported as needed
    members[PYZ_MARK] = (json.dumps({"name": "mero-mcp", "version": version(), "python": PYTHON_REQUIRES,
                                     "carries": vendored}, indent=1, sort_keys=True) + "\n").encode("utf-8")
    digest = hashlib.sha256()
    for name in sorted(members):
        digest.update(name.encode("utf-8") + b"\0" + hashlib.sha256(members[name]).digest())
    build = digest.hexdigest()[:12]
    main = (PACKAGING / "pyz_main.py").read_text(encoding="utf-8")
    members["__main__.py"] = main.replace("@VERSION@", version()).replace("@BUILD@", build).encode("utf-8")
    return members, build


def zipped(members, prefix=b"", compress=zipfile.ZIP_DEFLATED):
    """The zip of `members` (sorted, fixed times and modes) after `prefix`."""
    out = io.BytesIO()
    out.write(prefix)
    with zipfile.ZipFile(out, "w") as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.create_system = 3
            info.external_attr = 0o644 << 16
            info.compress_type = compress
            archive.writestr(info, members[name], compresslevel=9 if compress == zipfile.ZIP_DEFLATED else None)
    return out.getvalue()


def write(path, data, mode):
    """Written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=str(path.parent), prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(scratch, mode)
        os.replace(scratch, str(path))
    except BaseException:
        os.unlink(scratch)
        raise


def build_pyz(out, wheel_folder):
    members, build = pyz_members(wheel_folder)
    data = zipped(members, SHEBANG)
    if len(data) >= SIZE_LIMIT:
        raise SystemExit("build: the pyz is %d bytes, past the 1 MB bound" % len(data))
    path = Path(out) / ("mero-mcp-%s.pyz" % version())
    write(path, data, 0o755)
    return path, data, build


# The bundle's settings form: key -> (type, title, description, default, the variable it sets, sensitive). Every
# one optional with a default, so no ${user_config...} placeholder reaches the server; blank counts as unset there.
USER_CONFIG = {
    "node_url": ("string", "Node URL", "The node's address, e.g. http://localhost:2528. Empty: the node the Calimero "
                 "desktop app hands over, else the one found in ~/.calimero or on the usual ports.", "",
                 "CALIMERO_NODE_URL", False),
    "nodes": ("string", "Several nodes", "Instead of one node URL: comma-separated name=url entries, each may end in "
              '" (ro)", e.g. local=http://127.0.0.1:2528,prod=https://n.example.com (ro)', "", "CALIMERO_NODES", False),
    "node_name": ("string", "Node name", "Of several named nodes (above, or in ~/.calimero): the one calls go to by "
                  "default.", "", "CALIMERO_NODE_NAME", False),
    "username": ("string", "Username", "For a node that asks for a login: the account's username (admin rights).",
                 "", "CALIMERO_USERNAME", False),
    "password": ("string", "Password", "That account's password.", "",
                 "CALIMERO_PASSWORD", True),
    "ca_bundle": ("file", "CA bundle", "For an https node whose certificate a private CA signed: that CA's PEM file.",
                  "", "CALIMERO_CA_BUNDLE", False),
    "registry_url": ("string", "Registry URL", "The app registry to browse and install from. Empty: the one the "
                     "node's config.toml names.", "", "CALIMERO_REGISTRY_URL", False),
    "toolsets": ("string", "Toolsets", "Comma-separated: core, blobs, governance, or all.", "all",
                 "CALIMERO_MCP_TOOLSETS", False),
    "read_only": ("boolean", "Read-only", "Offer only tools that cannot change the node.", False,
                  "CALIMERO_MCP_READ_ONLY", False),
}


def user_config():
    """The manifest's user_config: each field of USER_CONFIG, a password's marked sensitive (the host keeps it in the
    keychain and masks it)."""
    fields = {}
    for key, (kind, title, text, default, _, sensitive) in USER_CONFIG.items():
        fields[key] = {"type": kind, "title": title, "description": text, "required": False, "default": default}
        if sensitive:
            fields[key]["sensitive"] = True
    return fields


def manifest():
    """The Claude Desktop bundle's manifest.json: the pyz run by the host's python3 (python on Windows), each setting
    of its form passed as the variable the server reads."""
    return {
        "manifest_version": "0.2",
        "name": "mero-mcp",
        "display_name": "Calimero (mero-mcp)",
        "version": version(),
        "description": "Drive a Calimero node and every application installed on it.",
        "author": {"name": "Calimero Network", "url": PROJECT_URL},
        "homepage": PROJECT_URL,
        "repository": {"type": "git", "url": PROJECT_URL},
        "license": "MIT",
        "server": {
            "type": "python",
            "entry_point": "server/mero-mcp.pyz",
            "mcp_config": {
                "command": "python3",
                "args": ["${__dirname}/server/mero-mcp.pyz"],
                "env": {variable: "${user_config.%s}" % key
                        for key, (_, _, _, _, variable, _) in USER_CONFIG.items()},
                "platform_overrides": {"win32": {"command": "python"}},
            },
        },
        "user_config": user_config(),
        "compatibility": {"platforms": ["darwin", "linux", "win32"], "runtimes": {"python": PYTHON_REQUIRES}},
    }


SERVER_JSON_SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
REGISTRY_NAME = "io.github.calimero-network/mero-mcp"   # README.md carries "mcp-name: <this>" (PyPI ownership)
INPUT_FORMATS = {"string": "string", "boolean": "boolean", "file": "filepath"}


def server_json():
    """server.json for the MCP registry: the PyPI package, started by uvx over stdio, with the bundle's settings as
    its environment variables (`build.py server-json` writes it; tests/test_release.py holds the two equal)."""
    variables = []
    for kind, title, text, default, variable, sensitive in USER_CONFIG.values():
        entry = {"name": variable, "description": "%s. %s" % (title, text), "format": INPUT_FORMATS[kind],
                 "isRequired": False, "isSecret": sensitive}
        if default != "":
            entry["default"] = json.dumps(default) if isinstance(default, bool) else default
        variables.append(entry)
    return {
        "$schema": SERVER_JSON_SCHEMA,
        "name": REGISTRY_NAME,
        "title": "Calimero (mero-mcp)",
        "description": manifest()["description"],
        "version": version(),
        "websiteUrl": PROJECT_URL,
        "repository": {"url": PROJECT_URL, "source": "github"},
        "packages": [{"registryType": "pypi", "registryBaseUrl": "https://pypi.org", "identifier": "mero-mcp",
                      "version": version(), "runtimeHint": "uvx", "transport": {"type": "stdio"},
                      "environmentVariables": variables}],
    }


def server_json_text():
    return json.dumps(server_json(), indent=2) + "\n"


def build_mcpb(out, wheel_folder):
    _, pyz, _ = build_pyz(out, wheel_folder)
    members = {"manifest.json": (json.dumps(manifest(), indent=2) + "\n").encode("utf-8"),
               "server/mero-mcp.pyz": pyz, "LICENSE": (ROOT / "LICENSE").read_bytes()}
    path = Path(out) / ("mero-mcp-%s.mcpb" % version())
    write(path, zipped(members), 0o644)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=("pyz", "mcpb", "server-json"))
    parser.add_argument("--out", default=str(ROOT / "dist"))
    parser.add_argument("--wheels", default=str(ROOT / "build" / "wheels"))
    args = parser.parse_args(argv)
    if args.target == "server-json":                # the checkout's own file, beside setup.cfg
        write(ROOT / "server.json", server_json_text().encode("utf-8"), 0o644)
        print("wrote server.json (mero-mcp %s)" % version())
        return 0
    path = Path(args.out) / ("mero-mcp-%s.%s" % (version(), args.target))
    try:
        built = build_pyz(args.out, args.wheels)[0] if args.target == "pyz" else build_mcpb(args.out, args.wheels)
    except Offline as error:
        sys.stderr.write("make %s: no package index answers (%s), so %s is not built: its pinned wheels come from "
                         "nowhere else\n" % (args.target, error, os.path.relpath(str(path))))
        return 3
    size = built.stat().st_size
    print("built %s: %d bytes (%.0f KiB), sha256 %s" % (os.path.relpath(str(built)), size, size / 1024,
                                                          sha256(built)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
