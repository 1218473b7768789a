# mero-mcp.pyz's __main__ (packaging/build.py writes it in with the build's VERSION and BUILD): check the Python, unpack
# the pyz once into a per-build cache folder, precompiled, and run the server from there; where no cache folder can be
# written (a read-only home), run from the zip as is. Everything here parses on Python 2.7 and runs to the version
# check on 3.6, so an old Python gets one line, not a traceback.
import sys

VERSION = "@VERSION@"
BUILD = "@BUILD@"          # sha256 of every other member, cut short: the cache folder's name, so a new build unpacks anew


def archive():
    """The pyz this runs from (its path as started, made absolute)."""
    import os
    return os.path.dirname(os.path.abspath(__file__))


if sys.version_info < (3, 9):
    sys.stderr.write("mero-mcp needs Python 3.9 or newer, and %s is Python %s. Point the host at a newer Python: its "
                     "absolute path as the command, with %s as the argument.\n"
                     % (sys.executable or "python", sys.version.split()[0], archive()))
    sys.exit(1)

import os  # noqa: E402


def cache_root():
    """Where builds unpack: %LOCALAPPDATA%\\mero-mcp on Windows, else $XDG_CACHE_HOME/mero-mcp or ~/.cache/mero-mcp
    (None when there is no such place)."""
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA")
    else:
        base = os.environ.get("XDG_CACHE_HOME")
        if not base or not os.path.isabs(base):          # the XDG spec: a relative value is ignored
            home = os.path.expanduser("~")
            base = os.path.join(home, ".cache") if os.path.isabs(home) else None
    return os.path.join(base, "mero-mcp") if base else None


def unpacked(pyz):
    """The folder this build runs from, unpacked and precompiled by the first start; None to run from the zip."""
    root = cache_root()
    if root is None:
        return None
    folder = os.path.join(root, "%s-%s" % (VERSION, BUILD))
    if not os.path.isfile(os.path.join(folder, "mero_mcp.py")):
        try:
            os.makedirs(root, 0o700, exist_ok=True)
        except OSError:                  # a read-only home: the zip as is
            return None
        if not private(root):
            return None
        unpack(pyz, root, folder)
    elif not private(root):
        return None
    return folder if os.path.isfile(os.path.join(folder, "mero_mcp.py")) else None


def private(root):
    """The code we run must be ours alone to change: the cache folder is ours and no one else may write to it."""
    if os.name == "nt":
        return True
    try:
        status = os.stat(root)
    except OSError:
        return False
    if status.st_uid == os.getuid() and not status.st_mode & 0o022:
        return True
    sys.stderr.write("[mero-mcp] %s is not ours alone (owner or mode), so this runs from %s itself\n" % (root, archive()))
    return False


def unpack(pyz, root, folder):
    """Unpack into a scratch folder beside `folder`, precompile, and rename it into place: a start sees the whole
    build or none, and when starts race, the first rename wins and the others drop their copies."""
    import compileall
    import contextlib
    import py_compile
    import shutil
    import tempfile
    import zipfile
    try:
        scratch = tempfile.mkdtemp(prefix=".%s-%s." % (VERSION, BUILD), suffix=".tmp", dir=root)
    except OSError:
        return
    try:
        with zipfile.ZipFile(pyz) as members:
            members.extractall(scratch)
        with contextlib.redirect_stdout(sys.stderr):     # stdout is the protocol's; compileall reports on it
            compileall.compile_dir(scratch, ddir=folder, quiet=2, workers=1,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        os.rename(scratch, folder)
    except (OSError, zipfile.BadZipFile):     # another start renamed first, or the disk said no: the zip as is
        shutil.rmtree(scratch, ignore_errors=True)


def carry_system_ca(pyz):
    """Run from the zip, requests would have certifi unpack its CA file into the temp folder at every start, and
    nothing removes it (the server leaves by os._exit). Point certifi at the system's bundle instead, else at its
    own file inside the zip, which requests unpacks only when an https node is verified, once for all starts."""
    import mero_node_http
    import certifi.core
    certifi.core._CACERT_PATH = mero_node_http.system_ca_bundle() or os.path.join(pyz, "certifi", "cacert.pem")


def main():
    pyz = archive()
    folder = unpacked(pyz)
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != pyz]
    sys.path.insert(0, folder or pyz)
    if folder is None:
        carry_system_ca(pyz)
    import mero_mcp
    return mero_mcp.main()


sys.exit(main())
