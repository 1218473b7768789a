"""The pyz's unpacking, repairing and tidying (pyz_main.py, its __main__, imports this only when the build's cache
folder does not verify or wants tidying; `boot` is that module). Scratch folders (".<name>.<random>.tmp") are made
and removed only under the cache folder's LOCK, so whoever holds it knows every scratch folder there is stale."""
import os
import sys

LOCK = ".lock"


def unpacked(boot, pyz, root, folder):
    """Make the cache folder, and under its lock unpack the build anew unless another start just did; (folder, None),
    or (None, why it runs from the zip)."""
    try:
        made(root)
    except OSError as error:
        return None, "the cache folder %s cannot be made (%s)" % (root, error.strerror or error)
    problem = boot.not_private(root, follow=True)
    if problem:
        return None, "%s (chmod 700 it, or remove it)" % problem
    with locked(root):
        problem = boot.damage(folder)           # again: another start may have unpacked it meanwhile
        if problem:
            if os.path.lexists(folder):
                boot.say("the unpacked build %s is unpacked anew: %s" % (folder, problem))
                discard(root, folder)
            try:
                unpack(boot, pyz, root, folder)
            except Exception as error:     # the disk said no, or a zip this start cannot read: run from the zip
                return None, "unpacking into %s failed (%s)" % (root, getattr(error, "strerror", None) or error)
            problem = boot.damage(folder)
            if problem:
                return None, "the build unpacked into %s does not verify (%s)" % (folder, problem)
        tidy(boot, root, folder, locked_already=True)
    boot.hold(folder)
    return folder, None


def write_manifest(boot, folder):
    """MANIFEST of `folder` as it is now (the last step of an unpack, before the rename)."""
    entries = []
    for parent, folders, files in os.walk(folder):
        for name in sorted(folders) + sorted(files):
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if name in folders:
                entries.append("d - - %s" % relative)
            elif relative != boot.MANIFEST:
                entries.append("f %s %s %s" % (boot.stamp(os.lstat(path)), boot.sha256(path), relative))
    with open(os.path.join(folder, boot.MANIFEST), "w", encoding="utf-8") as manifest:
        manifest.write("\n".join(entries) + "\n")


def made(root):
    """The cache folder and any parent missing, each 0700 whatever the umask."""
    mask = os.umask(0o077)
    try:
        os.makedirs(root, 0o700, exist_ok=True)
    finally:
        os.umask(mask)


def unpack(boot, pyz, root, folder):
    """Unpack into a scratch folder beside `folder`, precompile, write the manifest, and rename it into place: the
    build's name is only ever seen whole. Run under the root's lock; its files and folders are ours alone."""
    import compileall
    import contextlib
    import py_compile
    import shutil
    import tempfile
    import zipfile
    mask = os.umask(0o077)
    scratch = tempfile.mkdtemp(prefix=".%s-%s." % (boot.VERSION, boot.BUILD), suffix=".tmp", dir=root)
    try:
        with zipfile.ZipFile(pyz) as members:
            members.extractall(scratch)
        with contextlib.redirect_stdout(sys.stderr):     # stdout is the protocol's; compileall reports on it
            compileall.compile_dir(scratch, ddir=folder, quiet=2, workers=1,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        open(os.path.join(scratch, boot.IN_USE), "w").close()
        write_manifest(boot, scratch)
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


def tidy(boot, root, current, locked_already):
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
        clear(boot, root, scratch, builds)
        return
    with locked(root, wait=False) as lock:
        if lock.taken:
            clear(boot, root, scratch, builds)


def clear(boot, root, scratch, builds):
    for name in scratch:
        discard(root, os.path.join(root, name))

    def age(name):
        try:
            return os.lstat(os.path.join(root, name)).st_mtime_ns
        except OSError:
            return 0
    for name in sorted(builds, key=age, reverse=True)[1:]:    # the newest other build is kept: the previous
        path = os.path.join(root, name)
        if boot.not_private(path) is None:
            unless_in_use(boot, root, path)


def unless_in_use(boot, root, folder):
    """Discard the build unless a process holds its IN_USE (builds of an older pyz have none), holding it
    exclusively meanwhile so that no start takes it up in between."""
    import fcntl
    try:
        handle = open(os.path.join(folder, boot.IN_USE), "rb")
    except OSError:
        discard(root, folder)
        return
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        discard(root, folder)
