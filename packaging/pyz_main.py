# mero-mcp.pyz's __main__ (packaging/build.py writes it in with the build's VERSION and BUILD): check the Python, run
# the server from the build's cache folder, unpacked and precompiled, once that folder verifies; else have pyz_unpack
# (the pyz's member, imported only then) unpack it anew, or run from the zip as is and say why. This file is compiled
# at every start (a zip's __main__ has no cached bytecode): only the start path lives here. Everything here parses on
# Python 2.7 and runs to the version check on 3.6, so an old Python gets one line, not a traceback.
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
import stat  # noqa: E402   (os imported it already: free)

# A build folder holds MANIFEST (one line per folder and file, written at unpack: what lstat said then and the file's
# sha256) and IN_USE, which every process running from the build holds a shared lock on, so that a tidy start removes
# only builds no process uses.
MANIFEST = ".manifest"
IN_USE = ".in-use"
SLOW = "each start reads its modules from the zip, about 6x slower"
FROM_ZIP = None            # why this start runs from the zip (node.py's --check says it), None when it does not
_held = []                 # the open IN_USE file: its lock lasts as long as the process


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
    """(the folder this build runs from, None) or (None, why it runs from the zip). The start path, a build that
    verifies, costs an lstat per file; unpacking, repairing and tidying are pyz_unpack's."""
    root = cache_root()
    if root is None:
        return None, "no cache folder (neither XDG_CACHE_HOME nor HOME names one)"
    folder = os.path.join(root, "%s-%s" % (VERSION, BUILD))
    if not_private(root, follow=True) is None and hold(folder) and damage(folder) is None:
        if untidy(root, folder):
            import pyz_unpack
            pyz_unpack.tidy(sys.modules[__name__], root, folder, locked_already=False)
        return folder, None
    release()
    import pyz_unpack
    return pyz_unpack.unpacked(sys.modules[__name__], pyz, root, folder)


def not_private(path, status=None, kind=stat.S_ISDIR, follow=False):
    """None when `path` is ours alone: of its kind (a link only where `follow`: the cache root may be one), our
    user's, no one else may write to it."""
    if os.name == "nt":
        return None
    try:
        status = status or (os.stat(path) if follow else os.lstat(path))
    except OSError:
        return "%s is missing" % path
    if not kind(status.st_mode):
        return "%s is a link or not a %s" % (path, "folder" if kind is stat.S_ISDIR else "file")
    if status.st_uid != os.getuid():
        return "%s belongs to another user (uid %d)" % (path, status.st_uid)
    if status.st_mode & 0o022:
        return "%s may be written by others (mode %03o)" % (path, status.st_mode & 0o777)
    return None


def damage(folder):
    """None when `folder` is a whole build of ours, as unpacked: every folder and file in its manifest there, ours
    alone, and each file as lstat saw it at unpack (size, mtime, ctime, inode: ctime no user can set back), else of
    the sha256 written then. Else what is wrong."""
    problem = not_private(folder)
    if problem:
        return problem
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as manifest:
            entries = manifest.read().splitlines()
    except (OSError, ValueError):
        return "it has no readable manifest"
    if not entries or not_private(os.path.join(folder, MANIFEST), kind=stat.S_ISREG):
        return "its manifest is empty or not ours alone"
    uid = os.getuid() if os.name != "nt" else None
    lstat, prefix = os.lstat, folder + os.sep
    for entry in entries:
        try:
            kind, seen, digest, name = entry.split(" ", 3)
            status = lstat(prefix + name)
        except ValueError:
            return "its manifest is damaged"
        except OSError:
            return "%s is missing" % name
        is_kind = stat.S_ISREG if kind == "f" else stat.S_ISDIR
        if not is_kind(status.st_mode) or uid is not None and (status.st_uid != uid or status.st_mode & 0o022):
            return not_private(prefix + name, status, is_kind) or "%s is a link or not a file" % name
        if kind == "f" and seen != stamp(status) and digest != sha256(prefix + name):
            return "%s has changed" % name
    return None


def stamp(status):
    return "%d:%d:%d:%d" % (status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino)


def sha256(path):
    import hashlib
    try:
        with open(path, "rb") as data:
            return hashlib.sha256(data.read()).hexdigest()
    except OSError:
        return None


def hold(folder):
    """Take a shared lock on the build's IN_USE for this process's life (before the build is verified, so a tidy
    start cannot remove it between the two); False when the build has none."""
    try:
        handle = open(os.path.join(folder, IN_USE), "rb")
    except OSError:
        return False
    try:
        import fcntl
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
    except (ImportError, OSError):       # Windows, or a file system without locks: nothing is ever removed in use
        pass
    release()
    _held.append(handle)
    return True


def release():
    while _held:
        _held.pop().close()


def untidy(root, current):
    """Whether the cache folder holds a scratch folder (a start died, or one is unpacking) or more than one build
    besides this one: then pyz_unpack tidies it. Never on Windows."""
    if os.name == "nt":
        return False
    try:
        names = os.listdir(root)
    except OSError:
        return False
    ours = os.path.basename(current)
    others = [name for name in names if name != ours and not name.startswith(".") and "-" in name]
    return len(others) > 1 or any(name.startswith(".") and name.endswith(".tmp") for name in names)


def say(line):
    if sys.stderr is not None:           # spawned with stderr closed (2>&-): the server goes on without it
        sys.stderr.write("[mero-mcp] %s\n" % line)


def carry_system_ca(pyz):
    """Run from the zip, requests would have certifi unpack its CA file into the temp folder at every start, and
    nothing removes it (the server leaves by os._exit). Point certifi at the system's bundle instead, else at its
    own file inside the zip, which requests unpacks only when an https node is verified, once for all starts."""
    import mero_node_http
    import certifi.core
    certifi.core._CACERT_PATH = mero_node_http.system_ca_bundle() or os.path.join(pyz, "certifi", "cacert.pem")


def main():
    global FROM_ZIP
    pyz = archive()
    folder, FROM_ZIP = unpacked(pyz)
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != pyz]
    sys.path.insert(0, folder or pyz)
    if folder is not None:
        import mero_mcp
        return mero_mcp.main()
    FROM_ZIP = "%s: %s" % (SLOW, FROM_ZIP)
    carry_system_ca(pyz)                   # before requests is imported: it reads certifi's path once
    import mero_mcp
    if not set(mero_mcp.ACTIONS).intersection(sys.argv[1:]):    # a server's start (--check says it in its report)
        say("runs from %s itself, not unpacked (%s)" % (pyz, FROM_ZIP))
    return mero_mcp.main()


if __name__ == "__main__":
    sys.exit(main())
