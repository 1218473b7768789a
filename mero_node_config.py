"""Where the node is and how to sign in to it: the environment, the state directory, URLs, the desktop app's
handoff file, node homes and their config.toml, the node directory (CALIMERO_NODES, named nodes, the default),
the token cache and its refresh lock, the authentication plan and the registry's address. Reads local files
only: nothing here sends a request.

Imports mero_node_errors; node.py and its other siblings import it."""
from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import re
import stat
import threading
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple
from urllib.parse import urlsplit

from mero_node_errors import log, NodeError

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"

DEFAULT_TIMEOUT = 10.0
LOCK_STALE_SECONDS = 30.0                # refresh lock protocol (§1.2)
LOCK_POLL_SECONDS = 0.05
LOCAL_FILE_LIMIT = 1 << 20               # agent.json, tokens-*.json, config.toml hold a few KB; more is not one
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
# A config.toml `[server]` listen multiaddr (merod writes /ip4/127.0.0.1/tcp/2528 and /ip6/::1/tcp/2528), and the
# host each local one is reached at: an ip6-only node is not reached through `localhost` where it names ip4 alone.
LISTEN_TCP = re.compile(r"/(ip4|ip6|dns|dns4|dns6)/([^/]+)/tcp/(\d+)(?:/.*)?")
LOCAL_LISTEN = {"127.0.0.1": "localhost", "0.0.0.0": "localhost", "localhost": "localhost", "::1": "[::1]",
                "::": "[::1]"}


# ── Environment and the state directory (§1.1, §1.2) ─────────────────────────────────────────────

# {variable: the flag that set it} (mero_mcp.apply_flags): a flag is its variable, so this serves only what a message
# calls the setting (--check's "found by the --nodes flag").
SET_BY_FLAG: Dict[str, str] = {}


def said_as(variable: str) -> str:
    """The setting as the user gave it: `CALIMERO_NODES`, or "the --nodes flag" when that flag set it."""
    flag = SET_BY_FLAG.get(variable)
    return "the %s flag" % flag if flag else variable


def setting(env: Mapping[str, str], name: str) -> Optional[str]:
    """An environment value, trimmed; blank counts as unset (§1.1)."""
    value = env.get(name)
    if value is None:
        return None
    return str(value).strip() or None


def request_timeout(env) -> float:
    """CALIMERO_MCP_TIMEOUT: seconds a node request may take (default 10); for slow links and for tests."""
    seconds, problem = timeout_setting(env)
    if problem:
        _warn_once(problem)
    return seconds


MAX_TIMEOUT = 86400.0                    # a day: far longer and a socket's deadline overflows the platform's clock
TIMEOUT_FIX = "Set CALIMERO_MCP_TIMEOUT to a number of seconds, e.g. 30, or unset it for 10."


def timeout_setting(env) -> Tuple[float, Optional[str]]:
    """(the seconds CALIMERO_MCP_TIMEOUT gives, what is wrong with its value or None); --check reports the latter."""
    value = setting(env, "CALIMERO_MCP_TIMEOUT")
    if value is None:
        return DEFAULT_TIMEOUT, None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    shown = "CALIMERO_MCP_TIMEOUT=%s" % json.dumps(value[:40])
    if seconds > MAX_TIMEOUT:
        return MAX_TIMEOUT, "%s is more than a day; using %d s" % (shown, MAX_TIMEOUT)
    if not seconds > 0:                   # zero, negative, NaN or no number at all
        return DEFAULT_TIMEOUT, "%s is not a positive number of seconds; using %g" % (shown, DEFAULT_TIMEOUT)
    return seconds, None


MAX_RESPONSE_BYTES = 64 << 20            # what one node answer may hold unless CALIMERO_MCP_MAX_RESPONSE_BYTES says
RESPONSE_CAP_VARIABLE = "CALIMERO_MCP_MAX_RESPONSE_BYTES"
RESPONSE_CAP_FIX = "Set %s to a number of bytes, e.g. 134217728, or unset it for %d (64 MiB)." % (
    RESPONSE_CAP_VARIABLE, MAX_RESPONSE_BYTES)


def response_cap_setting(env) -> Tuple[int, Optional[str]]:
    """(the bytes one node answer may hold, what is wrong with CALIMERO_MCP_MAX_RESPONSE_BYTES or None)."""
    value = setting(env, RESPONSE_CAP_VARIABLE)
    if value is None:
        return MAX_RESPONSE_BYTES, None
    if value.isdigit() and int(value) > 0:
        return int(value), None
    return MAX_RESPONSE_BYTES, ("%s=%s is not a positive number of bytes; using %d"
                                % (RESPONSE_CAP_VARIABLE, json.dumps(value[:40]), MAX_RESPONSE_BYTES))


def response_cap(env) -> int:
    cap, problem = response_cap_setting(env)
    if problem:
        _warn_once(problem)
    return cap


def _home(env):
    return setting(env, "HOME") or os.path.expanduser("~")


def path_setting(env, name) -> Optional[str]:
    """A path from the environment with a leading `~` expanded, as a shell would have: hosts start the server
    without one, and a literal `~` folder would be made in whatever directory the host runs it from."""
    value = setting(env, name)
    if value and (value == "~" or value[:2] in ("~/", "~" + os.sep)):
        return os.path.join(_home(env), value[2:]) if value != "~" else _home(env)
    return os.path.expanduser(value) if value and value.startswith("~") else value


def node_home(env) -> str:
    return path_setting(env, "CALIMERO_NODE_HOME") or os.path.join(_home(env), ".calimero")


def state_dir(env) -> str:
    return path_setting(env, "CALIMERO_MCP_STATE_DIR") or os.path.join(_home(env), ".config", "calimero", "mcp")


