# mero-mcp.pyz's __main__ (packaging/build.py writes it in with the build's VERSION and BUILD): check the Python, unpack
# the pyz once into a per-build cache folder, precompiled, and run the server from there; where no cache folder can be
# had, or a build will not verify after unpacking, run from the zip as is and say why. Everything here parses on
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
# sha256) and IN_USE, which every process running from the build holds a shared lock on, so a tidy start removes
# only builds no process uses. Scratch folders (".<build>.<random>.tmp") are made and removed under the root's LOCK.
MANIFEST = ".manifest"
IN_USE = ".in-use"
LOCK = ".lock"
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
    """(the folder this build runs from, None) or (None, why it runs from the zip). The fast path, a build that
    verifies, costs an lstat per file; everything else happens under the root's lock."""
    root = cache_root()
    if root is None:
        return None, "no cache folder (neither XDG_CACHE_HOME nor HOME names one)"
    folder = os.path.join(root, "%s-%s" % (VERSION, BUILD))
    if not_private(root, follow=True) is None and hold(folder) and damage(folder) is None:
        tidy(root, folder, locked_already=False)
        return folder, None
    release()
    try:
        made(root)
    except OSError as error:
        return None, "the cache folder %s cannot be made (%s)" % (root, error.strerror or error)
    problem = not_private(root, follow=True)
    if problem:
        return None, "%s (chmod 700 it, or remove it)" % problem
    with locked(root):
        problem = damage(folder)           # again: another start may have unpacked it meanwhile
        if problem:
            if os.path.lexists(folder):
                say("the unpacked build %s is unpacked anew: %s" % (folder, problem))
                discard(root, folder)
            try:
                unpack(pyz, root, folder)
            except Exception as error:     # the disk said no, or a zip this start cannot read: run from the zip
                return None, "unpacking into %s failed (%s)" % (root, getattr(error, "strerror", None) or error)
            problem = damage(folder)
            if problem:
                return None, "the build unpacked into %s does not verify (%s)" % (folder, problem)
        tidy(root, folder, locked_already=True)
    hold(folder)
    return folder, None


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
    for entry in entries:
        try:
            kind, seen, digest, name = entry.split(" ", 3)
        except ValueError:
            return "its manifest is damaged"
        path = folder + os.sep + name
        try:
            status = os.lstat(path)
        except OSError:
            return "%s is missing" % name
        is_kind = stat.S_ISDIR if kind == "d" else stat.S_ISREG
        if not is_kind(status.st_mode) or uid is not None and (status.st_uid != uid or status.st_mode & 0o022):
            return not_private(path, status, is_kind) or "%s is a link or not a file" % name
        if kind == "f" and seen != stamp(status) and digest != sha256(path):
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


def write_manifest(folder):
    """MANIFEST of `folder` as it is now (the last step of an unpack, before the rename)."""
    entries = []
    for parent, folders, files in os.walk(folder):
        for name in sorted(folders) + sorted(files):
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if name in folders:
                entries.append("d - - %s" % relative)
            elif relative != MANIFEST:
                entries.append("f %s %s %s" % (stamp(os.lstat(path)), sha256(path), relative))
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as manifest:
        manifest.write("\n".join(entries) + "\n")


def made(root):
    """The cache folder and any parent missing, each 0700 whatever the umask."""
    mask = os.umask(0o077)
    try:
        os.makedirs(root, 0o700, exist_ok=True)
    finally:
        os.umask(mask)


def unpack(pyz, root, folder):
    """Unpack into a scratch folder beside `folder`, precompile, write the manifest, and rename it into place: the
    build's name is only ever seen whole. Run under the root's lock; its files and folders are ours alone."""
    import compileall
    import contextlib
    import py_compile
    import shutil
    import tempfile
    import zipfile
    mask = os.umask(0o077)
    scratch = tempfile.mkdtemp(prefix=".%s-%s." % (VERSION, BUILD), suffix=".tmp", dir=root)
    try:
        with zipfile.ZipFile(pyz) as members:
            members.extractall(scratch)
        with contextlib.redirect_stdout(sys.stderr):     # stdout is the protocol's; compileall reports on it
            compileall.compile_dir(scratch, ddir=folder, quiet=2, workers=1,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        open(os.path.join(scratch, IN_USE), "w").close()
        write_manifest(scratch)
        os.rename(scratch, folder)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        os.umask(mask)


def discard(root, path):
    """Move `path` out of the way under a scratch name (at once), then remove it as far as we may."""
    import shutil
    import tempfile
    aside = tempfile.mktemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=root)
    try:
        os.rename(path, aside)
    except OSError:
        return
    if os.path.islink(aside):
        os.unlink(aside)
    else:
        shutil.rmtree(aside, ignore_errors=True)


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


class locked:
    """The root's exclusive lock (blocking, or `wait=False`: .taken says whether it was had); a no-op where files
    cannot be locked."""

    def __init__(self, root, wait=True):
        self.root, self.wait, self.handle, self.taken = root, wait, None, False

    def __enter__(self):
        try:
            import fcntl
            self.handle = os.fdopen(os.open(os.path.join(self.root, LOCK), os.O_WRONLY | os.O_CREAT, 0o600), "wb")
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
            self.taken = True
        except (ImportError, OSError):
            self.taken = self.wait
        return self

    def __exit__(self, *_):
        if self.handle:
            self.handle.close()


def tidy(root, current, locked_already):
    """Remove scratch folders left by starts that died, and builds no process uses but the current and the one
    before it (by age). Only under the root's lock (no unpack is then in progress); on Windows, never."""
    if os.name == "nt":
        return
    try:
        names = os.listdir(root)
    except OSError:
        return
    ours = os.path.basename(current)
    scratch = [name for name in names if name.startswith(".") and name.endswith(".tmp")]
    builds = [name for name in names if name != ours and not name.startswith(".") and "-" in name]
    if not scratch and len(builds) <= 1:
        return
    if locked_already:
        clear(root, scratch, builds)
        return
    with locked(root, wait=False) as lock:
        if lock.taken:
            clear(root, scratch, builds)


def clear(root, scratch, builds):
    for name in scratch:
        discard(root, os.path.join(root, name))

    def age(name):
        try:
            return os.lstat(os.path.join(root, name)).st_mtime_ns
        except OSError:
            return 0
    for name in sorted(builds, key=age, reverse=True)[1:]:    # the newest other build is kept: the previous
        path = os.path.join(root, name)
        if not_private(path) is None:
            unless_in_use(root, path)


def unless_in_use(root, folder):
    """Discard the build unless a process holds its IN_USE (builds of an older pyz have none), holding it
    exclusively meanwhile so that no start takes it up in between."""
    import fcntl
    try:
        handle = open(os.path.join(folder, IN_USE), "rb")
    except OSError:
        discard(root, folder)
        return
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        discard(root, folder)


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
    if folder is None:
        FROM_ZIP = "%s: %s" % (SLOW, FROM_ZIP)
        if "--check" not in sys.argv[1:]:          # --check says it in its report
            say("runs from %s itself, not unpacked (%s)" % (pyz, FROM_ZIP))
        carry_system_ca(pyz)
    import mero_mcp
    return mero_mcp.main()


if __name__ == "__main__":
    sys.exit(main())