def ensure_dir(path: str) -> str:
    """Create the state directory 0700 when first needed; an existing directory is left as its owner made it."""
    if not os.path.isdir(path):
        parent = os.path.dirname(os.path.abspath(path))
        if parent != path:
            ensure_dir(parent)           # every folder it creates is 0700 (§1.2 "recursive"), not the umask's
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if os.path.isdir(path):      # made by a process beside us
                return path
            raise NotADirectoryError(errno.ENOTDIR, "%s is a file, not a directory" % path) from None
        os.chmod(path, 0o700)            # mkdir's mode is filtered by the umask
    return path


class Unreadable(Exception):
    """A local file that is there but cannot be used; the message is what follows its path in a sentence."""


def read_local(path: str, limit: int = LOCAL_FILE_LIMIT) -> bytes:
    """A small regular file's bytes. FileNotFoundError and NotADirectoryError pass through (nothing there);
    anything else is Unreadable: a FIFO would block the server for good, a huge file is not one of ours."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as error:
        raise Unreadable("cannot be read (%s)" % (error.strerror or error)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("is a directory" if stat.S_ISDIR(info.st_mode) else "is not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise Unreadable("cannot be read (%s)" % (error.strerror or error)) from None
    finally:
        os.close(fd)
    if size > limit:
        raise Unreadable("is larger than %d KB" % (limit // 1024))
    return b"".join(chunks)


def read_local_json(path: str):
    """A small JSON file's value (a leading BOM allowed); None when absent; Unreadable otherwise."""
    try:
        raw = read_local(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the decoder's depth
        raise Unreadable("is not valid JSON") from None


_logged = set()
_logged_lock = threading.Lock()


def _warn_once(message):
    """Discovery re-runs on every connect attempt; say each thing once per process."""
    with _logged_lock:
        if message in _logged:
            return
        _logged.add(message)
    log.warning("%s", message)


# ── URLs ──────────────────────────────────────────────────────────────────────────────────────────

def display_url(url: str) -> str:
    """A URL fit for a message: no query string, fragment or userinfo (they may carry credentials, §6)."""
    if "@" in url:                       # request paths are percent-encoded, so an `@` marks userinfo, and a
        return _without_secrets(url)     # password with `/`, `?` or `#` in it would fool urlsplit
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return _without_secrets(url)
    if not parts.scheme or not host:
        return _without_secrets(url)
    host = "[%s]" % host if ":" in host else host
    netloc = host if port is None else "%s:%d" % (host, port)
    return "%s://%s%s" % (parts.scheme, netloc, parts.path)


def _without_secrets(url: str) -> str:
    """For a URL urlsplit cannot be trusted with: what follows the last `@`, without query and fragment."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    rest = rest.rsplit("@", 1)[-1].split("?", 1)[0].split("#", 1)[0]
    return scheme + separator + rest


def url_extras(value: str) -> List[str]:
    """What a node address must not carry: credentials, a query, a fragment (requests would send userinfo as
    HTTP Basic in place of the Bearer token, and a query would swallow every path appended to the base)."""
    found = [("user:password@", "@"), ("a query (?...)", "?"), ("a fragment (#...)", "#")]
    return [what for what, mark in found if mark in value]


def _origin(value) -> str:
    """What the handoff warning may show of a URL (§1.2): the origin only, or the scheme alone."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except (AttributeError, ValueError):
        return "an unparseable url"
    scheme = parts.scheme.lower()
    if not scheme:
        return "an unparseable url"
    if scheme not in DEFAULT_PORTS:
        return scheme + ":"
    host = parts.hostname
    if not host:
        return "an unparseable url"
    host = "[%s]" % host if ":" in host else host
    return "%s://%s%s" % (scheme, host, ":%d" % port if port and port != DEFAULT_PORTS[scheme] else "")


def is_loopback_url(value) -> bool:
    """Only a loopback http(s) URL may come from the handoff file (§1.2)."""
    try:
        parts = urlsplit(value.strip())
        parts.port
    except (AttributeError, ValueError):
        return False
    return parts.scheme.lower() in ("http", "https") and (parts.hostname or "") in LOOPBACK_HOSTS


def same_node(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two base URLs name the same node (every loopback spelling is the same host)."""
    if not a or not b:
        return False
    try:
        pa, pb = urlsplit(a.rstrip("/")), urlsplit(b.rstrip("/"))
        ports = (pa.port, pb.port)
    except ValueError:
        return a.rstrip("/") == b.rstrip("/")

    def host(parts):
        name = (parts.hostname or "").lower()
        return "localhost" if name in LOOPBACK_HOSTS else name
    return (pa.scheme.lower(), host(pa), ports[0], pa.path) == (pb.scheme.lower(), host(pb), ports[1], pb.path)


def _checked_node_url(value: str, label: str = "CALIMERO_NODE_URL") -> str:
    """The node's address from CALIMERO_NODE_URL (or what `label` names); refused when it is not http(s), or when
    it carries credentials, a query or a fragment (messages show it only through display_url), or holds a control
    character."""
    control = next((index for index, c in enumerate(value) if ord(c) < 32 or 127 <= ord(c) < 160), None)
    if control is not None:               # urlsplit drops tabs and line breaks silently: another address
        fix = "Set %s to the node's address alone, e.g. http://localhost:2528, typed without it." % label
        raise NodeError("%s holds a control character (%s at position %d), which no address has. %s"
                        % (label, json.dumps(value[control]), control + 1, fix), fix=fix)
    extras = url_extras(value)
    if extras:                            # first: with a password in it, urlsplit may misread the rest
        fix = ("Set %s to the node's address alone (%s), and give credentials in CALIMERO_USERNAME "
               "and CALIMERO_PASSWORD, or CALIMERO_AUTH_TOKEN." % (label, display_url(value)))
        raise NodeError("%s carries %s, which this server refuses: it must hold only the node's "
                        "address. %s" % (label, " and ".join(extras), fix), fix=fix)
    fix = "Set %s to the node's address, e.g. http://localhost:2528." % label
    if "://" not in value:               # the usual slip: host and port without the scheme
        fix = "Set %s with its scheme: http://%s." % (label, display_url(value).rstrip("/"))
    try:
        parts = urlsplit(value)
    except ValueError:
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise NodeError("%s (%s) is not an http(s) URL" % (label, display_url(value)), fix=fix)
    problem = port_problem(parts)
    if problem:
        raise NodeError("%s (%s) has %s" % (label, display_url(value), problem), fix=fix)
    segments = parts.path.split("/")
    for index, segment in enumerate(segments):
        if segment in NODE_ROUTES:       # a page's address copied whole: every request would 404 under it
            fix = "Set %s to the node's base address, %s://%s%s." % (
                label, parts.scheme, parts.netloc, "/".join(segments[:index]).rstrip("/"))
            raise NodeError("%s (%s) reaches into the node's /%s, a path this server adds itself. %s"
                            % (label, display_url(value), segment, fix), fix=fix)
    return value.rstrip("/")


NODE_ROUTES = ("admin-api", "admin-dashboard", "jsonrpc")     # node-api.md §1.1; a proxy prefix goes before them


def port_problem(parts) -> Optional[str]:
    """What is wrong with a split URL's port, or None (urlsplit's own ValueError does not say)."""
    try:
        port = parts.port
    except ValueError:
        port = None
    else:
        if port is None or 0 < port < 65536:
            return None
    text = parts.netloc.rpartition("]")[2].rpartition(":")[2]
    if not (text.isascii() and text.isdigit()):
        return "an invalid port (%s)" % text
    return "port %d, which is out of range (1-65535)" % int(text)


# ── The desktop app's handoff file (§1.2) ─────────────────────────────────────────────────────────

class Handoff(NamedTuple):
    path: str
    node_url: Optional[str]
    access_token: str
    refresh_token: str


def read_handoff(directory: str) -> Tuple[Optional[Handoff], Optional[str]]:
    """(the handoff, None), or (None, why it was ignored); (None, None) when there is no file.

    The file belongs to the desktop app: read only, never rewritten. A remote `nodeUrl` voids the whole file,
    token included, and the warning shows the origin only — never the token.
    """
    path = os.path.join(directory, "agent.json")
    try:
        data = read_local_json(path)
    except Unreadable as problem:
        return _ignored("%s %s; ignoring it." % (path, problem))
    if data is None:
        return None, None
    data = data if isinstance(data, dict) else {}
    node_url = data.get("nodeUrl")
    if node_url is not None and not is_loopback_url(node_url):
        return _ignored("%s points at %s, which is not a local node; ignoring the file." % (path, _origin(node_url)))
    if node_url is not None and url_extras(node_url):
        return _ignored("%s gives a nodeUrl that carries %s; ignoring the file." % (path, " and ".join(
            url_extras(node_url))))
    token = data.get("accessToken")
    if not isinstance(token, str) or not token.strip():
        return _ignored("%s has no accessToken; ignoring it." % path)
    unusable = token_problem(token.strip())
    if unusable:
        return _ignored("%s gives an accessToken that %s; ignoring it." % (path, unusable))
    refresh = data.get("refreshToken")
    refresh = refresh.strip() if isinstance(refresh, str) else ""
    url = node_url.strip().rstrip("/") if node_url is not None else None
    return Handoff(path, url, token.strip(), refresh), None


def _ignored(reason):
    _warn_once(reason)
    return None, reason


# ── Discovery (§1.3) ──────────────────────────────────────────────────────────────────────────────

class Location(NamedTuple):
    url: str
    name: Optional[str]                  # None unless a node directory or CALIMERO_NODE_NAME names it
    source: str                          # env, handoff, named, config-scan or probe


def configured_name(env, url) -> Optional[str]:
    """The node directory whose config gives this URL, as list_nodes matches them; None unless exactly one does
    (two directories on one port cannot both be the node answering)."""
    names = [name for name, configured in configured_nodes(env) if same_node(configured, url)]
    return names[0] if len(names) == 1 else None


def _configured_location(env, name) -> Optional[Location]:
    home, entries = node_home(env), node_dirs(env)
    nodes = [(entry.name, entry.url) for entry in entries if entry.url]
    if name:
        for entry in entries:
            if entry.name == name:
                if entry.url:
                    return Location(entry.url, entry.name, "named")
                raise NodeError('Node "%s" in %s cannot be used: %s.' % (name, home, entry.problem), fix=CONFIG_FIX)
        available = ", ".join(n for n, _ in nodes) or "(none)"
        raise NodeError('Node "%s" not found in %s. Available: %s%s' % (name, home, available, _home_note(env)),
                        fix="Set CALIMERO_NODE_NAME to one of the available names, or unset it.")
    if len(nodes) == 1:
        return Location(nodes[0][1], nodes[0][0], "config-scan")
    for node_name, url in nodes:
        if node_name == "default":
            return Location(url, node_name, "config-scan")
    if nodes:
        listed = ", ".join("%s (%s)" % pair for pair in nodes)
        raise NodeError("Several nodes found in %s: %s. Set CALIMERO_NODE_NAME or CALIMERO_NODE_URL."
                        % (home, listed), fix="Set CALIMERO_NODE_NAME to the node this agent should use.")
    return None


CONFIG_FIX = ('Give the node\'s config.toml a [server] listen list of local addresses, as merod init writes it: '
              'listen = ["/ip4/127.0.0.1/tcp/2528"]; or set CALIMERO_NODE_URL to the node\'s address.')


def _home_note(env) -> str:
    """What a discovery error adds when CALIMERO_NODE_HOME names no directory: a typo would go unseen."""
    home = node_home(env)
    if not setting(env, "CALIMERO_NODE_HOME") or os.path.isdir(home):
        return ""
    return " CALIMERO_NODE_HOME (%s) %s." % (home, "is a file, not a directory" if os.path.exists(home)
                                               else "does not exist")


class NodeDir(NamedTuple):
    name: str
    url: Optional[str]
    problem: Optional[str]               # why its config.toml gives no URL: a sentence naming the file


def node_dirs(env: Mapping[str, str]) -> List[NodeDir]:
    """Every immediate subdirectory of the node home holding a config.toml, with its node's URL or why none."""
    home = node_home(env)
    try:
        names = sorted(os.listdir(home))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(home, name, "config.toml")
        try:
            url, problem = config_url(read_local(path).decode("utf-8-sig", "replace"))
        except (FileNotFoundError, NotADirectoryError):
            continue                      # a file, or a directory that is no node's
        except Unreadable as unreadable:
            url, problem = None, str(unreadable)
        found.append(NodeDir(name, url, problem and "%s %s" % (path, problem)))
    return found


def configured_nodes(env: Mapping[str, str]) -> List[Tuple[str, str]]:
    """[(name, url)] for every immediate subdirectory of the node home whose config.toml gives a local address."""
    return [(entry.name, entry.url) for entry in node_dirs(env) if entry.url]


# ── The node directory: named nodes, multi-node mode, the default node ───────────────────────────

NODES_VARIABLE = "CALIMERO_NODES"
MULTI_NODE_VARIABLE = "CALIMERO_MCP_MULTI_NODE"
MULTI_NODE_OFF = ("off", "0", "false", "no")
NODE_NAME = re.compile(r"[A-Za-z0-9_.-]+\Z")
READ_ONLY_MARK = re.compile(r"\s*\(ro\)\Z", re.IGNORECASE)
NODES_FIX = ('Write CALIMERO_NODES as comma-separated name=url entries, each optionally followed by " (ro)": '
             "node1=http://127.0.0.1:2528,prod=https://n.example.com (ro)")


class NamedNode(NamedTuple):
    name: str
    url: str
    read_only: bool                      # a " (ro)" entry: writes aimed at it are refused before they are sent
    source: str                          # "CALIMERO_NODES" or "home"
    home: Optional[str]                  # a node home's directory (the one holding its config.toml), else None


class NodeDirectory(NamedTuple):
    """What the configuration names. `nodes`: CALIMERO_NODES entries in their order, then node homes by name (a
    home named like an entry is that entry). `multi`: multi-node mode. `default`: in multi mode, the node a call
    without `node` runs on; in single mode the node CALIMERO_NODES picks, or None: discover() decides, as before
    there was a directory (CALIMERO_NODE_URL, the handoff file, one node home, the probe)."""
    nodes: Tuple[NamedNode, ...]
    default: Optional[NamedNode]
    multi: bool

    def named(self, name: str) -> Optional[NamedNode]:
        return next((node for node in self.nodes if node.name == name), None)


def parse_nodes(value: Optional[str]) -> List[NamedNode]:
    """CALIMERO_NODES' entries; a bad one raises NodeError with one line naming it (never its credentials).
    Blank entries (a trailing comma) are skipped; names differing only in case count as the same name."""
    found: List[NamedNode] = []
    for raw in (value or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        marked = READ_ONLY_MARK.search(entry)
        text = entry[:marked.start()].rstrip() if marked else entry
        name, separator, url = (part.strip() for part in text.partition("="))
        if not separator:
            raise NodeError('%s entry "%s" is not name=url' % (NODES_VARIABLE, display_url(entry)), fix=NODES_FIX)
        if not NODE_NAME.match(name):
            raise NodeError("%s entry %s has a name outside [A-Za-z0-9_.-]+" % (
                NODES_VARIABLE, json.dumps(name + "=" + display_url(url))), fix=NODES_FIX)
        twin = next((node.name for node in found if node.name.lower() == name.lower()), None)
        if twin is not None:
            said = '"%s" twice' % name if twin == name else '"%s" and "%s", which differ only in case' % (twin, name)
            raise NodeError("%s names %s" % (NODES_VARIABLE, said), fix="Give each node its own name.")
        if any(c.isspace() for c in url):          # "(rw)" or a typo'd mark would become part of the host
            raise NodeError('%s entry "%s" has a space in its URL (%s); only " (ro)" may follow it' % (
                NODES_VARIABLE, name, display_url(url)), fix=NODES_FIX)
        url = _checked_node_url(url, '%s entry "%s"' % (NODES_VARIABLE, name))
        found.append(NamedNode(name, url, bool(marked), NODES_VARIABLE, None))
    return found


def nodes_setting_problem(env: Mapping[str, str]) -> Optional[str]:
    """The one line start-up and --check say for a bad CALIMERO_NODES entry, or None."""
    try:
        parse_nodes(setting(env, NODES_VARIABLE))
    except NodeError as error:
        return str(error)
    return None


def multi_node_allowed(env: Mapping[str, str]) -> bool:
    """CALIMERO_MCP_MULTI_NODE=off (or 0, false, no) forces single mode; anything else leaves it to the count."""
    return (setting(env, MULTI_NODE_VARIABLE) or "").lower() not in MULTI_NODE_OFF


def named_nodes(env: Mapping[str, str]) -> List[NamedNode]:
    """CALIMERO_NODES' entries, then the node homes whose config.toml gives an address, by name (discovery's
    node_dirs: a home without one is passed over, as today); an entry wins over a home of its name."""
    entries = parse_nodes(setting(env, NODES_VARIABLE))
    taken = {node.name.lower() for node in entries}
    home = node_home(env)
    homes = [NamedNode(entry.name, entry.url, False, "home", os.path.join(home, entry.name))
             for entry in node_dirs(env) if entry.url and entry.name.lower() not in taken]
    return entries + homes


def node_directory(env: Mapping[str, str]) -> NodeDirectory:
    """The named nodes, the default node and the mode (issue 33). Multi-node mode: two or more named nodes, unless
    CALIMERO_MCP_MULTI_NODE is off, or CALIMERO_NODE_URL names none of them (then it keeps meaning exactly that
    node). The default: CALIMERO_NODE_NAME, else the named node at CALIMERO_NODE_URL, else the first CALIMERO_NODES
    entry, else the first node home by name. Raises NodeError (one line) for a bad CALIMERO_NODES entry, a bad
    CALIMERO_NODE_URL, or a CALIMERO_NODE_NAME that names none of several named nodes."""
    nodes = tuple(named_nodes(env))
    explicit = setting(env, "CALIMERO_NODE_URL")
    url = _checked_node_url(explicit) if explicit else None
    at_url = next((node for node in nodes if same_node(node.url, url)), None) if url else None
    if url and at_url is None:
        return NodeDirectory(nodes, None, False)     # CALIMERO_NODE_URL alone: that node, found by discover()
    multi = len(nodes) >= 2 and multi_node_allowed(env)
    if not multi and not setting(env, NODES_VARIABLE):
        return NodeDirectory(nodes, None, False)     # no CALIMERO_NODES: discovery as before
    return NodeDirectory(nodes, _default_node(env, nodes, at_url), multi)


def _default_node(env, nodes, at_url) -> Optional[NamedNode]:
    name = setting(env, "CALIMERO_NODE_NAME")
    if name:
        chosen = next((node for node in nodes if node.name == name), None)
        if chosen is None:
            raise NodeError('CALIMERO_NODE_NAME "%s" names no node; the named nodes are: %s' % (
                name, ", ".join(node.name for node in nodes) or "(none)"),
                fix="Set CALIMERO_NODE_NAME to one of the named nodes, or unset it.")
        return chosen
    if at_url is not None:
        return at_url
    return nodes[0] if nodes else None            # CALIMERO_NODES entries come first, homes follow by name


def config_url(text: str) -> Tuple[Optional[str], Optional[str]]:
    """(the URL of the node a merod config.toml describes, None) or (None, why it gives none). The URL comes from
    `listen` in `[server]` (not `[swarm]`): its first ip4 loopback (or any) address, else its first ip6 one."""
    try:
        listens = [value for path, value in toml_entries(text) if path == ("server", "listen")]
    except TomlError as error:
        return None, "is not valid TOML (%s)" % error
    except RecursionError:
        return None, "is not valid TOML (arrays nested too deep)"
    if len(listens) != 1:
        return None, ("sets listen in [server] more than once" if listens
                      else "has no listen addresses in its [server] table")
    addresses = listens[0]
    if not isinstance(addresses, list) or not all(isinstance(address, str) for address in addresses):
        return None, 'has a [server] listen that is not a list of addresses (merod writes listen = ["/ip4/127.0.0.1' \
                     '/tcp/2528"])'
    local = []
    for address in addresses:
        found = LISTEN_TCP.fullmatch(address.strip())
        host = found and LOCAL_LISTEN.get(found.group(2).lower())
        if host and 0 < int(found.group(3)) < 65536:
            local.append((host, "http://%s:%d" % (host, int(found.group(3)))))
    if local:
        return sorted(local, key=lambda pair: pair[0] != "localhost")[0][1], None
    return None, "has no address in its [server] listen that this machine reaches locally (%s)" % (
        ", ".join(json.dumps(address) for address in addresses[:4]) or "the list is empty")


# ── config.toml: just enough TOML to read a merod config (Python 3.9 has no tomllib) ──────────────

class TomlError(ValueError):
    """Text that is not TOML; the message names the line."""


class TomlScalar(NamedTuple):
    """A value that is neither a string nor an array nor a table, as written (a number, a boolean, a date)."""
    text: str


_TOML_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TOML_STRINGS = (                        # (opening, the whole string, whether escapes apply); single-line ones last
    ('"""', re.compile(r'"""\n?((?:[^"\\]|\\.|"(?!""))*)"""', re.S), True),
    ("'''", re.compile(r"'''\n?(.*?)'''", re.S), False),
    ('"', re.compile(r'"((?:[^"\\\n]|\\.)*)"'), True),
    ("'", re.compile(r"'([^'\n]*)'"), False),
)
_TOML_ESCAPE = re.compile(r'\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|([btnfre"\\])|[ \t]*\n\s*)')
_TOML_CHARS = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", "e": "\x1b", '"': '"', "\\": "\\"}
_TOML_SCALAR = re.compile(r"[^,\]}#\n]*")


def toml_entries(text: str):
    """(key path, value) for every key a TOML document sets, table headers and inline tables expanded. Strings
    and arrays are read; any other value is a TomlScalar. Raises TomlError."""
    scan = _TomlScanner(text)
    table = ()
    while scan.blank(newlines=True):
        if scan.take("["):
            closing = "]]" if scan.take("[") else "]"
            table = scan.key()
            scan.expect(closing)
        else:
            path = table + scan.key()
            scan.expect("=")
            yield from _toml_flattened(path, scan.value())
        scan.blank()
        if scan.more() and not scan.take("\n"):
            raise scan.error("expected the end of the line")


def _toml_flattened(path, value):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _toml_flattened(path + key, inner)
    else:
        yield path, value


class _TomlScanner:
    def __init__(self, text):
        self.text = text.lstrip("\ufeff").replace("\r\n", "\n")
        self.at = 0

    def more(self):
        return self.at < len(self.text)

    def error(self, what):
        return TomlError("line %d: %s" % (self.text.count("\n", 0, self.at) + 1, what))

    def take(self, token):
        if self.text.startswith(token, self.at):
            self.at += len(token)
            return True
        return False

    def expect(self, token):
        self.blank()
        if not self.take(token):
            raise self.error("expected %s" % token)

    def blank(self, newlines=False):
        """Skip spaces, tabs and a comment (and line ends, when `newlines`); whether any text is left."""
        while self.more():
            char = self.text[self.at]
            if char in " \t" or (newlines and char == "\n"):
                self.at += 1
            elif char == "#":
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end
            else:
                break
        return self.more()

    def key(self):
        parts = []
        while True:
            self.blank()
            bare = _TOML_BARE_KEY.match(self.text, self.at)
            if bare:
                self.at = bare.end()
                parts.append(bare.group())
            else:
                part = self.string(_TOML_STRINGS[2:])
                if part is None:
                    raise self.error("expected a key")
                parts.append(part)
            self.blank()
            if not self.take("."):
                return tuple(parts)

    def string(self, kinds=_TOML_STRINGS):
        for opening, pattern, escaped in kinds:
            if self.text.startswith(opening, self.at):
                found = pattern.match(self.text, self.at)
                if not found:
                    raise self.error("a string that does not end")
                self.at = found.end()
                return _TOML_ESCAPE.sub(_toml_unescape, found.group(1)) if escaped else found.group(1)
        return None

    def value(self):
        self.blank()
        text = self.string()
        if text is not None:
            return text
        if self.take("["):
            items = []
            while not self.closes("]", "an array"):
                items.append(self.value())
                if not self.closes("]", "an array", peek=True) and not self.take(","):
                    raise self.error("expected , or ] in an array")
            return items
        if self.take("{"):
            table = {}
            while not self.closes("}", "an inline table"):
                path = self.key()
                self.expect("=")
                table.update((inner, value) for inner, value in _toml_flattened(path, self.value()))
                if not self.closes("}", "an inline table", peek=True) and not self.take(","):
                    raise self.error("expected , or } in an inline table")
            return table
        scalar = _TOML_SCALAR.match(self.text, self.at)
        if not scalar.group().strip():
            raise self.error("expected a value")
        self.at = scalar.end()
        return TomlScalar(scalar.group().strip())

    def closes(self, closing, what, peek=False):
        """Whether `closing` comes next (taken unless `peek`), past blanks and line ends."""
        if not self.blank(newlines=True):
            raise self.error("%s that does not end" % what)
        return self.text.startswith(closing, self.at) if peek else self.take(closing)


def _toml_unescape(found):
    code = found.group(1) or found.group(2)
    if code:
        return chr(int(code, 16)) if int(code, 16) < 0x110000 else "\ufffd"
    return _TOML_CHARS[found.group(3)] if found.group(3) else ""


# ── Tokens: JWT claims, the cache file, the refresh lock (§1.2, §1.4) ─────────────────────────────

def jwt_claims(token: Optional[str]) -> Optional[Dict[str, Any]]:
    """A JWT's payload (unverified), or None when it cannot be read."""
    try:
        payload = token.split(".")[1]
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def jwt_claim(token: Optional[str], claim: str) -> Optional[float]:
    """A numeric claim (`iat`, `exp`) from a JWT's payload, or None when it cannot be read."""
    value = (jwt_claims(token) or {}).get(claim)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def has_expired(bundle: Dict[str, Any]) -> bool:
    """A cached bundle whose access token is past its `expires_at` (ms); unknown counts as still valid."""
    expires_at = bundle.get("expires_at")
    return isinstance(expires_at, (int, float)) and expires_at <= time.time() * 1000


def token_bundle(access: str, refresh: Optional[str]) -> Dict[str, Any]:
    """The cache's record: expiry from the JWT's `exp`, else an hour from now (§1.4)."""
    exp = jwt_claim(access, "exp")
    expires_at = int(exp * 1000) if exp is not None else int(time.time() * 1000) + 3600 * 1000
    return {"access_token": access, "refresh_token": refresh or "", "expires_at": expires_at}


def is_newer(injected_access: str, cached: Optional[Dict[str, Any]]) -> bool:
    """An injected token replaces the cache only when its `iat` is readably newer (§1.4): replaying a consumed
    refresh token would revoke the whole family, so an undecidable comparison keeps the cache."""
    if not cached:
        return True
    old, new = jwt_claim(cached.get("access_token"), "iat"), jwt_claim(injected_access, "iat")
    return old is not None and new is not None and new > old


BEARER_TOKEN = re.compile(r"[!-~]+")     # what an Authorization header carries: visible ASCII, no spaces


def token_problem(token: str) -> Optional[str]:
    """Why a string cannot be this server's bearer token (it would break the request, or be refused for a reason
    no message could name), or None. Never quotes the token."""
    if token[:7].lower() == "bearer ":
        return 'starts with "Bearer " (the word belongs to the header, not the token)'
    if not BEARER_TOKEN.fullmatch(token):
        return "is empty or holds a space, a line break or a non-ASCII character, which no token has"
    return None


def token_cache_path(directory: str, node_url: str, username: Optional[str]) -> str:
    import hashlib
    key = hashlib.sha256(("%s\0%s" % (node_url, username or "")).encode("utf-8")).hexdigest()[:16]
    return os.path.join(directory, "tokens-%s.json" % key)


STATE_DIR_FIX = "Point CALIMERO_MCP_STATE_DIR at a directory this user can write (it is created when missing)."


class TokenStore:
    """`tokens-<16 hex>.json`: {access_token, refresh_token, expires_at (ms)}, 0600, written atomically."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> Optional[Dict[str, Any]]:
        try:
            data = read_local_json(self.path)
        except Unreadable as problem:
            _warn_once("%s %s; ignoring it." % (self.path, problem))
            return None
        if data is None:
            return None
        keep_private(self.path)
        access = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(access, str) or token_problem(access):   # empty, or written by something else
            _warn_once("%s holds no usable access_token; ignoring it." % self.path)
            return None
        if not isinstance(data.get("refresh_token"), str):
            data["refresh_token"] = ""
        return data

    def write(self, bundle: Dict[str, Any]) -> None:
        """Write via `<path>.<pid>.tmp` + rename, so a reader never sees half a file. A failure is raised (§1.2): a
        rotated refresh token that only this process knows would be replayed by the next one, and a replay
        revokes the whole family."""
        tmp = "%s.%d.tmp" % (self.path, os.getpid())     # two servers logging in at once write side by side
        try:
            ensure_dir(os.path.dirname(self.path))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if hasattr(os, "fchmod"):        # a stale .tmp may have been created with other bits
                    os.fchmod(fd, 0o600)
                os.write(fd, json.dumps(bundle).encode("utf-8"))
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as error:
            _unlink_quietly(tmp)
            raise NodeError("Cannot save tokens to %s: %s" % (self.path, error.strerror or error),
                            fix=STATE_DIR_FIX) from None

    def clear(self) -> None:
        _unlink_quietly(self.path)

    def lock(self):
        ensure_dir(os.path.dirname(self.path))
        return file_lock(self.path + ".lock")


def keep_private(path: str) -> None:
    """A file of ours holding secrets that other users can read (written by an older release, copied, restored
    from a backup) is made 0600 again, and that is said once: refusing it would only force a new login."""
    if os.name == "nt":                  # no POSIX modes there; the profile directory's ACL is what protects it
        return
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            os.chmod(path, 0o600)
            _warn_once("%s was readable by other users (mode %03o); it is 0600 now" % (path, mode))
    except OSError as error:
        _warn_once("%s is readable by other users and cannot be made 0600: %s" % (path, error.strerror or error))


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


@contextlib.contextmanager
def file_lock(path: str, stale_after: float = LOCK_STALE_SECONDS, poll: float = LOCK_POLL_SECONDS):
    """The cross-process refresh lock (§1.2): exclusive create holding our pid; a lock older than
    `stale_after` or owned by a dead process is broken; otherwise poll. Always released."""
    while not _create_lock(path):
        state = _lock_state(path, stale_after)
        if state == "stale":
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:     # e.g. a directory in its place: waiting would never end
                raise _lock_error("is stale but cannot be removed (%s)" % (error.strerror or error), path)
        elif state == "held":
            time.sleep(poll)
    try:
        yield
    finally:
        _unlink_quietly(path)


def _lock_error(what, path) -> NodeError:
    fix = "Remove %s (no server may be refreshing a token then), or make the state directory writable." % path
    return NodeError("The token refresh lock %s %s. %s" % (path, what, fix), fix=fix)


def _create_lock(path) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError as error:
        raise _lock_error("cannot be created (%s)" % (error.strerror or error), path) from None
    try:
        os.write(fd, str(os.getpid()).encode("ascii"))
    finally:
        os.close(fd)
    return True


def _lock_state(path, stale_after) -> str:
    """"gone" (released meanwhile: retry now), "stale" or "held"."""
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "held"
    if age > stale_after:
        return "stale"
    try:
        with open(path, "rb") as handle:
            text = handle.read(32).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return "gone"
    except OSError:                      # another user's, or not a file: only its age can tell
        return "held"
    pid = int(text) if text.isdigit() else 0
    if pid <= 0:                         # still being written by its owner: not stale
        return "held"
    return "held" if _pid_alive(pid) else "stale"


def _pid_alive(pid) -> bool:
    if os.name == "nt":                  # os.kill(pid, 0) would send CTRL_C_EVENT there: trust the mtime
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):      # no such process; a number no pid can be
        return False
    except OSError:                      # EPERM: alive, just not ours
        return True
    return True


# ── Authentication plan (§1.4) ────────────────────────────────────────────────────────────────────

def auth_plan(env, handoff: Optional[Handoff], node_url: Optional[str], default: bool = True):
    """(mode, injected (access, refresh) or None), first that applies: handoff, token, credentials, none.

    The handoff token belongs to the handoff's node: it is used when the file names no node or names this one,
    never sent to a node found some other way (e.g. a remote CALIMERO_NODE_URL). With several nodes (issue 33) a
    node that is not the `default` takes no token of the environment (CALIMERO_AUTH_TOKEN, an unnamed handoff),
    and the username and password only when it is on this machine (loopback): they never travel to a remote one.
    """
    if handoff and ((handoff.node_url is None and default) or same_node(handoff.node_url, node_url)):
        return "handoff", (handoff.access_token, handoff.refresh_token)
    orphan = password_without_username(env)
    if orphan:
        _warn_once(orphan)
    token = setting(env, "CALIMERO_AUTH_TOKEN")
    if token and default:
        return "token", (token, setting(env, "CALIMERO_REFRESH_TOKEN") or "")
    if setting(env, "CALIMERO_USERNAME") and (setting(env, "CALIMERO_PASSWORD")
                                              or setting(env, "CALIMERO_PASSWORD_FILE")):
        if default or is_loopback_url(node_url):
            return "credentials", None
    return "none", None


ORPHAN_PASSWORD_FIX = "Set CALIMERO_USERNAME to the account the password belongs to, or unset the password."


def password_without_username(env) -> Optional[str]:
    """A password with no username to go with it is not a login: say so (the value itself never)."""
    if setting(env, "CALIMERO_USERNAME"):
        return None
    given = [name for name in ("CALIMERO_PASSWORD", "CALIMERO_PASSWORD_FILE") if setting(env, name)]
    if not given:
        return None
    return ("%s is set but CALIMERO_USERNAME is not, so there is no login and the password is not used"
            % " and ".join(given))


def read_password(env) -> str:
    """CALIMERO_PASSWORD, else the trimmed contents of CALIMERO_PASSWORD_FILE; a bad file is a clear error."""
    password = setting(env, "CALIMERO_PASSWORD")
    if password:
        return password
    path = path_setting(env, "CALIMERO_PASSWORD_FILE")
    fix = "Point CALIMERO_PASSWORD_FILE at a readable file holding the password, or set CALIMERO_PASSWORD."
    try:
        with open(path, encoding="utf-8-sig") as handle:          # a BOM (Windows editors) is no part of it
            password = handle.read(LOCAL_FILE_LIMIT + 1)            # not all of /dev/zero, or a log named by mistake
    except OSError as error:
        # The value is not echoed: a password pasted into the variable by mistake must not reach a log.
        raise NodeError("Cannot read the file CALIMERO_PASSWORD_FILE names: %s" % (error.strerror or error), fix=fix)
    except UnicodeDecodeError:
        raise NodeError("The file CALIMERO_PASSWORD_FILE names is not UTF-8 text", fix=fix)
    if len(password) > LOCAL_FILE_LIMIT:
        raise NodeError("The file CALIMERO_PASSWORD_FILE names is larger than %d KB, which no password is"
                        % (LOCAL_FILE_LIMIT // 1024), fix=fix)
    password = password.strip()
    if not password:
        raise NodeError("The file CALIMERO_PASSWORD_FILE names is empty", fix=fix)
    return password


def auth_advice(mode: Optional[str]) -> str:
    """The one thing to do when the node refuses this mode's credentials."""
    return {
        "handoff": "Reconnect the agent from the Calimero desktop app (Connect AI agent).",
        "token": "Set a fresh CALIMERO_AUTH_TOKEN (and CALIMERO_REFRESH_TOKEN).",
        "credentials": "Check CALIMERO_USERNAME and CALIMERO_PASSWORD; the account needs admin permission.",
    }.get(mode, "This node requires authentication: set CALIMERO_USERNAME and CALIMERO_PASSWORD "
                "(or CALIMERO_AUTH_TOKEN), or use Connect AI agent in the Calimero desktop app.")


def start_fix(env: Mapping[str, str], name: Optional[str], url: str, variable: Optional[str]) -> Optional[str]:
    """What to do about a node that does not answer (issue 42): the command that starts it when a node home on this
    machine holds it (the home of its name whose config gives this url, else the one home that does), with --home
    when the node home is not merod's default; else check the node at `url` and the `variable` naming it (None:
    nothing to say)."""
    homes = [entry for entry in node_dirs(env) if entry.url and same_node(entry.url, url)]
    home = next((entry for entry in homes if entry.name == name), homes[0] if len(homes) == 1 else None)
    if home is None:
        return variable and ("Check that the node at %s runs (start it on its machine), and that %s names the "
                             "right URL." % (display_url(url), said_as(variable)))
    where = node_home(env)
    flag = "" if os.path.normpath(where) == os.path.join(_home(env), ".calimero") else " --home %s" % where
    return "Start it: merod%s --node %s run (its home: %s)." % (flag, home.name, os.path.join(where, home.name))


def sign_in_fix(env: Mapping[str, str], name: Optional[str], url: Optional[str], default: bool, mode: str) -> str:
    """The variables that sign in to a node that refused the login (auth_plan's rules): the default node's mode's,
    else the username and password, which reach only nodes on this machine."""
    if default:
        return auth_advice(mode)
    if is_loopback_url(url):
        return ("Set CALIMERO_USERNAME and CALIMERO_PASSWORD (or CALIMERO_PASSWORD_FILE) to an admin account of "
                "node %s: they sign in to the default node and to nodes on this machine." % name)
    return ("Only the default node signs in to a remote node: make it the default (CALIMERO_NODE_NAME=%s) with "
            "CALIMERO_AUTH_TOKEN or CALIMERO_USERNAME and CALIMERO_PASSWORD." % name)


# ── The registry: where the node installs package@version from (§0.7) ──────────────────────────

REGISTRY_VARIABLE = "CALIMERO_REGISTRY_URL"


class RegistryPlace(NamedTuple):
    url: Optional[str]                   # the registry's base URL, None when there is none to reach
    source: str                          # CALIMERO_REGISTRY_URL, or the config.toml it was read from
    problem: Optional[str]               # why there is none: a sentence saying what to set


def registry_place(env: Mapping[str, str], node_name: Optional[str]) -> RegistryPlace:
    """The registry to browse: CALIMERO_REGISTRY_URL, else `[registry]` of the node's config.toml (`mode`
    "http" by default, `base_url` with no default; a dht node has no registry address to read)."""
    explicit = setting(env, REGISTRY_VARIABLE)
    if explicit:
        return RegistryPlace(explicit.strip().rstrip("/"), REGISTRY_VARIABLE, None)
    set_it = "set %s to the registry's base URL (the base_url the node fetches from)" % REGISTRY_VARIABLE
    none_found = RegistryPlace(None, REGISTRY_VARIABLE, "No registry address is known: this server found no node "
                               "directory with a config.toml for the node in use, so %s." % set_it)
    if not node_name:
        return none_found
    path = os.path.join(node_home(env), node_name, "config.toml")
    try:
        entries = dict(toml_entries(read_local(path).decode("utf-8-sig", "replace")))
    except FileNotFoundError:                   # a name without a home here: a remote node, or none made yet
        return none_found
    except (OSError, Unreadable, TomlError, RecursionError) as error:
        return RegistryPlace(None, path, "%s cannot be read for its [registry] (%s): %s." % (path, error, set_it))
    mode, base = entries.get(("registry", "mode"), "http"), entries.get(("registry", "base_url"))
    if mode == "dht":
        return RegistryPlace(None, path, '%s sets [registry] mode = "dht": this node resolves no package@version '
                             'and names no registry address, so install from a bundle path, or %s.' % (path, set_it))
    if not isinstance(base, str) or not base.strip():
        return RegistryPlace(None, path, "%s has no [registry] base_url, so the node cannot install by "
                             'package@version either: add base_url = "https://..." under [registry] (and restart '
                             "the node), or %s." % (path, set_it))
    return RegistryPlace(base.strip().rstrip("/"), path, None)
