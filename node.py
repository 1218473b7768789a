"""node.py — every byte that goes to or comes from the Calimero node (merod).

Discovery, authentication, the token cache shared with the Calimero desktop app and other local agents, the
cross-process refresh lock, one `requests.Session`, the admin API (every path, body and answer shape the server
uses: `Node`'s methods), and one exception (`NodeError`) whose message is what a person should read. Also
`check()`, the `mero-mcp --check` doctor.

`requests` is imported lazily (first HTTP call): the server's cold start must not pay for it.
Spec references: reference-behaviour.md (§1 configuration and auth, §2 endpoints, §6 error texts) and
node-api.md (§1.2 envelopes, §1.5 auth guard, §2 auth service, §4 JSON-RPC).
"""
from __future__ import annotations

import base64
import collections
import contextlib
import errno
import functools
import http
import itertools
import json
import logging
import os
import re
import stat
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple
from urllib.parse import quote, urlsplit
# hashlib, socket and concurrent.futures are imported where used: the server reads the node directory before it
# answers initialize, and what that needs should load alone (requests brings the rest with the first request).

log = logging.getLogger("mero-mcp")


class _Redacting(logging.Filter):
    """Every line this module logs passes `redacted` (the secrets this process has sent)."""

    def filter(self, record):
        record.msg, record.args = redacted(record.getMessage()), ()
        return True


if not log.handlers:      # the server's own stderr lines and these share one format
    _stderr = logging.StreamHandler()
    _stderr.setFormatter(logging.Formatter("[mero-mcp] %(message)s"))
    log.addHandler(_stderr)
    log.setLevel(logging.INFO)
    log.addFilter(_Redacting())

# ── Constants ─────────────────────────────────────────────────────────────────────────────────────

# The release this file belongs to: mero_mcp.py, node.py and abi.py carry the same one (mero_mcp.module_problems).
__version__ = "0.1.0"
PROBE_PORTS = (2528, 2428, 2529, 2429)   # desktop app, merod CLI convention, then their neighbours (§1.3)
PROBE_TIMEOUT = 2.0
DEFAULT_TIMEOUT = 10.0
JOIN_TIMEOUT = 65.0                      # namespace join waits for peers (§1.4)
PAGE_LIMIT = 1000                        # the node's largest page; its default is 100 (node-api §3.3, §3.6)
MAX_OFFSET = 100000                      # the node clamps larger offsets, which would repeat the last page forever
POOL_CONNECTIONS = 4
POOL_MAXSIZE = 48                        # call_many fans out to 32 at once, plus headroom
LOCK_STALE_SECONDS = 30.0                # refresh lock protocol (§1.2)
LOCK_POLL_SECONDS = 0.05
CLIENT_NAME = "mero-mcp"
USER_AGENT = "mero-mcp"
MAX_MIME_TYPE = 255                      # characters of a blob's MIME type (RFC 6838: 127 + / + 127)
BODY_EXCERPT = 300                       # characters of a plain-text error body we show (§6)
LOCAL_FILE_LIMIT = 1 << 20               # agent.json, tokens-*.json, config.toml hold a few KB; more is not one

REVOKED = ("token_reuse", "token_revoked")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}

# W3C trace context, as the reference forwards it (§1.4): no `ff` version, no all-zero ids.
TRACEPARENT = re.compile(r"(?!ff-)[0-9a-f]{2}-(?!0{32}-)[0-9a-f]{32}-(?!0{16}-)[0-9a-f]{16}-[0-9a-f]{2}")
# A config.toml `[server]` listen multiaddr (merod writes /ip4/127.0.0.1/tcp/2528 and /ip6/::1/tcp/2528), and the
# host each local one is reached at: an ip6-only node is not reached through `localhost` where it names ip4 alone.
LISTEN_TCP = re.compile(r"/(ip4|ip6|dns|dns4|dns6)/([^/]+)/tcp/(\d+)(?:/.*)?")
LOCAL_LISTEN = {"127.0.0.1": "localhost", "0.0.0.0": "localhost", "localhost": "localhost", "::1": "[::1]",
                "::": "[::1]"}
ABI_ROUTE = re.compile(r"/admin-api/applications/[^/]+/abi$")
BYTE_LIST = re.compile(r"\[[\d,\s]+\]")

# What some older nodes require on namespace and group creation (reference §2.1); sent only when a node asks.
UPGRADE_POLICY = {"upgradePolicy": "LazyOnAccess"}

OLD_NODE_ABI = ("This node's merod does not support the ABI endpoint (GET /admin-api/applications/:id/abi). "
                "Upgrade merod to a release that includes it.")


# ── The one exception ─────────────────────────────────────────────────────────────────────────────

class NodeError(Exception):
    """A node failure; `str()` is what a person should read. Never carries a token or password.

    `status` is the HTTP status (None for network, discovery and JSON-RPC failures); `retryable` says the same
    call may succeed later; `fix` is one concrete thing to do about it (used by `check`); `auth_error` is the
    node's `x-auth-error` header, when it sent one; `hint` is what an agent should do next, for failures whose
    message names only what went wrong (unreachable, timed out, unreadable, 5xx, a typed refusal `node_advice`
    knows, a JSON-RPC kind): tools append it.
    """

    def __init__(self, message, status=None, retryable=False, fix=None, auth_error=None, hint=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        self.fix = fix
        self.auth_error = auth_error
        self.hint = hint

    def __str__(self):
        return self.message


class NotSent(NodeError):
    """A request that never left: nothing of it reached the node (`BodyTooDeep`, `CancelledBeforeSent`)."""


class BodyTooDeep(NotSent):
    """A body nested too deeply to encode (more levels than Python's JSON encoder allows)."""


class CancelledBeforeSent(NotSent):
    """A change the call's client cancelled before it left: it is never sent (the call's scope, `scope`)."""


class UnexpectedAnswer(NodeError):
    """A 2xx answer of the wrong shape or not JSON (a proxy's page, another server, a broken release). A NodeError
    like any other; `check` tells it apart to say the server at the url is not a Calimero node."""


# ── Environment and the state directory (§1.1, §1.2) ─────────────────────────────────────────────

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


def discover(env: Mapping[str, str], ports=None) -> Location:
    """The node to use, first match wins (§1.3); raises NodeError with the reference's exact texts."""
    return _resolve(env, ports)[0]


def _resolve(env, ports=None) -> Tuple[Location, Optional[Handoff]]:
    handoff, _ = read_handoff(state_dir(env))
    name = setting(env, "CALIMERO_NODE_NAME")
    explicit = setting(env, "CALIMERO_NODE_URL")
    if explicit:
        location = Location(_checked_node_url(explicit), name, "env")
    elif handoff and handoff.node_url:
        location = Location(handoff.node_url, None, "handoff")
    else:
        location = _configured_location(env, name) or _probed_location(env, ports)
    if location.name is None:
        location = location._replace(name=configured_name(env, location.url))
    return location, handoff


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


def _probed_location(env, ports) -> Location:
    found = probe(PROBE_PORTS if ports is None else ports)
    if found:
        return Location(found[0], None, "probe")
    passed = [entry.problem for entry in node_dirs(env) if entry.problem]
    raise NodeError("No Calimero node found. Start one in the Calimero desktop app, or set CALIMERO_NODE_URL. "
                    "(Looked in %s and probed local ports.)%s%s" % (node_home(env), _home_note(env), "".join(
                        " Passed over: %s." % problem for problem in passed)),
                    fix=CONFIG_FIX if passed else "Start a node (Calimero desktop app, or `merod --node <name> run`), "
                                                  "or set CALIMERO_NODE_URL to a running node's address.")


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


def probe(ports=PROBE_PORTS) -> List[str]:
    """Healthy local nodes among `ports`, probed concurrently, in the order given (the preference order)."""
    urls = ["http://localhost:%d" % port for port in ports]
    if not urls:
        return []
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        healthy = list(pool.map(_answers_health, urls))
    return [url for url, ok in zip(urls, healthy) if ok]


def _answers_health(url, timeout: float = PROBE_TIMEOUT) -> bool:
    requests, session = _requests(), _session()
    try:
        prepared = _prepared(requests, session, "GET", url + "/admin-api/health", None, None, {})
        response = fetch(session, prepared, timeout, LOCAL_FILE_LIMIT)   # a health answer is a few bytes
    except (requests.RequestException, Late, TooLarge):
        return False
    if not 200 <= response.status_code < 300:
        return False
    try:                                # another HTTP server on a probed port is not a node
        health_shape(Answer(decode_json(response, url), response.content))
    except (NodeError, WrongShape):
        return False
    return True


def list_nodes(env: Mapping[str, str], active_url: Optional[str], ports=None) -> List[Dict[str, Any]]:
    """Configured nodes first, then nodes found only by probe (name None); `active` marks the one in use.

    A node in use that neither list knows (e.g. a remote CALIMERO_NODE_URL) is appended, so `active`
    always marks something once connected.
    """
    entries = [{"url": url, "name": name, "active": same_node(url, active_url)}
               for name, url in configured_nodes(env)]
    for url in probe(PROBE_PORTS if ports is None else ports):
        if not any(same_node(url, entry["url"]) for entry in entries):
            entries.append({"url": url, "name": None, "active": same_node(url, active_url)})
    if active_url and not any(entry["active"] for entry in entries):
        entries.append({"url": active_url, "name": None, "active": True})
    return entries


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
    if not node_name:
        return RegistryPlace(None, REGISTRY_VARIABLE, "No registry address is known: this server found no node "
                             "directory with a config.toml for the node in use, so %s." % set_it)
    path = os.path.join(node_home(env), node_name, "config.toml")
    try:
        entries = dict(toml_entries(read_local(path).decode("utf-8-sig", "replace")))
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


# ── HTTP: the lazy import, the one session, traceparent ──────────────────────────────────────────

_session_instance = None
_registry_session_instance = None
_session_lock = threading.Lock()
_scope = threading.local()


def _requests():
    import requests                      # lazy: the server's cold start must not import it
    return requests


RUNTIME_PACKAGES = ("requests", "jsonschema")
DISTRIBUTION_PACKAGES = (("sudo apt install", "python3-%s", "Debian, Ubuntu"),
                         ("sudo dnf install", "python3-%s", "Fedora, RHEL"),
                         ("sudo pacman -S", "python-%s", "Arch"))


def install_advice(packages) -> str:
    """How this Python gets `packages`: a distribution's own Python (/usr/bin, not a venv) from the distribution,
    whose pip may refuse (PEP 668's externally-managed-environment); a venv or any other Python with its own pip."""
    python = sys.executable or "python3"
    if sys.prefix == sys.base_prefix and python.startswith("/usr/bin/"):
        return ", or ".join("%s %s (%s)" % (command, " ".join(form % name for name in packages), where)
                            for command, form, where in DISTRIBUTION_PACKAGES)
    return "%s -m pip install %s" % (python, " ".join(packages))


def absent_packages(package: str) -> List[str]:
    """`package` (which failed to import) and every other runtime package this Python cannot find either."""
    from importlib.util import find_spec
    return [name for name in RUNTIME_PACKAGES if name == package or find_spec(name) is None]


def missing_package(package: str, error: ImportError, advice=True) -> str:
    """What a tool says when a runtime package cannot be imported by this Python (naming the other one too when it
    is absent as well), and how to install them here; --check gives the how as the problem's fix instead."""
    absent = absent_packages(package)
    text = ("mero-mcp needs the Python package%s %s, which %s cannot import (%s)"
            % ("s" if len(absent) > 1 else "", " and ".join(absent), sys.executable or "this Python", error))
    return text + (". Install %s: %s." % ("them" if len(absent) > 1 else "it", install_advice(absent)) if advice
                   else "")


def preload() -> None:
    """Import requests now (the server does it once, on one thread; see mero_mcp.heavy)."""
    _requests()


# ── Trust: which CA bundle verifies an https node (and registry) ──────────────────────────────────

# Read in this order; the first one set names the bundle (a PEM file, or a folder of hashed certificates).
CA_SETTINGS = ("CALIMERO_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")
# Where distributions keep theirs: Debian/Ubuntu/Alpine/Arch, Fedora/RHEL, openSUSE, RHEL 7+, macOS/BSD.
SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem",
                     "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/cert.pem")
# The one-file build (packaging/build.py) carries this file beside node.py: its requests, certifi etc. travel with it.
PYZ_MARK = "mero_mcp_pyz.json"
CA_FIX = ("Set CALIMERO_CA_BUNDLE to the PEM file of the CA that signed the node's certificate (README.md, "
          "Configuration).")


class CaBundle(NamedTuple):
    path: Optional[str]                  # None: requests' own (certifi's, or the distribution's for its requests)
    source: str                          # the setting that named it, or where it comes from


def ca_bundle(env: Mapping[str, str]) -> CaBundle:
    """The CA bundle https requests are verified with: CALIMERO_CA_BUNDLE, REQUESTS_CA_BUNDLE or SSL_CERT_FILE (the
    first set; proxies stay off, so only the bundle is taken from the environment); else, in the pyz, the system's
    bundle over the one it carries (the system's gets the distribution's updates); else requests' own."""
    for name in CA_SETTINGS:
        value = setting(env, name)
        if value:
            return CaBundle(os.path.expanduser(value), name)
    system = system_ca_bundle() if carried() else None
    if system:
        return CaBundle(system, "the system's, preferred over the one the pyz carries")
    return CaBundle(None, "the one requests carries")


def system_ca_bundle() -> Optional[str]:
    """This system's CA file: the one its OpenSSL was built to read, else a distribution's usual place; None (Windows,
    a minimal container) when there is none."""
    import ssl
    built_in = ssl.get_default_verify_paths().openssl_cafile
    return next((path for path in (built_in,) + SYSTEM_CA_BUNDLES if path and os.path.isfile(path)), None)


def carried() -> bool:
    """Whether this node.py runs from the one-file build (unpacked, or from the zip itself: read through the loader)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), PYZ_MARK)
    if os.path.isfile(path):
        return True
    try:
        __loader__.get_data(path)
    except (OSError, AttributeError):
        return False
    return True


def ca_bundle_line(env: Mapping[str, str]) -> Tuple[str, Optional[str]]:
    """--check's TLS line, and the problem when the bundle named cannot be read."""
    bundle = ca_bundle(env)
    if bundle.path and not os.path.exists(bundle.path):
        return ("none: %s names %s, which does not exist" % (bundle.source, bundle.path),
                "%s names %s, which does not exist, so no https node can be verified" % (bundle.source, bundle.path))
    # requests' own may be a member of the pyz run as is: requests unpacks it when an https request needs it
    return "https is verified with %s (%s)" % (bundle.path or _requests().certs.where(), bundle.source), None


def _session():
    """The process's one `requests.Session` for the node. `trust_env` is off: a proxy from the environment would
    otherwise capture requests to the local node, and ~/.netrc must never add credentials of its own. The CA bundle
    is the one setting taken from the environment (`ca_bundle`)."""
    global _session_instance
    with _session_lock:
        if _session_instance is None:
            _session_instance = _new_session()
        return _session_instance


def _registry_session():
    """The registry's own session: the node and the registry never share a cookie jar (or a connection)."""
    global _registry_session_instance
    with _session_lock:
        if _registry_session_instance is None:
            _registry_session_instance = _new_session()
        return _registry_session_instance


def _new_session():
    requests = _requests()
    session = requests.Session()
    session.trust_env = False
    bundle = ca_bundle(os.environ)
    if bundle.path:
        session.verify = bundle.path
    adapter = _adapter_class(requests)(pool_connections=POOL_CONNECTIONS, pool_maxsize=POOL_MAXSIZE)
    _watch_connections(adapter)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = USER_AGENT
    return session


def _adapter_class(requests):
    """requests' adapter, saying a missing CA bundle as a TLS failure (requests raises a bare OSError for it)."""
    from requests.adapters import HTTPAdapter

    class Adapter(HTTPAdapter):
        def cert_verify(self, conn, url, verify, cert):
            if isinstance(verify, str) and url.lower().startswith("https") and not os.path.exists(verify):
                raise requests.exceptions.SSLError("no CA bundle at %s" % verify)
            return super().cert_verify(conn, url, verify, cert)
    return Adapter


def _watch_connections(adapter):
    """The adapter's pools tell the request's deadline (`_watched`) which connection carries it, so the deadline
    can shut that connection down wherever the request is: sending, waiting for headers or reading the body. A
    connection going back to the pool leaves its watch first: once another request may take it, no deadline but
    that request's own may shut it down."""
    from urllib3 import HTTPConnectionPool, HTTPSConnectionPool

    def watched(pool_class):
        class Watched(pool_class):
            def _make_request(self, conn, *args, **kwargs):
                watch = getattr(_watched, "value", None)
                if watch is not None:
                    watch.carried_by(conn)
                return super()._make_request(conn, *args, **kwargs)

            def _put_conn(self, conn):
                watch = getattr(_watched, "value", None)
                if watch is not None:
                    watch.released(conn)
                return super()._put_conn(conn)
        return Watched
    adapter.poolmanager.pool_classes_by_scheme = {"http": watched(HTTPConnectionPool),
                                                  "https": watched(HTTPSConnectionPool)}


_watched = threading.local()             # the deadline of the request this thread is sending


class _Watch:
    """One request's deadline: when it passes, its connection is shut down, which ends a blocked read at once. The
    lock orders that against the connection going back to the pool (`released`): a released connection is
    never shut down by this watch."""
    __slots__ = ("deadline", "conn", "fired", "sent", "done", "lock")

    def __init__(self, deadline):
        self.deadline, self.conn, self.fired, self.sent, self.done = deadline, None, False, False, False
        self.lock = threading.Lock()

    def carried_by(self, conn):
        with self.lock:
            self.conn = conn

    def released(self, conn):
        with self.lock:
            if conn is not None and self.conn is conn:
                self.conn, self.done = None, True      # its answer was read whole: nothing is left to cut

    def fire(self):
        with self.lock:
            if self.done:
                return
            self.fired = True
            sock = getattr(self.conn, "sock", None)
            self.sent = sock is not None     # connected: the request may have gone out
            if sock is not None:
                try:
                    import socket
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Deadlines:
    """One thread for every request's deadline (a timer thread per request would cost more than the request). It is
    woken only for a deadline earlier than the one it sleeps until: with one timeout for all, a new request's comes
    later, so starting a request wakes no thread (a thread switch per request)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._watches = set()
        self._thread = None
        self._wake_at = float("inf")         # when the watcher thread looks next (it never misses an earlier one)

    def start(self, seconds) -> _Watch:
        watch = _Watch(time.monotonic() + seconds)
        with self._cond:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mero-mcp-deadlines", daemon=True)
                self._thread.start()
            elif watch.deadline < self._wake_at:
                self._cond.notify()
        return watch

    def stop(self, watch) -> None:
        with self._cond:
            self._watches.discard(watch)

    def _run(self):
        with self._cond:
            while True:
                now = time.monotonic()
                for watch in [w for w in self._watches if w.deadline <= now]:
                    self._watches.discard(watch)
                    watch.fire()
                # A stopped request's deadline may still be the one waited for: waking then finds nothing due.
                self._wake_at = min((w.deadline for w in self._watches), default=float("inf"))
                self._cond.wait(None if self._wake_at == float("inf") else max(0.0, self._wake_at - now))


_deadlines = _Deadlines()
READ_CHUNK = 64 << 10


class TooLarge(Exception):
    """An answer past the size cap: `declared` when its Content-Length said so, else the bytes read."""

    def __init__(self, cap, declared=None):
        super().__init__(cap, declared)
        self.cap, self.declared = cap, declared


class Late(Exception):
    """The request's deadline passed; `sent`: it had a connection then, so the node may have received it."""

    def __init__(self, sent):
        super().__init__(sent)
        self.sent = sent


def fetch(session, prepared, timeout, cap):
    """Send `prepared` and read its whole answer within `timeout` seconds, connect to last byte (a node or proxy
    dripping a byte at a time is cut off at the deadline), holding at most `cap` bytes of body: a larger one is
    refused unread (by its Content-Length) or as soon as it passes the cap. Raises requests' exceptions, Late or
    TooLarge; the response returned has its content read."""
    watch = _deadlines.start(timeout)
    _watched.value = watch
    response = None
    try:
        response = session.send(prepared, timeout=(timeout, timeout), allow_redirects=False, stream=True)
        declared = response.headers.get("Content-Length", "").strip()
        # A HEAD's Content-Length is the size a GET would bring (a blob's): no body comes to refuse.
        if declared.isdigit() and int(declared) > cap and prepared.method != "HEAD":
            raise TooLarge(cap, int(declared))
        # A small body that says its length is read in one read (a chunk size past it costs a second, empty read).
        chunk_size = min(int(declared), READ_CHUNK) if declared.isdigit() and int(declared) > 0 else READ_CHUNK
        chunks, size = [], 0
        for chunk in response.iter_content(chunk_size):
            size += len(chunk)
            if size > cap:
                raise TooLarge(cap)
            chunks.append(chunk)
        response._content = b"".join(chunks)      # what requests itself keeps once a body is read
    except BaseException:
        if response is not None:
            response.close()
        if watch.fired:
            raise Late(watch.sent) from None
        raise
    finally:
        _watched.value = None
        _deadlines.stop(watch)
    if watch.fired:                              # a close-delimited body shut at the deadline looks complete
        response.close()
        raise Late(True)
    return response


def is_traceparent(value) -> bool:
    return isinstance(value, str) and TRACEPARENT.fullmatch(value) is not None


class Scope(NamedTuple):
    """What one call's node requests carry on whichever thread sends them: its W3C traceparent (well-formed or
    None) and its cancel ticket (a threading.Event, or None)."""
    traceparent: Optional[str] = None
    ticket: Any = None

    @property
    def cancelled(self) -> bool:
        return self.ticket is not None and self.ticket.is_set()


NO_SCOPE = Scope()


def current_scope() -> Scope:
    """The scope this thread's requests are sent in now: pass it to `scope` on a helper thread of the same call."""
    return getattr(_scope, "value", NO_SCOPE)


@contextlib.contextmanager
def scope(traceparent=None, ticket=None):
    """Within this block (this thread only), node requests carry `traceparent` if it is well-formed (§1.4), and
    every request but a GET or HEAD is refused unsent once `ticket` is set. `traceparent` may be a Scope
    (`current_scope()` of another thread): that call's scope is entered whole."""
    if isinstance(traceparent, Scope):
        entered = traceparent
    else:
        entered = Scope(traceparent if is_traceparent(traceparent) else None, ticket)
    previous = current_scope()
    _scope.value = entered
    try:
        yield entered
    finally:
        _scope.value = previous


def traced(traceparent):
    """A scope carrying `traceparent` alone."""
    return scope(traceparent)


def refuse_if_cancelled(method, path) -> None:
    """A change is sent only while its call is wanted: checked just before it leaves (a GET changes nothing)."""
    if method not in ("GET", "HEAD") and current_scope().cancelled:
        raise CancelledBeforeSent("%s %s was not sent: the call was cancelled" % (method, path))


def _prepared(requests, session, method, url, params, data, headers):
    """The request `session.request` would send, prepared without its per-request merging: the session's headers
    (our User-Agent, requests' defaults) with ours after them, its cookie jar; no proxy or netrc to merge, as
    trust_env is off. The same bytes reach the node, without merging settings that are all empty on every
    request."""
    merged = dict(session.headers)
    merged.update(headers)
    _sent_userinfo(url)
    return requests.Request(method, url, headers=merged, data=data, params=params,
                            cookies=session.cookies).prepare()


def _headers(token, content_type):
    headers = {}
    if token:
        headers["Authorization"] = "Bearer " + sent_secret(token)
    if content_type:
        headers["Content-Type"] = content_type
    traceparent = current_scope().traceparent
    if traceparent:
        headers["traceparent"] = traceparent
    return headers


# ── Error mapping: every shape a node failure takes → one NodeError (§6) ─────────────────────────

_NETWORK_REASONS = (
    ("refused", "connection refused"),
    ("Name or service not known", "unknown host"),
    ("nodename nor servname", "unknown host"),
    ("getaddrinfo failed", "unknown host"),
    ("name resolution", "unknown host"),
    ("reset by peer", "the connection was reset"),
    ("ConnectionResetError", "the connection was reset"),
    ("Remote end closed", "the node closed the connection without answering"),
    ("RemoteDisconnected", "the node closed the connection without answering"),
    ("BadStatusLine", "the answer was not HTTP"),
    ("SSL", "the TLS handshake failed"),
    ("Network is unreachable", "the network is unreachable"),
    ("No route to host", "no route to host"),
)


def network_error(error: Exception, url: str, timeout: float, method: str = "GET") -> NodeError:
    """`Cannot reach the node at <url>: <reason>` for a request that never left (and for a GET, which may simply
    be sent again); a write that went out and got no answer says it may have been carried out. The exception's
    own text is matched, never shown: it quotes the full URL, query string included."""
    requests = _requests()
    shown, base = display_url(url), display_url(_base_of(url))
    hint = None
    sent = not never_left(error)
    if isinstance(error, requests.Timeout):
        reason = "timed out after %g s" % timeout
        hint = "The node at %s did not answer in time: retry, and check its log if this keeps happening." % base
    elif isinstance(error, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)):
        return cut_off(shown, base, method)
    elif isinstance(error, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema)):
        reason = "the url is not valid"
    else:
        text = repr(error)
        reason = next((said for marker, said in _NETWORK_REASONS if marker in text), "network error")
    if sent and method != "GET":
        return no_answer(shown, base, reason, timeout)
    fix = "Start the node at %s, or point CALIMERO_NODE_URL at a running node." % base
    if isinstance(error, requests.exceptions.SSLError):
        fix = tls_fix(base)
    return NodeError("Cannot reach the node at %s: %s" % (shown, reason), fix=fix, hint=hint or fix)


def tls_fix(base) -> str:
    """What to do when the node's certificate cannot be verified: the bundle used, and how to name another."""
    bundle = ca_bundle(os.environ)
    return "The certificate of %s was checked against %s (%s). %s" % (
        base, bundle.path or _requests().certs.where(), bundle.source, CA_FIX)


def never_left(error: Exception) -> bool:
    """A failure before the request was sent: no connection (refused, unknown host, connect timeout, TLS)."""
    requests = _requests()
    if isinstance(error, (requests.exceptions.ConnectTimeout, requests.exceptions.SSLError,
                          requests.exceptions.InvalidURL, requests.exceptions.MissingSchema)):
        return True
    text = repr(error)
    return isinstance(error, requests.ConnectionError) and any(
        marker in text for marker in ("NewConnectionError", "NameResolutionError", "Failed to establish"))


def no_answer(shown, base, reason, timeout) -> NodeError:
    """A write that reached the node and got no answer: it may have run, so "retry" would be wrong advice."""
    said = ("no answer within %g s" % timeout) if reason.startswith("timed out") else reason
    return NodeError("The request to %s was sent, but no answer came (%s)" % (shown, said), hint=CARRIED_OUT % base)


CARRIED_OUT = ("The node may have carried it out: check before repeating it (list or read what it would change). "
               "If the node at %s is slow, a larger CALIMERO_MCP_TIMEOUT gives it longer.")


def late(shown, base, timeout, sent, method) -> NodeError:
    """The request's deadline passed: never connected, or connected and not answered in full in time."""
    if sent and method != "GET":
        return no_answer(shown, base, "timed out", timeout)
    hint = "The node at %s did not answer in time: retry, and check its log if this keeps happening." % base
    fix = "Start the node at %s, or point CALIMERO_NODE_URL at a running node." % base
    return NodeError("Cannot reach the node at %s: timed out after %g s" % (shown, timeout), fix=fix, hint=hint)


def too_large(shown, base, error, method) -> NodeError:
    """An answer past the size cap, refused without reading it all."""
    size = ("is %d bytes (its Content-Length)" % error.declared if error.declared is not None
            else "passed %d bytes before it ended" % error.cap)
    hint = ("Ask for less (a narrower method or argument), or raise %s (now %d bytes) if answers this large are "
            "expected." % (RESPONSE_CAP_VARIABLE, error.cap))
    if method != "GET":
        hint = "The node may have carried it out: check before repeating it. " + hint
    return NodeError("The answer from %s %s, more than this server reads (%d bytes, %s): refused, the rest unread"
                     % (shown, size, error.cap, RESPONSE_CAP_VARIABLE), hint=hint)


def cut_off(shown, base, method="GET"):
    return NodeError("Unreadable response from %s: the connection closed mid-response" % shown,
                     hint=CARRIED_OUT % base if method != "GET" else _unreadable_hint(base))


def _is_short(response, content) -> bool:
    """Fewer bytes than Content-Length promised: urllib3 2 raises for it, urllib3 1 (distribution requests)
    hands over the short body, so we check ourselves."""
    declared = response.headers.get("Content-Length", "")
    return declared.isdigit() and "Content-Encoding" not in response.headers and len(content) < int(declared)


def _unreadable_hint(base):
    return "Retry; if this keeps happening, check that %s is a Calimero node (merod) and read its log." % base


def _server_error_hint(status, url):
    """What to do about a 5xx: 503 means "not yet" (retryable), the others a failure inside the node."""
    base = display_url(_base_of(url))
    if status == 503:
        return "The node at %s is not ready for this yet (HTTP 503): retry in a few seconds." % base
    if status >= 500:
        return "The node at %s failed (HTTP %d): retry, and check its log if this keeps happening." % (base, status)
    return None


def _base_of(url):
    parts = urlsplit(url)
    return "%s://%s" % (parts.scheme, parts.netloc.rsplit("@", 1)[-1])


def http_error(status: int, reason: Optional[str], body: bytes, url: str,
               auth_error: Optional[str] = None) -> NodeError:
    """A non-2xx answer: the node's own words when it gave any, else the status line and the url (§6); with
    what an agent can do about it when the node's refusal is one it can act on (node-api §0.5)."""
    shown = display_url(url)
    retryable = status in (503, 504)
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = reason or ""
    status_line = ("HTTP %d %s" % (status, phrase)).rstrip()
    text = body.decode("utf-8", "replace").strip()
    if not text:
        if status == 404 and ABI_ROUTE.search(shown):
            return NodeError(OLD_NODE_ABI, status, fix="Upgrade merod to a release with the ABI endpoint.")
        message = "%s from %s - the node returned no message" % (status_line, shown)
        return NodeError(message, status, retryable, auth_error=auth_error, hint=_server_error_hint(status, url))
    said = node_message(text)
    advice = None if auth_error else node_advice(status, urlsplit(url).path, said or text)
    if said:                             # the node's own words; "not yet" gets advice added (and the url)
        return NodeError(said, status, retryable, auth_error=auth_error,
                         hint=advice or (_server_error_hint(status, url) if retryable else None))
    return NodeError("%s from %s - the node said: %s" % (status_line, shown, text[:BODY_EXCERPT]),
                     status, retryable, auth_error=auth_error, hint=advice or _server_error_hint(status, url))


# What an agent can do about the node's typed refusals (node-api §0.5.2, §0.5.3): (status, route or None,
# words in the node's text, advice). `{0}` is the group or namespace the node's text names.
JOIN_ROUTE = re.compile(r"/admin-api/namespaces/[^/]+/join$")
INVITATION_ROUTE = re.compile(r"/admin-api/namespaces/[^/]+/(join|invite)$")     # where invitations are used
INSTALL_ROUTE = re.compile(r"/admin-api/install-application$")
DEV_INSTALL_ROUTE = re.compile(r"/admin-api/install-dev-application$")
UPGRADE_ROUTE = re.compile(r"/admin-api/groups/[^/]+/upgrade$")
GROUP_ROUTE = re.compile(r"/admin-api/groups/[^/]+$")
# The group a refusal names: quoted (core's "node is not a member of group '<id>'", §1.2) or bare hex (its
# governance store's membership errors: "identity … is not an admin of group <id>").
NAMED_GROUP = re.compile(r"(group|namespace) (?:'([^']*)'|([0-9a-f]{64})\b)")
_ADVICE = (
    (504, JOIN_ROUTE, "", "No member of the namespace answered the join: retry join_namespace with the same "
                          "invitation once the inviting node (or another member) is online."),
    (503, JOIN_ROUTE, "", "The join went out but is not complete yet: wait a few seconds, check list_namespaces, "
                          "and retry join_namespace with the same invitation if the namespace is not there."),
    (409, INVITATION_ROUTE, "invitation", "This invitation cannot be used (again): ask a member of the namespace "
                                          "for a new one (invite_to_namespace on their node) and join with that."),
    (400, JOIN_ROUTE, "invitation", "Pass the invitation object exactly as invite_to_namespace returned it, to "
                                    "the namespace it was made for."),
    (409, UPGRADE_ROUTE, "already targeting", "Nothing newer is installed: list_registry shows what the "
                                              "registry has; install_application (coords or path; the app keeps "
                                              "its id), then retry upgrade_group."),
    (409, UPGRADE_ROUTE, "in progress", "Wait: describe_group shows the upgrade's progress until it is completed."),
    (409, UPGRADE_ROUTE, "no contexts", "Nothing runs in that group: pass cascade to upgrade its subgroups too, or "
                                        "upgrade the group that holds the contexts."),
    (400, GROUP_ROUTE, "namespace root", "Delete a namespace with delete_namespace."),
    (409, GROUP_ROUTE, "contexts", "This node deletes only an empty group: delete its contexts first "
                                   "(delete_context), then retry delete_group."),
    (403, DEV_INSTALL_ROUTE, "install path", "The node installs bundles only from under its MEROD_DEV_INSTALL_ROOT: "
                                             "put the bundle there on the node's machine and pass that absolute "
                                             "path."),
    (409, None, "last admin", "Make another member Admin first (add_group_members with role Admin, or "
                              "set_member_role), then retry."),
    (403, None, "not a member", "This node is not a member of {0}: join it first (join_namespace with an "
                                "invitation, or join_open_group for an open subgroup)."),
    (403, None, "admin", "This needs the Admin role in {0} (or a group above it), which this node lacks: ask an "
                         "admin there to give it that role (add_group_members with role Admin)."),
    (403, None, "not eligible", "join_open_group joins only an open group inside a namespace or group this node "
                                "belongs to: ask an admin of {0} to add this node (add_group_members) instead."),
    (502, INSTALL_ROUTE, "dht registry mode", "This node cannot install by package@version: put the "
                                              "application's .mpk bundle on the node's machine and pass its "
                                              "absolute path to install_application as path."),
    (502, INSTALL_ROUTE, "no application published", "Check the package and version: the node's registry has no "
                                                     "such release (list_registry lists what it publishes)."),
)


def node_advice(status: int, path: str, text: str) -> Optional[str]:
    """The next step for a refusal the node explained (its own text stays the message); None otherwise."""
    lowered = text.lower()
    for code, route, words, advice in _ADVICE:
        if code == status and (route is None or route.search(path)) and words in lowered:
            named = NAMED_GROUP.search(text)
            return advice.format("%s %s" % (named.group(1), named.group(2) or named.group(3)) if named
                                 else "that group")
    return None


def node_message(text: str) -> Optional[str]:
    """The node's error text in `{"error": "…"}`, `{"error": {"message": "…"}}` or the auth envelope
    `{"data": null, "error": "…"}` (node-api §1.2, §2); None for any other body."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    if isinstance(error, str) and error.strip():
        return error.strip()
    return None


def decode_json(response, url: str):
    """The JSON of a 2xx answer, `{"data": …}` unwrapped; None for an empty body."""
    content = response.content
    if _is_short(response, content):
        raise cut_off(display_url(url), display_url(_base_of(url)), getattr(response.request, "method", "GET"))
    if not content.strip():
        return None
    try:
        value = json.loads(content, parse_constant=_not_json)
    except ValueError:
        raise UnexpectedAnswer("Unreadable response from %s: HTTP %d with a body that is not valid JSON (%d bytes; "
                               "garbled or cut off)" % (display_url(url), response.status_code, len(content)),
                               hint=_unreadable_hint(display_url(_base_of(url)))) from None
    except RecursionError:               # json.loads gives up past Python's recursion limit
        raise too_deep(url) from None
    if nested_past(value, MAX_ANSWER_NESTING):
        raise too_deep(url)
    return unwrap(value)


MAX_ANSWER_NESTING = 200     # levels of JSON an answer may nest: the server's own encoders recurse on each level


class NestedTooDeep(UnexpectedAnswer, RecursionError):
    """An answer nested past what the server can read or write back: unreadable, like any wrong answer. Also a
    RecursionError, which is what execute says of an app's output nested too deeply to decode."""


def too_deep(url) -> NodeError:
    return NestedTooDeep("Unreadable response from %s: JSON nested more than %d levels deep"
                         % (display_url(url), MAX_ANSWER_NESTING), hint=_unreadable_hint(display_url(_base_of(url))))


def nested_past(value, limit) -> bool:
    """Whether a decoded JSON value nests more than `limit` levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _not_json(constant):
    """Python's json reads NaN and Infinity; JSON has neither, and they would come out as null or invalid text."""
    raise ValueError("%s is not JSON" % constant)


def unwrap(value):
    """Most admin answers are `{"data": T}` (node-api §1.2); callers want T."""
    if isinstance(value, dict) and "data" in value:
        return value["data"]
    return value


# ── JSON-RPC errors (node-api §4.2, reference §6) ─────────────────────────────────────────────────

_RPC_TEXTS = {
    "ContextNotFound": "Context {context} not found on this node (ContextNotFound)",
    "Uninitialized": "Context {context} has not synced its state yet; retry once it has (Uninitialized)",
    "ApplicationNotInstalled": "The application of context {context} is not installed on this node "
                               "(ApplicationNotInstalled)",
    "Unauthorized": "This node holds no identity allowed to execute in context {context} (Unauthorized)",
    "GroupKeyPending": "Context {context} is still waiting for its group key; retry shortly (GroupKeyPending)",
    "UpgradeInProgress": "Context {context} is being upgraded: writes fail until it finishes, reads still work "
                         "(UpgradeInProgress)",
    "ReadOnlyWriteRefused": "This node only reads context {context}: its role there cannot write, so {method} was "
                            "refused and nothing changed (ReadOnlyWriteRefused)",
    "ParseError": "The node could not parse the call to {method} (ParseError)",
    "SerdeError": "Method {method} returned a value that is not JSON (SerdeError)",
    "InternalError": "The node failed internally while running {method} (InternalError)",
}
_RETRYABLE_RPC = frozenset({"Uninitialized", "GroupKeyPending", "UpgradeInProgress"})
_RPC_ADVICE = {
    "ReadOnlyWriteRefused": "Reads work here; run the write on a node whose role in the context's group writes "
                            "(Member or Admin), or ask a group admin to give this node such a role.",
}
NO_EXECUTE_GRANT = "does not grant context:execute"
EXECUTE_GRANT_ADVICE = ("The token this server uses may not call {method} in context {context}: sign in with one "
                        "whose permissions include context:execute for it (an admin login's do).")


# ── Sent secrets: every token, password and URL userinfo this process puts into a request ─────────

_sent_secrets = {}                   # secret -> its compiled pattern, gathered where a header or body is built
_sent_lock = threading.Lock()


def sent_secret(secret: Optional[str]) -> Optional[str]:
    """Record a secret as it goes into a request (a header, a body, a URL's userinfo), whatever it came from (the
    environment, the handoff file, the shared token cache, a refresh): from then on `redacted` takes it out of
    every text. Returns it, so a request is built through this call."""
    if isinstance(secret, str) and len(secret) >= MIN_SECRET and secret not in _sent_secrets:
        pattern = secret_pattern(secret)
        with _sent_lock:
            _sent_secrets[secret] = pattern
    return secret


MIN_SECRET = 4                       # shorter "secrets" (an empty password, a test's "x") would redact ordinary words


def redacted(text: str) -> str:
    """`text` with every secret this process has sent taken out, in any encoding `secret_pattern` knows: node and
    registry answers, errors and log lines pass here before any of it is shown."""
    if not isinstance(text, str) or not _sent_secrets:
        return text
    with _sent_lock:
        patterns = sorted(_sent_secrets.items(), key=lambda item: -len(item[0]))   # user:password before password
    for _, pattern in patterns:
        text = pattern.sub("[redacted]", text)
    return text


def _sent_userinfo(url: str) -> None:
    """A URL's `user:password@` goes out as HTTP Basic: both its password and the pair are secrets sent."""
    rest = url.partition("://")[2]
    userinfo = rest.split("/", 1)[0].rpartition("@")[0] if "@" in rest.split("/", 1)[0] else ""
    if userinfo:
        from urllib.parse import unquote
        user, _, password = userinfo.partition(":")
        for secret in (userinfo, unquote(userinfo), unquote(password), password):
            sent_secret(secret)


@functools.lru_cache(maxsize=256)
def secret_pattern(secret: str):
    """A secret as node text may quote it: as written, JSON-escaped (\\uXXXX for any character, either case),
    URL-encoded (%XX, + for a space) or any mix of these, and base64 (standard or URL-safe, padded or not)."""
    def char(c):
        forms = ["\\\\u%s" % "".join("[%s%s]" % (d.lower(), d.upper()) for d in "%04x" % ord(c))]
        forms.append("".join("%%%s" % "".join("[%s%s]" % (d.lower(), d.upper()) for d in "%02x" % b)
                             for b in c.encode("utf-8")))
        escaped = json.dumps(c)[1:-1]
        if escaped != c:
            forms.append(re.escape(escaped))
        if c == " ":
            forms.append("\\+")
        return "(?:%s|%s)" % ("|".join(forms), re.escape(c))
    encoded = secret.encode("utf-8")
    b64 = {text for form in (base64.b64encode(encoded), base64.urlsafe_b64encode(encoded))
           for text in (form.decode("ascii"), form.decode("ascii").rstrip("="))}
    return re.compile("|".join(sorted((re.escape(form) for form in b64), key=len, reverse=True)
                               + ["".join(char(c) for c in secret)]))


def rpc_error(error, context_id: str, method: str) -> NodeError:
    """A JSON-RPC `error` object (`{"type","data"}` from merod, or `{code,message}`) rendered readably."""
    if not isinstance(error, dict):
        return NodeError("JSON-RPC error: %s" % _compact(error))
    kind = error.get("type")
    data = error.get("data")
    if kind == "FunctionCallError":
        decoded = function_call_message(data)
        advice = EXECUTE_GRANT_ADVICE.format(method=method, context=context_id) \
            if isinstance(data, str) and NO_EXECUTE_GRANT in data else None
        return NodeError(decoded if decoded else "FunctionCallError: %s" % _compact(data), hint=advice)
    if not kind:
        return NodeError("JSON-RPC error %s: %s" % (error.get("code", "?"), error.get("message") or _compact(data)))
    template = _RPC_TEXTS.get(kind, kind)
    text = template.format(context=context_id, method=method)
    detail = "" if kind in _RPC_ADVICE else _rpc_detail(data)      # its data only names the context again
    return NodeError(text + (": " + detail if detail else ""), retryable=kind in _RETRYABLE_RPC,
                     hint=_RPC_ADVICE.get(kind))


def _rpc_detail(data) -> str:
    if isinstance(data, dict) and set(data) == {"message"}:
        data = data["message"]
    if data is None or data == {} or data == "":
        return ""
    return data.strip() if isinstance(data, str) else _compact(data)


def function_call_message(data) -> Optional[str]:
    """The app's own error out of `the method call returned an error: [34, 98, …]` (Rust Debug bytes):
    a JSON string literal is unwrapped, other JSON kept compact, other text as is. A string without a byte
    list (a guest panic, an unknown method) is returned trimmed. None when nothing readable is there."""
    if not isinstance(data, str):
        return None
    match = BYTE_LIST.search(data)
    if not match:
        return data.strip() or None
    numbers = [int(part) for part in match.group(0)[1:-1].split(",") if part.strip()]
    if not numbers or any(n > 255 for n in numbers):
        return None
    try:
        text = bytes(numbers).decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, str):
        return value.strip() or None
    return _compact(value)


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ── Answer shapes: every admin answer is checked before a caller sees it (node-api §3, §0.5) ──────

def health_shape(answer) -> Dict[str, Any]:
    """`{"status": "alive"}` (§3.1): what tells a node's health answer (health, probe) from another server's page."""
    return answer.object("status")


class WrongShape(Exception):
    """Raised by the checks below; `str()` is what the answer should have been. Never leaves node.py."""


def quoted(value: str) -> str:
    """One path segment: ids are hex, but a typo must not be able to reach another route."""
    return quote(value, safe="")


def _named(key: str) -> str:
    return '%s "%s"' % ("an" if key[:1] in "aeiou" else "a", key)


def _is_text(value) -> bool:
    return isinstance(value, str) and value != ""


class Fields(NamedTuple):
    """The fields of a record the server relies on besides its id: `required` strings, and `texts` (strings) and
    `objects` where given (null is not given). Of the wrong type, they are the node's error, not a crash of ours
    nor a wrong refusal. A dotted name reaches into an object (`blob.bytecode`)."""
    required: Tuple[str, ...] = ()
    texts: Tuple[str, ...] = ()
    objects: Tuple[str, ...] = ()

    def wrong(self, record: Dict[str, Any]) -> Optional[str]:
        """What the first wrong field should have been (`"version" a string where given`), or None."""
        for key in self.required:
            if not _is_text(_field(record, key)):
                return '%s string' % _named(key)
        for keys, kind in ((self.objects, "an object"), (self.texts, "a string")):
            for key in keys:
                value = _field(record, key)
                if value is not None and not isinstance(value, dict if kind == "an object" else str):
                    return '"%s" %s where given' % (key, kind)
        return None


def _field(record: Dict[str, Any], dotted: str):
    for key in dotted.split("."):
        record = record.get(key) if isinstance(record, dict) else None
    return record


APP_FIELDS = Fields(texts=("package", "version", "signer_id", "blob.bytecode"), objects=("blob", "services"))
CONTEXT_FIELDS = Fields(required=("applicationId",), texts=("serviceName",))
GROUP_FIELDS = Fields(texts=("namespaceId",))
NAMED_FIELDS = Fields(texts=("name",))
NAMESPACE_FIELDS = Fields(texts=("name", "targetApplicationId"))
NO_FIELDS = Fields()
REGISTRY_FIELDS = Fields(required=("package",), texts=("appVersion",), objects=("metadata",))


class Answer:
    """One admin answer: `value` is its JSON with `{"data": …}` unwrapped, `body` the bytes that came back.
    The methods return the part a caller needs, or raise WrongShape saying what was expected. Fields a release
    may omit are left to the caller (node-api: "read defensively"); containers and ids are checked here."""

    def __init__(self, value, body: bytes):
        self.value = value
        self.body = body

    def object(self, id_key: Optional[str] = None, fields: Fields = NO_FIELDS) -> Dict[str, Any]:
        """The answer as an object; with `id_key`, that field must be a non-empty string."""
        value = self.value
        expected = "an object with %s string" % _named(id_key) if id_key else "an object"
        if not isinstance(value, dict) or (id_key and not _is_text(value.get(id_key))):
            raise WrongShape(expected)
        _check_fields(value, fields, expected)
        return value

    def id(self, key: str) -> str:
        """The id at `key` of an answer object (`{"groupId": "…"}`)."""
        return self.object(key)[key]

    def flag(self, key: str) -> Dict[str, Any]:
        """The answer as an object whose `key` is a boolean (isDeleted)."""
        if not isinstance(self.value, dict) or not isinstance(self.value.get(key), bool):
            raise WrongShape("an object with %s boolean" % _named(key))
        return self.value

    def count(self, key: str) -> int:
        """The non-negative integer at `key` (`{"count": 3}`)."""
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise WrongShape("an object with %s non-negative integer" % _named(key))
        return value

    def inner(self, key: str, id_key: str, fields: Fields = NO_FIELDS,
              nullable: bool = False) -> Optional[Dict[str, Any]]:
        """The object at `key` (`{"application": {…}}`), carrying `id_key` as a string; with `nullable`, None for
        `{key: null}`."""
        inner = self.value.get(key) if isinstance(self.value, dict) else None
        if nullable and inner is None and isinstance(self.value, dict) and key in self.value:
            return None
        expected = 'an object whose "%s" is an object with %s string' % (key, _named(id_key))
        if not isinstance(inner, dict) or not _is_text(inner.get(id_key)):
            raise WrongShape(expected + (", or null" if nullable else ""))
        _check_fields(inner, fields, expected)
        return inner

    def rows(self, key: Optional[str], *id_keys, fields: Fields = NO_FIELDS) -> List[Dict[str, Any]]:
        """The list at `key` (the answer itself when None); every entry an object with one of `id_keys`."""
        container = "a list" if key is None else "an object with %s list" % _named(key)
        rows = self.value if key is None else self.value.get(key) if isinstance(self.value, dict) else None
        if not isinstance(rows, list):
            raise WrongShape(container)
        expected = "%s of objects, each with %s string" % (container, _named(id_keys[0]))
        if not all(isinstance(row, dict) and any(_is_text(row.get(k)) for k in id_keys) for row in rows):
            raise WrongShape(expected)
        for row in rows:
            _check_fields(row, fields, expected)
        return rows

    def blob(self) -> Dict[str, Any]:
        """A blob record, its id as `blob_id` (rc.25 and later) or `blobId` (some clients' mapping)."""
        value = self.value
        if not isinstance(value, dict) or not (_is_text(value.get("blob_id")) or _is_text(value.get("blobId"))):
            raise WrongShape('an object with a "blob_id" string')
        return blob_record(value)

    def alias_value(self) -> Optional[str]:
        """`{"value": "<context id>"}`, or `{"value": null}` for an alias that does not exist."""
        value = self.value.get("value", False) if isinstance(self.value, dict) else False
        if value is not None and not _is_text(value):
            raise WrongShape('an object with a "value" string or null')
        return value

    def alias_map(self) -> Dict[str, str]:
        """`{alias: context id}` from a flat map, or from a list of `{alias, value}` rows (§0.6)."""
        value = self.value
        if isinstance(value, list) and all(isinstance(row, dict) for row in value):
            value = {row.get("alias"): row.get("value") for row in value}
        if not isinstance(value, dict) or not all(_is_text(k) and _is_text(v) for k, v in value.items()):
            raise WrongShape('an object mapping each alias to its context id, or a list of {"alias", "value"} rows')
        return value

    def metadata(self) -> Optional[Dict[str, Any]]:
        """A metadata record (its `name` a string or null), or None for `{"data": null}`."""
        record = self.optional_object()
        if record is not None and record.get("name") is not None and not isinstance(record["name"], str):
            raise WrongShape('an object whose "name" is a string or null, or null')
        return record

    def invitation(self) -> Dict[str, Any]:
        """A signed invitation (its "inviter_signature" beside the inner object), bare or wrapped (§3.6)."""
        if not isinstance(self.value, dict) or "inviter_signature" not in signed_invitation(self.value)[0]:
            raise WrongShape('a signed invitation: an object with "inviter_signature", bare or as its "invitation"')
        return self.value

    def optional_object(self) -> Optional[Dict[str, Any]]:
        """An object, or None for `{"data": null}`: what writes answer (`{}`, `{"data": null}`, a record)."""
        if self.value is not None and not isinstance(self.value, dict):
            raise WrongShape("an object or null")
        return self.value


def _check_fields(record: Dict[str, Any], fields: Fields, expected: str) -> None:
    wrong = fields.wrong(record)
    if wrong:
        raise WrongShape("%s and %s" % (expected, wrong))


def signed_invitation(given: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    """The signed invitation to forward, and the inviter's group name if it came along.

    Some nodes answer an invite with the signed invitation itself, others wrap it as {invitation, groupName}
    (§3.6). A wrapper is recognised by the signature sitting one level down, and the signed object inside it goes
    out untouched.
    """
    inner = given.get("invitation")
    if "inviter_signature" not in given and isinstance(inner, dict) and "inviter_signature" in inner:
        return inner, given.get("groupName")
    return given, None


def decode_metadata(raw) -> Any:
    """Bundle metadata as the node sends it: an int array of UTF-8 JSON (usually an object), or a plain string.
    The decoded value; the string itself when it is not JSON; None when absent or not UTF-8."""
    if isinstance(raw, list):
        try:
            raw = bytes(raw).decode("utf-8")
        except (ValueError, TypeError):
            return None
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def app_metadata_decoded(record: Dict[str, Any]) -> Dict[str, Any]:
    return dict(record, metadata=decode_metadata(record.get("metadata")))


def _application(answer: Answer) -> Optional[Dict[str, Any]]:
    record = answer.inner("application", "id", APP_FIELDS, nullable=True)
    return app_metadata_decoded(record) if record is not None else None


def blob_record(blob: Dict[str, Any]) -> Dict[str, Any]:
    """One blob as the server shows it: camelCase, whichever casing this node release used (§3.5)."""
    record = {"blobId": blob.get("blobId") or blob.get("blob_id")}
    for key in ("size", "deleted"):
        if key in blob:
            record[key] = blob[key]
    return record


def _blob_params(context_id: Optional[str]) -> Optional[Dict[str, str]]:
    """`context_id` lets the node ask that context's peers for a blob it does not hold (§0.6)."""
    return {"context_id": context_id} if context_id is not None else None


def _blob_headers(response) -> Dict[str, Any]:
    headers = response.headers
    declared = headers.get("Content-Length", "").strip()
    mime = headers.get("X-Blob-MIME-Type") or headers.get("Content-Type")
    if mime and len(mime) > MAX_MIME_TYPE:        # RFC 6838: 127 characters a side; longer is no MIME type
        mime = None
    return {"size": int(declared) if declared.isdigit() else None, "mimeType": mime or None,
            "source": headers.get("X-Blob-Source")}


def is_hex64(value: str) -> bool:
    """64 hex characters in any case: an id, used as given (the node judges it)."""
    return len(value) == 64 and not value.lower().strip("0123456789abcdef")


def _blob_refusal(error: NodeError, blob_id: str, context_id: Optional[str]) -> NodeError:
    """A refused HEAD of a blob in words: 404 (not held, §0.6), 400 (a malformed blob or context id)."""
    if error.status == 404:
        where = "on this node or among its context's peers" if context_id else "on this node"
        return NodeError("Blob %s is not %s" % (blob_id, where), 404,
                         hint="list_blobs shows the blobs this node holds%s." % (
                             "" if context_id else "; pass context to have the node ask that context's peers"))
    if error.status == 400 and not is_hex64(blob_id):
        return NodeError('"%s" is not a blob id%s' % (blob_id, ", or the context id is not valid" if context_id else ""),
                         400, hint="A blob id is 64 hex characters (list_blobs shows them).")
    if error.status == 400:         # a well-formed id refused: the node's reason, never "not a blob id"
        return NodeError("The node refused to read blob %s%s: %s" % (
            blob_id, " through context %s" % context_id if context_id else "", str(error).rstrip(".")), 400,
            hint="list_blobs shows the blobs this node holds%s." % (
                "; context must be a context id or left out" if context_id else ""))
    return error


def _blob_too_large(blob_id: str, size: int, cap: int) -> NodeError:
    return NodeError("Blob %s is %d bytes, more than the %d bytes this server takes in one answer (%s): the node "
                     "sends a blob whole, with no ranges" % (blob_id, size, cap, RESPONSE_CAP_VARIABLE),
                     hint="Fetch it from the node's machine directly (meroctl blob download, or the node's GET "
                          "/admin-api/blobs/%s)." % blob_id)


# ── Node: connect, request, refresh ───────────────────────────────────────────────────────────────

class Node:
    """The node this process talks to. Lazy: nothing touches the node until the first call; `connect()`
    resolves and authenticates, success is kept, failure is not (the next call tries again)."""

    def __init__(self, env: Optional[Mapping[str, str]] = None, ports=None, named: Optional[NamedNode] = None,
                 default: bool = True):
        self._env = os.environ if env is None else env
        self._named = named               # a NamedNode: this node, never discovery's choice (issue 33)
        self._default = default           # the default node takes the environment's token (auth_plan)
        self._timeout = request_timeout(self._env)
        self.max_response_bytes = response_cap(self._env)     # CALIMERO_MCP_MAX_RESPONSE_BYTES
        self._ports = ports               # probe ports; injectable so tests need not bind the real ones
        self._connect_lock = threading.Lock()
        self._renew_lock = threading.Lock()
        self._location = None             # set once connect() succeeded
        self._attempt = None              # (location, mode) of the last attempt that got past discovery
        self._base = None
        self._mode = None
        self._store = None
        self._tokens = None
        self._credentials = None          # (username, password) in credentials mode
        self._renewal_attempts = 0        # counts token renewals, so waiting threads can share an outcome
        self._renewal_failure = None      # how the last renewal failed, for the threads that waited on it
        self._ids = itertools.count(1)
        self._events = None               # this node's EventStream, made on first use
        self._events_lock = threading.Lock()
        self._http = None                 # this node's own requests.Session, made on first use

    @property
    def session(self):
        """This node's own session: its cookies and pooled connections never serve another node (issue 33)."""
        with _session_lock:
            if self._http is None:
                self._http = _new_session()
            return self._http

    # ---- identity ----
    @property
    def url(self) -> Optional[str]:
        return self._location.url if self._location else None

    @property
    def name(self) -> Optional[str]:
        return self._location.name if self._location else None

    @property
    def source(self) -> Optional[str]:
        return self._location.source if self._location else None

    @property
    def auth_mode(self) -> Optional[str]:
        return self._mode if self._location else None

    traced = staticmethod(traced)
    scope = staticmethod(scope)
    current_scope = staticmethod(current_scope)

    # ---- connect ----
    def connect(self) -> "Node":
        if self._location is None:
            with self._connect_lock:
                if self._location is None:
                    if self._named is not None:
                        location = Location(self._named.url, self._named.name, "named")
                        handoff = read_handoff(state_dir(self._env))[0]
                    else:
                        location, handoff = _resolve(self._env, self._ports)
                    self._connect_to(location, handoff)
        return self

    def _connect_to(self, location: Location, handoff: Optional[Handoff], fresh_login: bool = False) -> None:
        """Authenticate against `location` (§1.4); marks the node connected only when that worked. `fresh_login`
        (--check) signs in with the credentials even when tokens are cached, so a wrong password is seen; the cache
        is written only by a sign-in that succeeds, and only when it held no usable pair."""
        env = self._env
        username = setting(env, "CALIMERO_USERNAME")
        mode, injected = auth_plan(env, handoff, location.url, self._default)
        self._attempt = (location, mode)
        self._base, self._mode = location.url, mode
        self._store = TokenStore(token_cache_path(state_dir(env), location.url, username))
        tokens = None
        unusable = token_problem(injected[0]) if mode == "token" else None
        if unusable:
            fix = "Set CALIMERO_AUTH_TOKEN to the access token alone, as the node issued it."
            raise NodeError("CALIMERO_AUTH_TOKEN %s. %s" % (unusable, fix), fix=fix)
        if injected:
            tokens = self._store.read()
            if is_newer(injected[0], tokens):
                tokens = token_bundle(*injected)
                self._store.write(tokens)
        elif mode == "credentials":
            self._credentials = (username, read_password(env))
            cached = self._store.read()          # read even for a fresh login: --check says what is wrong with it
            # A fresh login keeps a cached pair: a running server may hold that family, and adopting ours would
            # cost it a refresh of its own.
            tokens = self._login(save=cached is None) if fresh_login else cached or self._login()
        self._tokens = tokens
        self._location = location

    def events(self) -> "EventStream":
        """This node's one event stream (node-api §0.9): made on first use, connected on its first touch."""
        with self._events_lock:
            if self._events is None:
                self._events = EventStream(self)
            return self._events

    # ---- requests ----
    def get(self, path, params=None, timeout=None):
        return self._request("GET", path, params=params, timeout=timeout)

    def post(self, path, body=None, params=None, timeout=None):
        return self._request("POST", path, body=body, params=params, timeout=timeout)

    def delete(self, path, body=None, params=None, timeout=None):
        return self._request("DELETE", path, body=body, params=params, timeout=timeout)

    def put_bytes(self, path, data, params=None, timeout=None):
        return self._request("PUT", path, data=bytes(data), content_type="application/octet-stream",
                             params=params, timeout=timeout)

    def execute(self, context_id: str, method: str, args, timeout=None):
        """Run an app method (node-api §4): the method's output, or NodeError with the app's own message."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": "execute",
                "params": {"contextId": context_id, "method": method, "argsJson": {} if args is None else args}}
        try:
            answer = self._exchange("POST", "/jsonrpc", body=body, timeout=timeout)
        except BodyTooDeep:             # a cancel (CancelledBeforeSent) goes on as it is
            raise NodeError("%s was not sent to the node: its arguments are nested too deeply to encode (more "
                            "levels than Python's JSON encoder allows)" % method) from None
        except RecursionError:          # json.loads gives up past Python's recursion limit
            raise NodeError("%s ran, but its output is nested too deeply to decode (more levels than Python's JSON "
                            "decoder allows)" % method) from None
        reply = answer.value if isinstance(answer.value, dict) else {}
        if reply.get("error") is not None:
            raise self._scrubbed(rpc_error(reply["error"], context_id, method))
        result = reply.get("result")
        if not isinstance(result, dict) or "output" not in result:     # never a made-up output (node-api §4.2)
            raise self._unexpected("POST", "/jsonrpc", 'a JSON-RPC reply: a "result" object with the "output", or '
                                   'an "error"', answer.body)
        return result["output"]

    def sync_status(self, context_id: str) -> Dict[str, Any]:
        """JSON-RPC sync_status (§0.8): {contextId, isInitialized, syncState: {state, …}, failureCount, lastError?}."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": "sync_status", "params": {"contextId": context_id}}
        answer = self._exchange("POST", "/jsonrpc", body=body)
        reply = answer.value if isinstance(answer.value, dict) else {}
        if reply.get("error") is not None:
            raise self._scrubbed(rpc_error(reply["error"], context_id, "sync_status"))
        result = reply.get("result")
        if not isinstance(result, dict):
            raise self._unexpected("POST", "/jsonrpc", 'a JSON-RPC reply with a "result" object', answer.body)
        return result

    # ---- the admin API (node-api §3, §0.5): one method per node operation the server uses ----
    # Each knows its path, its body (current nodes refuse unknown keys) and the shape of its answer, and returns
    # plain values or raises NodeError: an answer of the wrong shape never turns into an empty list upstream.

    def health(self) -> Dict[str, Any]:
        return self._call("GET", "/admin-api/health", health_shape)

    def identity(self) -> Dict[str, Any]:
        """`{accountId, publicKey, deviceId?, ...}`; a fresh node answers 404 with why it has none yet (§0.6)."""
        return self._call("GET", "/admin-api/identity", lambda a: a.object("accountId"))

    def peers(self, timeout=None) -> int:
        """How many peers the node is connected to: `{"count": N}`, no wrapper (§0.6)."""
        return self._call("GET", "/admin-api/peers", lambda a: a.count("count"), timeout=timeout)

    # applications (§3.2)
    def applications(self) -> List[Dict[str, Any]]:
        """The installed applications' records, each with its `id` (lists may omit `services`) and its `metadata`
        decoded (decode_metadata)."""
        return self._call("GET", "/admin-api/applications",
                          lambda a: [app_metadata_decoded(row) for row in a.rows("apps", "id", fields=APP_FIELDS)])

    def application(self, app_id: str) -> Optional[Dict[str, Any]]:
        """One application's full record (with `services`, `metadata` decoded), or None when the node has none of
        that id: a 404, or (core's `application: Option<Application>`, older releases) `{"application": null}`."""
        return self._absent_as_none((404,), "GET", "/admin-api/applications/" + quoted(app_id), _application)

    def abi(self, app_id: str, service: Optional[str] = None) -> Dict[str, Any]:
        """The application's embedded ABI manifest (of one service, for a multi-service bundle)."""
        return self._call("GET", "/admin-api/applications/%s/abi" % quoted(app_id), Answer.object,
                          params={"service_name": service} if service else None)

    def install_application(self, package: str, version: str) -> Dict[str, Any]:
        """Install package@version from the node's own registry: `{applicationId}`."""
        return self._call("POST", "/admin-api/install-application", lambda a: a.object("applicationId"),
                          body={"package": package, "version": version})

    def install_dev_application(self, path: str) -> Dict[str, Any]:
        """Install the bundle at `path` on the node's own filesystem: `{applicationId}`. The newest body is
        `{path}`; an older node requires `metadata` (ignored for a bundle) and is sent `[]` when it asks (§0.6)."""
        route = "/admin-api/install-dev-application"
        try:
            return self._call("POST", route, lambda a: a.object("applicationId"), body={"path": path})
        except NodeError as error:
            if error.status in (400, 422) and "missing field `metadata`" in str(error):
                return self._call("POST", route, lambda a: a.object("applicationId"),
                                  body={"path": path, "metadata": []})
            raise

    def application_versions(self, app_id: str) -> List[Dict[str, Any]]:
        """The versions of the app's package this node retains: `[{version, blobId, size, package}]`."""
        return self._call("GET", "/admin-api/applications/%s/versions" % quoted(app_id),
                          lambda a: a.rows(None, "version"))

    def uninstall_application(self, app_id: str) -> Dict[str, Any]:
        """`{applicationId}`; the node succeeds for an id it does not know."""
        return self._call("DELETE", "/admin-api/applications/" + quoted(app_id), lambda a: a.object("applicationId"))

    # the registry (§0.7): its own API, not the node's; no token goes to it
    def registry(self) -> RegistryPlace:
        try:
            self.connect()               # the node's name picks its config.toml
        except NodeError:
            pass
        return registry_place(self._env, self.name)

    def registry_bundles(self, package: Optional[str] = None) -> List[Dict[str, Any]]:
        """GET {base_url}/api/v2/bundles: the latest manifest of every package, or with `package` its every
        version (`yanked` marked): a bare array of `{package, appVersion, metadata{name, description}, ...}`.
        Read like a node answer: every row checked (`REGISTRY_FIELDS`), only rows of the package asked kept (a
        registry may ignore the filter), a package listed twice in the latest list refused; whatever is wrong is
        an error naming the registry."""
        place = self.registry()
        if place.url is None:
            raise NodeError(place.problem, fix=place.problem)
        url = place.url + "/api/v2/bundles"
        params = {"package": package, "all_versions": "true"} if package else None
        requests, session = _requests(), _registry_session()
        shown = "the registry at %s (%s)" % (display_url(place.url), place.source)
        try:
            prepared = _prepared(requests, session, "GET", url, params, None, _headers(None, None))
            response = fetch(session, prepared, self._timeout, self.max_response_bytes)
        except (requests.RequestException, Late, TooLarge) as error:
            reason = ("timed out after %g s" % self._timeout if isinstance(error, (Late, requests.Timeout))
                      else "its answer is larger than %d bytes" % error.cap if isinstance(error, TooLarge)
                      else next((said for marker, said in _NETWORK_REASONS if marker in repr(error)), "network error"))
            raise NodeError("Cannot reach %s: %s" % (shown, reason), hint="Check that the registry is up, or "
                            "point %s at one that is." % REGISTRY_VARIABLE) from None
        if package and response.status_code == 404:
            return []
        said = shown[0].upper() + shown[1:]
        if not 200 <= response.status_code < 300:
            excerpt = redacted(response.content[:BODY_EXCERPT].decode("utf-8", "replace"))
            raise NodeError("%s answered HTTP %d: %s" % (said, response.status_code, " ".join(excerpt.split())),
                            status=response.status_code, hint="Check %s: it should be the registry's base URL "
                            "(the node fetches {base_url}/artifacts/...)." % place.source)
        rows = self._registry_rows(response, url, said)
        if not package:
            return self._one_row_each(rows, said)
        asked = [row for row in rows if row["package"] == package]      # a registry may ignore ?package=
        if rows and not asked:
            raise UnexpectedAnswer("%s answered the versions of %s with %d bundles of other packages and none of "
                                   "%s (it ignores ?package=): it may not publish %s." % (said, package, len(rows),
                                                                                          package, package))
        versions = {}
        for row in asked:                                               # a version listed twice counts once
            versions.setdefault(row.get("appVersion"), row)
        return list(versions.values())

    def _registry_rows(self, response, url, said) -> List[Dict[str, Any]]:
        """The registry's bare array, each row checked as a node record is; any fault an UnexpectedAnswer."""
        hint = ("Check that %s is the registry's base URL (the node fetches {base_url}/artifacts/...)."
                % display_url(_base_of(url)))
        try:
            value = json.loads(response.content.decode("utf-8"), parse_constant=_not_json)
        except (ValueError, RecursionError) as error:
            what = ("JSON nested too deeply to read" if isinstance(error, RecursionError) else "a body that is not "
                    "JSON")
            raise UnexpectedAnswer("%s answered with %s (%d bytes)" % (said, what, len(response.content)),
                                   hint=hint) from None
        if nested_past(value, MAX_ANSWER_NESTING):
            raise UnexpectedAnswer("%s answered with JSON nested more than %d levels deep" % (said, MAX_ANSWER_NESTING),
                                   hint=hint)
        if not isinstance(value, list):
            raise UnexpectedAnswer("%s answered with no list of bundles" % said, hint=hint)
        for index, row in enumerate(value):
            wrong = 'an object' if not isinstance(row, dict) else REGISTRY_FIELDS.wrong(row)
            if wrong:
                raise UnexpectedAnswer("%s answered a bundle list whose row %d is not as expected (expected %s)"
                                       % (said, index, wrong), hint=hint)
        return value

    @staticmethod
    def _one_row_each(rows, said) -> List[Dict[str, Any]]:
        """The latest list holds each package once: one listed twice (a registry paging as it changes) is said,
        never passed on as two packages of one name."""
        seen, twice = set(), []
        for row in rows:
            if row["package"] in seen and row["package"] not in twice:
                twice.append(row["package"])
            seen.add(row["package"])
        if twice:
            raise UnexpectedAnswer("%s listed %s more than once in its list of latest versions: it cannot say which "
                                   "is the latest. Retry; list_registry with package lists one package's versions."
                                   % (said, ", ".join(twice[:5]) + (" and %d more" % (len(twice) - 5)
                                                                    if len(twice) > 5 else "")))
        return rows

    # contexts (§3.3)
    def contexts(self) -> List[Dict[str, Any]]:
        """Every context on the node (all pages), each with its `id`."""
        return self._every_page("/admin-api/contexts", lambda a: a.rows("contexts", "id", fields=CONTEXT_FIELDS), "id")

    def contexts_of(self, app_id: str) -> List[Dict[str, Any]]:
        """The contexts of one application (one answer, not paged), each with its `id`."""
        return self._call("GET", "/admin-api/contexts/for-application/" + quoted(app_id),
                          lambda a: a.rows("contexts", "id", fields=CONTEXT_FIELDS))

    def context(self, context_id: str) -> Optional[Dict[str, Any]]:
        """One context, or None when the node knows no such context (404; 400 for a string no id could be)."""
        return self._absent_as_none((400, 404), "GET", "/admin-api/contexts/" + quoted(context_id),
                                    lambda a: a.object("id", CONTEXT_FIELDS))

    def create_context(self, application_id: str, group_id: str, initialization_params: List[int],
                       name: Optional[str] = None, service: Optional[str] = None) -> Dict[str, Any]:
        """`{contextId, memberPublicKey, ...}`; initialization_params are the UTF-8 bytes of init's JSON args."""
        body = {"applicationId": application_id, "groupId": group_id}
        if name is not None:
            body["name"] = name
        if service is not None:
            body["serviceName"] = service
        body["initializationParams"] = initialization_params
        return self._call("POST", "/admin-api/contexts", lambda a: a.object("contextId"), body=body)

    def join_context(self, context_id: str) -> Dict[str, Any]:
        """`{contextId, memberPublicKey}`: join through group membership."""
        return self._call("POST", "/admin-api/contexts/%s/join" % quoted(context_id),
                          lambda a: a.object("contextId"), body={})

    def delete_context(self, context_id: str) -> Dict[str, Any]:
        """`{isDeleted}` (false for a context the node does not know)."""
        return self._call("DELETE", "/admin-api/contexts/" + quoted(context_id), lambda a: a.flag("isDeleted"))

    def sync_context(self, context_id: str) -> None:
        """Ask the node to sync the context from its peers (answers `{"data": null}`)."""
        self._call("POST", "/admin-api/contexts/sync/" + quoted(context_id), Answer.optional_object)

    def resync_context(self, context_id: str, force: bool) -> Dict[str, Any]:
        """A full resync, replacing local state with a peer's: `{contextId, resyncStarted}`, no wrapper."""
        return self._call("POST", "/admin-api/contexts/%s/resync" % quoted(context_id),
                          lambda a: a.object("contextId"), body={"force": force})

    # aliases (§3.4)
    def create_alias(self, alias: str, context_id: str) -> None:
        self._call("POST", "/admin-api/alias/create/context", Answer.optional_object,
                   body={"alias": alias, "contextId": context_id})

    def lookup_alias(self, name: str) -> Optional[str]:
        """The context id an alias names, or None: a miss is `{"value": null}`, and 400, 404 and 422 all mean
        a string no alias could be."""
        return self._absent_as_none((400, 404, 422), "POST", "/admin-api/alias/lookup/context/" + quoted(name),
                                    Answer.alias_value, body={})

    def context_aliases(self) -> Dict[str, str]:
        """Every context alias: `{alias: context id}`. Core answers a flat map; one branch a list of
        `{alias, value}` rows (§0.6): both are read."""
        return self._call("GET", "/admin-api/alias/list/context", Answer.alias_map)

    def delete_alias(self, name: str) -> None:
        """Idempotent on the node: an absent alias is a 200 too (§0.6), so a caller that must tell a miss looks up
        first."""
        self._call("POST", "/admin-api/alias/delete/context/" + quoted(name), Answer.optional_object, body={})

    # blobs (§3.5): records come back camelCase, whichever casing this release used
    def upload_blob(self, data: bytes, blob_hash: Optional[str] = None, context_id: Optional[str] = None):
        """`{blobId, size}`; the node refuses bytes that do not match `blob_hash`."""
        params = {}
        if blob_hash is not None:
            params["hash"] = blob_hash
        if context_id is not None:
            params["context_id"] = context_id
        return self._call("PUT", "/admin-api/blobs", Answer.blob, data=bytes(data),
                          content_type="application/octet-stream", params=params)

    def blobs(self) -> List[Dict[str, Any]]:
        """`[{blobId, size}]`: the root blobs stored on the node."""
        rows = self._call("GET", "/admin-api/blobs", lambda a: a.rows("blobs", "blob_id", "blobId"))
        return [blob_record(row) for row in rows]

    def blob_info(self, blob_id: str, context_id: Optional[str] = None) -> Dict[str, Any]:
        """HEAD: `{size, mimeType, source}` from the headers (each None when absent; a blob only a peer holds
        has no MIME type and maybe no size)."""
        try:
            response = self._raw("HEAD", "/admin-api/blobs/" + quoted(blob_id), _blob_params(context_id))
        except NodeError as error:         # a HEAD answer has no body: the node's own words never arrive
            raise _blob_refusal(error, blob_id, context_id) from None
        return _blob_headers(response)

    def download_blob(self, blob_id: str, context_id: Optional[str] = None) -> Tuple[bytes, Dict[str, Any]]:
        """The blob's bytes, whole (the node has no Range), and its headers as blob_info gives them. A blob past
        the answer-size cap (CALIMERO_MCP_MAX_RESPONSE_BYTES) is refused by its HEAD, before a byte is read; one
        whose HEAD gave no size is cut off by the transport at the cap."""
        path, params = "/admin-api/blobs/" + quoted(blob_id), _blob_params(context_id)
        size = self.blob_info(blob_id, context_id)["size"]
        if size is not None and size > self.max_response_bytes:
            raise _blob_too_large(blob_id, size, self.max_response_bytes)
        response = self._raw("GET", path, params)
        return response.content, _blob_headers(response)

    def delete_blob(self, blob_id: str) -> Dict[str, Any]:
        """`{blobId, deleted}`; the node refuses (403) a blob an installed application uses."""
        return self._call("DELETE", "/admin-api/blobs/" + quoted(blob_id), Answer.blob)

    # namespaces (§3.6)
    def namespaces(self) -> List[Dict[str, Any]]:
        """Every namespace (all pages), each with its `namespaceId` (`name`, `targetApplicationId` strings where
        given)."""
        return self._every_page("/admin-api/namespaces", lambda a: a.rows(None, "namespaceId", fields=NAMESPACE_FIELDS),
                                "namespaceId")

    def create_namespace(self, application_id: str, name: Optional[str] = None) -> Dict[str, Any]:
        """`{namespaceId}`."""
        body = {"applicationId": application_id}
        if name is not None:
            body["name"] = name
        return self._create_with_policy("/admin-api/namespaces", body, lambda a: a.object("namespaceId"))

    def delete_namespace(self, namespace_id: str) -> Dict[str, Any]:
        """`{isDeleted}`. Core refuses this DELETE without a JSON body (§1.2)."""
        return self._call("DELETE", "/admin-api/namespaces/" + quoted(namespace_id), lambda a: a.flag("isDeleted"),
                          body={})

    def invite_to_namespace(self, namespace_id: str, expires_in: Optional[int] = None) -> Dict[str, Any]:
        """The signed invitation, bare or wrapped as `{invitation, groupName}` depending on the release.
        `expires_in`: seconds it stays valid (the request's expirationTimestamp is a duration, §0.8)."""
        body = {} if expires_in is None else {"expirationTimestamp": int(expires_in)}
        return self._call("POST", "/admin-api/namespaces/%s/invite" % quoted(namespace_id), Answer.invitation,
                          body=body)

    def join_namespace(self, namespace_id: str, invitation: Dict[str, Any],
                       group_name: Optional[str] = None) -> Dict[str, Any]:
        """Join with what invite_to_namespace returned (`group_name`, when None, is the inviter's if it came
        along); the signed invitation goes out unchanged. Waits JOIN_TIMEOUT for peer discovery."""
        invitation, inviter_group_name = signed_invitation(invitation)
        group_name = inviter_group_name if group_name is None else group_name
        body = {"invitation": invitation}
        if group_name is not None:
            body["groupName"] = group_name
        return self._call("POST", "/admin-api/namespaces/%s/join" % quoted(namespace_id),
                          lambda a: a.object("namespaceId"), body=body, timeout=JOIN_TIMEOUT)

    def leave_namespace(self, namespace_id: str) -> None:
        self._call("POST", "/admin-api/namespaces/%s/leave" % quoted(namespace_id), Answer.optional_object, body={})

    def namespace_groups(self, namespace_id: str) -> List[Dict[str, Any]]:
        """The groups directly in a namespace, each `{groupId, name?}`."""
        return self._call("GET", "/admin-api/namespaces/%s/groups" % quoted(namespace_id),
                          lambda a: a.rows(None, "groupId", fields=NAMED_FIELDS))

    # groups (§3.7)
    def create_group(self, namespace_id: str, name: Optional[str], visibility: str) -> str:
        """A subgroup directly in a namespace; its `groupId`."""
        body = {}
        if name is not None:
            body["groupName"] = name
        body["visibility"] = visibility
        return self._call("POST", "/admin-api/namespaces/%s/groups" % quoted(namespace_id),
                          lambda a: a.id("groupId"), body=body)

    def create_nested_group(self, parent_id: str, name: Optional[str] = None) -> str:
        """A group under `parent_id`, for the parent's application; core creates it restricted. Its `groupId`."""
        body = {"applicationId": self.group(parent_id)["targetApplicationId"]}
        if name is not None:
            body["name"] = name
        body["parentGroupId"] = parent_id
        return self._create_with_policy("/admin-api/groups", body, lambda a: a.id("groupId"))

    def group(self, group_id: str) -> Dict[str, Any]:
        """A group's (or namespace's) info: `{groupId, targetApplicationId, namespaceId?, ...}`; `namespaceId`
        since rc.83."""
        return self._call("GET", "/admin-api/groups/" + quoted(group_id),
                          lambda a: a.object("targetApplicationId", GROUP_FIELDS))

    def delete_group(self, group_id: str) -> Dict[str, Any]:
        """`{isDeleted}`. Core refuses this DELETE without a JSON body; the newest nodes delete the subgroups
        below it and their contexts too, older ones refuse a group that still has contexts (§0.6)."""
        return self._call("DELETE", "/admin-api/groups/" + quoted(group_id), lambda a: a.flag("isDeleted"),
                          body={})

    def namespace_holds(self, namespace_id: str, group_id: str) -> bool:
        """Whether a group is the namespace or sits anywhere under it. Older releases' group info names no
        namespace: their namespace's subgroups are walked down instead."""
        namespace = self.group(group_id).get("namespaceId")
        if namespace is not None:
            return namespace == namespace_id
        seen, level = {namespace_id}, [namespace_id]
        while level and group_id not in seen:
            level = [row["groupId"] for parent in level for row in self.subgroups(parent) if row["groupId"] not in seen]
            seen.update(level)
        return group_id in seen

    def subgroups(self, group_id: str) -> List[Dict[str, Any]]:
        """A group's direct children, `{groupId, name?}` (no wrapper); restricted ones are hidden unless this node
        may see them."""
        return self._call("GET", "/admin-api/groups/%s/subgroups" % quoted(group_id),
                          lambda a: a.rows("subgroups", "groupId", fields=NAMED_FIELDS))

    def groups_in(self, namespace_id: str) -> List[Dict[str, Any]]:
        """Every group under a namespace this node can list, each `{groupId, name?, parentId}`: the namespace's own
        groups, then each level's subgroups. A subtree the node will not show (403, 404) is left out."""
        groups, seen, parents = [], {namespace_id}, [namespace_id]
        while parents:
            children = []
            for parent in parents:
                for row in self._shown_children(parent, parent == namespace_id):
                    if row["groupId"] not in seen:
                        seen.add(row["groupId"])
                        groups.append(dict(row, parentId=parent))
                        children.append(row["groupId"])
            parents = children
        return groups

    def _shown_children(self, parent: str, is_namespace: bool) -> List[Dict[str, Any]]:
        try:
            return self.namespace_groups(parent) if is_namespace else self.subgroups(parent)
        except NodeError as error:
            if error.status in (403, 404):
                return []
            raise

    def group_parent(self, namespace_id: str, group_id: str) -> Optional[Dict[str, Any]]:
        """The row `{groupId, name?}` of the group directly above `group_id` inside the namespace (the namespace's
        own is `{groupId: namespace_id}`), with the group's own row as `child`; None when it is not there.
        Group info names no parent (§0.6): the namespace is walked down, a level at a time."""
        seen, level = {namespace_id}, [({"groupId": namespace_id}, self.namespace_groups(namespace_id))]
        while level:
            below = []
            for parent, children in level:
                for child in children:
                    if child["groupId"] == group_id:
                        return dict(parent, child=child)
                    if child["groupId"] not in seen:
                        seen.add(child["groupId"])
                        below.append(child)
            level = [(row, self.subgroups(row["groupId"])) for row in below]
        return None

    def group_members(self, group_id: str) -> Dict[str, Any]:
        """`{members: [{identity, role, name?}], selfIdentity?}`, every page read; older releases put
        selfIdentity on each page."""
        pages = []

        def members_of(answer):
            pages.append(answer.value)
            return answer.rows("members", "identity")
        members = {"members": self._every_page("/admin-api/groups/%s/members" % quoted(group_id), members_of,
                                              "identity")}
        if pages[0].get("selfIdentity") is not None:
            members["selfIdentity"] = pages[0]["selfIdentity"]
        return members

    def add_group_members(self, group_id: str, members: List[Dict[str, str]]) -> None:
        """members: `[{identity, role}]`."""
        self._call("POST", "/admin-api/groups/%s/members" % quoted(group_id), Answer.optional_object,
                   body={"members": members})

    def remove_group_members(self, group_id: str, accounts: List[str]) -> None:
        """accounts: the members' account ids, as the members list gives them (the node checks none of them)."""
        self._call("POST", "/admin-api/groups/%s/members/remove" % quoted(group_id), Answer.optional_object,
                   body={"members": accounts})

    def set_member_role(self, group_id: str, account: str, role: str) -> None:
        self._call("PUT", "/admin-api/groups/%s/members/%s/role" % (quoted(group_id), quoted(account)),
                   Answer.optional_object, body={"role": role})

    def group_metadata(self, group_id: str) -> Optional[Dict[str, Any]]:
        """`{name, data, updatedAt, updatedBy}`, or None for a group that has none."""
        return self._call("GET", "/admin-api/groups/%s/metadata" % quoted(group_id), Answer.metadata)

    def set_group_metadata(self, group_id: str, name: Optional[str], data: Dict[str, str]) -> None:
        """Replace the whole record, name included (a missing name erases it)."""
        body = {"name": name} if name is not None else {}
        body["data"] = data
        self._call("PUT", "/admin-api/groups/%s/metadata" % quoted(group_id), Answer.optional_object, body=body)

    def set_group_visibility(self, group_id: str, visibility: str) -> None:
        self._call("PUT", "/admin-api/groups/%s/settings/subgroup-visibility" % quoted(group_id),
                   Answer.optional_object, body={"subgroupVisibility": visibility})

    def join_open_group(self, group_id: str) -> Dict[str, Any]:
        """Join through membership of the parent (join via inheritance): `{groupId, memberPublicKey, wasInherited}`."""
        return self._call("POST", "/admin-api/groups/%s/join-via-inheritance" % quoted(group_id),
                          lambda a: a.object("groupId"), body={})

    # group upgrades (§0.6)
    def upgrade_group(self, group_id: str, application_id: str, cascade: Optional[bool] = None) -> Dict[str, Any]:
        """Move the group (with `cascade`, its subgroups too) to the application row's current bytecode:
        `{groupId, status, ...}` (counts as `localContexts*` on newer nodes, `total/completed/failed` on older)."""
        body = {"targetApplicationId": application_id}
        if cascade is not None:
            body["cascade"] = cascade
        return self._call("POST", "/admin-api/groups/%s/upgrade" % quoted(group_id), lambda a: a.object("status"),
                          body=body)

    def upgrade_status(self, group_id: str) -> Optional[Dict[str, Any]]:
        """The group's last upgrade `{fromVersion, toVersion, status, ...}`, or None when it was never upgraded."""
        def status_of(answer):
            record = answer.optional_object()
            if record is not None and not _is_text(record.get("status")):
                raise WrongShape('an object with a "status" string, or null')
            return record
        return self._call("GET", "/admin-api/groups/%s/upgrade/status" % quoted(group_id), status_of)

    # ---- the admin API's plumbing ----
    def _call(self, method, path, shape, body=None, params=None, data=None, content_type=None, timeout=None):
        """Send one admin request and return `shape(answer)`; a wrong shape is an UnexpectedAnswer."""
        answer = self._exchange(method, path, body, params, data, content_type, timeout)
        try:
            return shape(answer)
        except WrongShape as expected:
            raise self._unexpected(method, path, str(expected), answer.body) from None

    def _unexpected(self, method, path, expected, body) -> NodeError:
        text = " ".join(self._redacted(body.decode("utf-8", "replace")).split())    # one line, for logs too
        said = ("with an unexpected body (expected %s): %s" % (expected, text[:BODY_EXCERPT]) if text
                else "with an empty body (expected %s)" % expected)
        hint = _unreadable_hint(display_url(self._base))
        if method != "GET":                # only the answer is known to be wrong: the request may have worked
            hint = ("The node may have carried it out anyway: check before repeating it. If this keeps happening, "
                    "check that %s is a Calimero node (merod) and read its log." % display_url(self._base))
        return UnexpectedAnswer("The node answered %s %s %s" % (method, path, said), hint=hint)

    def _redacted_body(self, response) -> bytes:
        """A refusal's body with our secrets taken out before any of it is quoted (a proxy may echo a request)."""
        return self._redacted(response.content.decode("utf-8", "replace")).encode("utf-8")

    def _redacted(self, text: str) -> str:
        """An echoing proxy or app may quote our headers or body back: every secret this process has sent is taken
        out (`redacted`), wherever it came from."""
        return redacted(text)

    def _scrubbed(self, error: NodeError) -> NodeError:
        """`error` with our secrets taken out of its texts (a JSON-RPC error may quote the request)."""
        error.message = self._redacted(error.message)
        error.args = (error.message,)
        error.hint = self._redacted(error.hint) if error.hint else error.hint
        return error

    def _absent_as_none(self, statuses, method, path, shape, **request):
        """_call, or None when the node answers one of `statuses`: its way of saying "no such thing"."""
        try:
            return self._call(method, path, shape, **request)
        except NodeError as error:
            if error.status in statuses:
                return None
            raise

    def _every_page(self, path, rows_of, id_key) -> List[Dict[str, Any]]:
        """Every row of a paginated list (contexts, namespaces, members), read a full page at a time. Core counts
        a context page's `offset` in stored ids, some of which may resolve to no context, while its `limit` counts
        rows: a page can then begin with rows already read, which are skipped by their `id_key`."""
        rows, seen = [], set()
        while len(rows) <= MAX_OFFSET:
            page = self._call("GET", path, rows_of, params={"offset": len(rows), "limit": PAGE_LIMIT})
            fresh = [row for row in page if row.get(id_key) not in seen]
            rows.extend(fresh)
            seen.update(row.get(id_key) for row in fresh)
            if len(page) < PAGE_LIMIT or not fresh:
                break
        return rows

    def _create_with_policy(self, path, body, shape):
        """Current core reads creation bodies as closed sets and knows no upgradePolicy; some older releases
        required it (mero-js still sends it). Send without it, and again with it only when the node asks."""
        try:
            return self._call("POST", path, shape, body=body)
        except NodeError as error:
            if error.status in (400, 422) and "upgradePolicy" in str(error):
                return self._call("POST", path, shape, body=dict(UPGRADE_POLICY, **body))
            raise

    def _request(self, method, path, body=None, params=None, data=None, content_type=None, timeout=None):
        return self._exchange(method, path, body, params, data, content_type, timeout).value

    def _exchange(self, method, path, body=None, params=None, data=None, content_type=None, timeout=None):
        """One request; the answer with its raw body, for the admin API's shape checks."""
        if body is not None:
            try:
                data, content_type = json.dumps(body).encode("utf-8"), "application/json"
            except RecursionError:       # json.dumps gives up past Python's recursion limit: nothing went out
                raise BodyTooDeep("%s %s was not sent: its body is nested too deeply to encode (more levels than "
                              "Python's JSON encoder allows)" % (method, path)) from None
        response, url = self._response(method, path, params, data, content_type, timeout)
        return Answer(decode_json(response, url), response.content)

    def _raw(self, method, path, params=None):
        """A request whose answer is bytes, not JSON (a blob download, its HEAD): the response itself."""
        response, url = self._response(method, path, params)
        if method != "HEAD" and _is_short(response, response.content):
            raise cut_off(display_url(url), display_url(self._base))
        return response

    def _response(self, method, path, params=None, data=None, content_type=None, timeout=None):
        """Send one request (renewing the token if need be); a 2xx response and its url, else the refusal."""
        self.connect()
        url = self._base + path
        timeout = self._timeout if timeout is None else timeout

        def send(token):
            refuse_if_cancelled(method, path)        # before each attempt: a renewal may have taken a while
            return self._send(method, url, token, data, content_type, params, timeout)
        response = self._send_authenticated(send)
        if not 200 <= response.status_code < 300:
            raise self._refusal(response, url)
        return response, url

    def _send(self, method, url, token, data, content_type, params, timeout, changes=None):
        """One request and its whole answer. `changes` (default: not a GET) is whether a request that went out
        unanswered may have changed the node, which its error then says instead of "retry"."""
        requests, session = _requests(), self.session
        kind = method if changes is None else ("POST" if changes else "GET")
        try:
            prepared = _prepared(requests, session, method, url, params, data, _headers(token, content_type))
            return fetch(session, prepared, timeout, self.max_response_bytes)
        except requests.RequestException as error:
            raise network_error(error, url, timeout, kind) from None
        except Late as error:
            raise late(display_url(url), display_url(_base_of(url)), timeout, error.sent, kind) from None
        except TooLarge as error:
            raise too_large(display_url(url), display_url(_base_of(url)), error, kind) from None

    def _refusal(self, response, url) -> NodeError:
        error = http_error(response.status_code, response.reason, self._redacted_body(response), url,
                           _auth_error(response))
        # Only the auth guard's answers get login advice: a 403 without x-auth-error is the node's own
        # refusal (a blob an app still uses, a group this node may not join) and its text says why.
        token = self._access_token()
        if response.status_code == 401 and token and not error.auth_error and not response.content.strip():
            advice = auth_advice(self._mode)
            return NodeError("%s Sign in again: %s%s" % (no_longer_accepted(token, url), advice[0].lower(),
                                                          advice[1:]), 401, fix=advice)
        if response.status_code == 401 or (response.status_code == 403 and error.auth_error):
            advice = auth_advice(self._mode)
            return NodeError("%s. %s" % (error.message.rstrip("."), advice), error.status, fix=advice,
                             auth_error=error.auth_error)
        return error

    # ---- expiry and revocation (§1.4) ----
    def _send_authenticated(self, send):
        """Send; on an expired token renew once (one refresh shared by every thread) and retry once;
        on a revoked one clear the cache, recover if this mode can, else say so."""
        for attempt in range(2):
            token = self._access_token()
            response = send(token)
            reason = _auth_error(response)
            if not self._renewable(token, reason, response.status_code):
                return response
            if attempt == 1:
                break
            self._renew(token, reason, response)
        if reason in REVOKED:
            with self._renew_lock:
                if self._access_token() == token:
                    self._store.clear()
                    self._raise_revoked(reason, response.status_code, response.url)
        return response

    def _renewable(self, token, reason, status) -> bool:
        """An expired or revoked token; or, where this mode can get a new one, a token the node no longer
        knows at all (a plain 401: e.g. a cache left over from a node that was re-initialised)."""
        if not token:
            return False
        if reason in REVOKED or (status == 401 and reason == "token_expired"):
            return True
        return status == 401 and reason is None and self._mode in ("handoff", "credentials")

    def _access_token(self) -> Optional[str]:
        tokens = self._tokens
        return tokens.get("access_token") if tokens else None

    def _renew(self, failed_token, reason, response) -> None:
        """Replace `failed_token`, once for all threads that hit it together; raises NodeError when it cannot.

        Threads that waited while an attempt failed share its error instead of spending the refresh token
        again; a later call (a new incident: the node may be back) tries afresh.
        """
        attempts_seen = self._renewal_attempts
        with self._renew_lock:
            if self._renewal_attempts != attempts_seen and self._renewal_failure is not None:
                raise self._renewal_failure
            if self._access_token() != failed_token:
                return                    # another thread already renewed it
            self._renewal_attempts += 1
            try:
                with self._store.lock():
                    self._tokens = self._renewed(failed_token, reason, response)
                self._renewal_failure = None
            except NodeError as error:
                self._renewal_failure = error
                raise

    def _renewed(self, failed_token, reason, response) -> Dict[str, Any]:
        """Inside the file lock: adopt what another process rotated, else refresh or recover (§1.2)."""
        stored = self._store.read()
        if stored and stored.get("access_token") != failed_token and not has_expired(stored):
            return stored                 # another process rotated it: adopt it, spend nothing
        # Else refresh the newest family there is: a process that logged in beside us may have replaced ours.
        if reason == "token_expired":
            try:
                return self._refreshed(stored or self._tokens)
            except NodeError as error:
                return self._after_failed_refresh(failed_token, error)
        return self._recover_or_raise(failed_token, reason, response.status_code, response.url,
                                      self._refusal(response, response.url))

    def _refreshed(self, bundle) -> Dict[str, Any]:
        refresh = (bundle or {}).get("refresh_token")
        if not refresh:
            raise NodeError("no refresh token is available", 401)
        pair = self._auth_post("/auth/refresh", {"access_token": bundle["access_token"], "refresh_token": refresh})
        fresh = token_bundle(*pair)
        self._store.write(fresh)          # refresh tokens are single-use: persist before anything else
        return fresh

    def _after_failed_refresh(self, failed_token, error) -> Dict[str, Any]:
        """A refresh the node refused never clears tokens, unless it says the family is revoked (§1.4)."""
        advice = auth_advice(self._mode)
        if self._mode == "token" and "do not belong to the same" in str(error):    # "key" since rc.83
            advice = ("CALIMERO_AUTH_TOKEN and CALIMERO_REFRESH_TOKEN come from different logins: set both from "
                      "the same fresh login.")
        failure = NodeError("The access token expired and could not be refreshed: %s. %s"
                            % (str(error).rstrip("."), advice), 401, fix=advice)
        return self._recover_or_raise(failed_token, error.auth_error, error.status, self._base + "/auth/refresh",
                                      failure)

    def _recover_or_raise(self, failed_token, reason, status, url, failure) -> Dict[str, Any]:
        """A revoked family clears the cache and says so (§1.4); either way, recover first if this mode can."""
        if reason in REVOKED:
            self._store.clear()
        recovered = self._recovered(failed_token)
        if recovered:
            return recovered
        if reason in REVOKED:
            self._raise_revoked(reason, status, url)
        raise failure

    def _recovered(self, failed_token) -> Optional[Dict[str, Any]]:
        """What a user expects after a lost token family: credentials log in again (the reference's lack of
        re-login is a known limitation, §8.10); a handoff file the desktop app has since rewritten is adopted."""
        if self._mode == "credentials":
            log.info("logging in again as %s", self._credentials[0])
            return self._login()
        if self._mode == "handoff":
            handoff, _ = read_handoff(state_dir(self._env))
            if handoff and auth_plan(self._env, handoff, self._base)[0] == "handoff" \
                    and is_newer(handoff.access_token, {"access_token": failed_token}):
                fresh = token_bundle(handoff.access_token, handoff.refresh_token)
                self._store.write(fresh)
                return fresh
        return None

    def _raise_revoked(self, reason, status, url):
        """The cache file is gone; the dead token stays in memory only so a newer handoff can be told apart."""
        advice = auth_advice(self._mode)
        raise NodeError("Authentication revoked (%s): HTTP %d %s from %s. The cached tokens were cleared. %s"
                        % (reason, status, http.HTTPStatus(status).phrase, display_url(url), advice), status,
                        fix=advice, auth_error=reason)

    # ---- login (credentials mode) ----
    def _login(self, save: bool = True) -> Dict[str, Any]:
        username, password = self._credentials
        body = {"auth_method": "user_password", "public_key": username, "client_name": CLIENT_NAME,
                "permissions": ["admin"], "timestamp": int(time.time()),
                "provider_data": {"username": username, "password": password}}
        try:
            pair = self._auth_post("/auth/token", body)
        except NodeError as error:
            raise _login_error(error, self._base) from None
        bundle = token_bundle(*pair)
        if save:
            self._store.write(bundle)
        return bundle

    def _auth_post(self, path, body) -> Tuple[str, str]:
        """POST to the node's auth service (no Authorization header); the new (access, refresh) pair."""
        url = self._base + path
        for secret in (body.get("access_token"), body.get("refresh_token"),
                       (body.get("provider_data") or {}).get("password")):
            sent_secret(secret)
        response = self._send("POST", url, None, json.dumps(body).encode("utf-8"), "application/json",
                              None, self._timeout, changes=False)      # a login's own errors say what to do
        if not 200 <= response.status_code < 300:
            error = http_error(response.status_code, response.reason, self._redacted_body(response), url,
                               _auth_error(response))
            if response.status_code == 429:      # the login throttle (node-api §0.5.6)
                wait = response.headers.get("Retry-After", "").strip()
                error.retryable = True
                error.hint = ("The node refuses logins for %s after repeated failures: wait, then retry (and check "
                              "CALIMERO_PASSWORD if it keeps failing)." % ("%s s" % wait if wait.isdigit()
                                                                           else "a while"))
            raise error
        data = decode_json(response, url)
        access = data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(access, str) or not access:
            raise NodeError("The node's answer to POST %s carried no access_token" % path)
        refresh = data.get("refresh_token")
        sent_secret(access), sent_secret(refresh)         # this process sends them from now on
        return access, refresh if isinstance(refresh, str) else ""

    # ---- node_status ----
    def status(self) -> Dict[str, Any]:
        """What node_status reports; never raises: when the node is down, `health` describes the failure."""
        try:
            self.connect()
        except NodeError as error:
            location, mode = self._attempt or (None, self._planned_mode())
            return {"health": _failed_health(error), "url": location.url if location else None,
                    "nodeName": location.name if location else None,
                    "discoverySource": location.source if location else None, "authMode": mode,
                    "peers": None, "identity": None}
        try:
            health = self.health()
        except NodeError as error:
            health = _failed_health(error)
        status = {"health": health, "url": self.url, "nodeName": self.name, "discoverySource": self.source,
                  "authMode": self.auth_mode}
        return dict(status, **self._facts() if health.get("status") == "alive" else {"peers": None, "identity": None})

    def _facts(self) -> Dict[str, Any]:
        """node_status's peers and identity: each null with the node's reason when it cannot be had (a fresh node
        has no identity yet), never a failure of node_status."""
        facts = {}
        for key, read in (("peers", self.peers), ("identity", self._identity_summary)):
            try:
                facts[key] = read()
            except NodeError as error:
                facts[key] = None
                facts[key + "Note"] = str(error)
        return facts

    def _identity_summary(self) -> Dict[str, Any]:
        identity = self.identity()
        return {"accountId": identity["accountId"], "publicKey": identity.get("publicKey")}

    def _planned_mode(self) -> str:
        """The auth mode the environment asks for, when discovery found no node to pair it with."""
        handoff, _ = read_handoff(state_dir(self._env))
        return auth_plan(self._env, handoff, self._named.url if self._named else None, self._default)[0]

    def planned_auth(self) -> str:
        """list_nodes' `auth` before any request: token, login or none (the mode auth_plan gives this node), "none"
        saying why when the environment's credentials are kept from it (issue 33: not the default, or remote)."""
        mode = {"handoff": "token", "credentials": "login"}.get(self._planned_mode(), self._planned_mode())
        if mode != "none" or self._default:
            return mode
        if setting(self._env, "CALIMERO_AUTH_TOKEN"):
            return "none: CALIMERO_AUTH_TOKEN goes to the default node only"
        if setting(self._env, "CALIMERO_USERNAME"):
            return "none: the password goes to the default node and loopback nodes only"
        return mode

    def reachable(self, timeout: float = PROBE_TIMEOUT) -> bool:
        """A live health probe under a short deadline (list_nodes): no sign-in, no retry."""
        url = self._named.url if self._named else self.url
        return bool(url) and _answers_health(url, timeout)


def no_longer_accepted(token: str, url: str) -> str:
    """A plain 401 to a token: the node no longer verifies it. Tokens without `key_id` predate rc.83, whose
    nodes stop accepting them once upgraded (node-api §0.5.6)."""
    why = ("it carries no key_id claim, so an older node release minted it and the node was upgraded since"
           if "key_id" not in (jwt_claims(token) or {"key_id": None})
           else "e.g. the node was upgraded or re-initialised since the token was minted")
    return ("The node at %s does not accept this session's access token (HTTP 401, no reason given): %s."
            % (display_url(_base_of(url)), why))


def _auth_error(response) -> Optional[str]:
    value = response.headers.get("x-auth-error")
    return value.strip().lower() if value else None


def _failed_health(error: NodeError) -> Dict[str, Any]:
    return {"status": "unreachable" if error.status is None else "error", "error": str(error)}


def _login_error(error: NodeError, base: str) -> NodeError:
    """`Authentication failed: <msg>` (§1.4), with a 404 read as "this node has no auth service"."""
    if error.status is None:
        return error                      # unreachable: the network message says it better
    fix = auth_advice("credentials")
    if error.status == 404:
        return NodeError("Authentication failed: the node at %s has no login service (POST /auth/token answered "
                         "404), so it probably runs without auth" % display_url(base), 404,
                         fix="Unset CALIMERO_USERNAME and CALIMERO_PASSWORD for a node without auth.")
    message = str(error)
    if not message.startswith("Authentication failed"):
        message = "Authentication failed: " + message
    return NodeError(message, error.status, error.retryable, fix=error.hint or fix, auth_error=error.auth_error,
                     hint=error.hint)


# ── check: the `mero-mcp --check` doctor ──────────────────────────────────────────────────────────

_SOURCE_TEXT = {
    "env": "CALIMERO_NODE_URL",
    "handoff": "the desktop app's handoff file",
    "named": "CALIMERO_NODE_NAME in the node home",
    "config-scan": "the node home's only (or default) node",
    "probe": "a live probe of local ports",
}
_MODE_TEXT = {
    "handoff": "handoff (the desktop app's token in agent.json)",
    "token": "token (CALIMERO_AUTH_TOKEN)",
    "credentials": "credentials (CALIMERO_USERNAME + password)",
    "none": "none (no credentials set; fine for a node that runs without auth)",
}


NOT_A_NODE_FIX = ("Point CALIMERO_NODE_URL at a Calimero node (merod), e.g. http://localhost:2528; a proxy in front of "
                  "one must pass /admin-api through unchanged.")


class _Report:
    """Lines of plain text, and the problems found, each with one fix."""

    def __init__(self, out):
        self.out = out
        self.problems = []                # (text, fix, fatal)

    def line(self, label, text):
        self.out.write("%-10s %s\n" % (label + ":", text))

    def problem(self, text, fix, fatal=True):
        self.problems.append((text, fix, fatal))

    def finish(self) -> int:
        fatal = any(p[2] for p in self.problems)
        if self.problems:
            self.out.write("Problems:\n")
            for text, fix, _ in self.problems:
                self.out.write("  - %s\n    Fix: %s\n" % (text, fix))
        self.line("Result", "the server cannot work with this node until the problems above are fixed." if fatal
                  else "OK, the server can work with this node.")
        self.out.flush()
        return 1 if fatal else 0


def check(env: Mapping[str, str], out, ports=None, mode=None, count_tools=None, toolsets=None, modules=()) -> int:
    """Print which discovery step found which node (or why none), the auth mode, health, installed apps with
    their tool counts, and one fix per problem. Non-zero when the server could not work. `mode` is the server's
    read-only setting as mero_mcp.read_only_mode gives it (read_only, line, problem, fix), which reads the variable;
    the per-app counts then are of the tools read-only mode offers.

    `count_tools(env, node)`, given by mero_mcp.py (this module never imports it), returns its ToolCount: what
    tools/list advertises with this environment, counted by the code that answers it. `toolsets` is mero_mcp's
    (problem, fix) for CALIMERO_MCP_TOOLSETS names that are no toolset, or None. `modules` are mero_mcp's (problem,
    fix) for our files missing or from another release (mero_mcp.module_problems): each one fails the check."""
    report = _Report(out)
    with _logged_lock:                    # the settings' problems are listed below: not said on stderr as well
        _logged.update(problem for problem in (timeout_setting(env)[1], response_cap_setting(env)[1]) if problem)
    out.write("mero-mcp --check\n")
    packages_ok = _report_packages(report)
    for problem, fix in modules:
        report.problem(problem, fix)
    if mode is not None:
        report.line("Mode", mode.line)
        if mode.problem:
            report.problem(mode.problem, mode.fix, fatal=False)
    if toolsets:
        report.problem(*toolsets, fatal=False)
    if not packages_ok:
        return report.finish()            # without requests there is no talking to a node
    timeout_problem = timeout_setting(env)[1]
    if timeout_problem:
        report.problem(timeout_problem, TIMEOUT_FIX, fatal=False)
    cap_problem = response_cap_setting(env)[1]
    if cap_problem:
        report.problem(cap_problem, RESPONSE_CAP_FIX, fatal=False)
    nodes_problem = nodes_setting_problem(env)
    if nodes_problem:                     # start-up stops on it too: nothing below would be what the server does
        report.line("Node", "none: %s" % nodes_problem)
        report.problem(nodes_problem, NODES_FIX)
        return report.finish()
    handoff = _report_handoff(report, env)
    orphan = password_without_username(env)
    if orphan:
        report.problem(orphan, ORPHAN_PASSWORD_FIX, fatal=False)
    try:
        directory = node_directory(env)
        if directory.multi:
            _report_named_nodes(report, env, directory)
            location = Location(directory.default.url, directory.default.name, "named")
        else:
            location, handoff = _resolve(env, ports)
    except NodeError as error:
        report.line("Node", "none: %s" % error)
        report.line("Auth", _MODE_TEXT[auth_plan(env, handoff, None)[0]])
        report.problem(str(error), error.fix or "Set CALIMERO_NODE_URL to a running node's address.")
        return report.finish()
    report.line("Node", "%s, found by %s (name: %s)" % (location.url, _SOURCE_TEXT[location.source],
                                                          location.name or "none"))
    https = location.url.lower().startswith("https:")
    if https or any(setting(env, name) for name in CA_SETTINGS):
        line, unreadable = ca_bundle_line(env)
        report.line("TLS", line)
        if unreadable:
            report.problem(unreadable, CA_FIX if https else "Correct or unset it.", fatal=https)
    if location.source not in ("env", "handoff"):           # the node home was read: say what it passed over
        for entry in node_dirs(env):
            if entry.problem:
                report.problem("%s, so that node is passed over" % entry.problem, CONFIG_FIX, fatal=False)
    auth = _MODE_TEXT[auth_plan(env, handoff, location.url)[0]]
    node, step = Node(env, ports), "Auth"
    try:
        node._connect_to(location, handoff, fresh_login=True)      # a cached token must not hide a wrong password
        report.line("Auth", auth)
        step = "Health"
        report.line(step, node.health()["status"])
        step = "Apps"
        apps = node.applications()
    except NodeError as error:            # one line for the step: a failed login is the Auth line
        report.line(step, "failed: %s" % error)
        if isinstance(error, UnexpectedAnswer) or (step == "Health" and error.status in (404, 405)):
            report.problem("%s answers HTTP but is not a Calimero node: %s" % (display_url(location.url), error),
                           NOT_A_NODE_FIX)
        else:
            report.problem(str(error), error.fix or "Check the node's log, then run mero-mcp --check again.")
        return report.finish()
    counted = _count_tools(report, count_tools, env, node)
    abi_named = any("abi.py" in problem for problem, _ in modules)
    _report_apps(report, node, apps, bool(mode and mode.read_only), counted.left_out if counted else (), abi_named)
    if counted:
        _report_tool_budget(report, counted, apps)
    return report.finish()


def _report_named_nodes(report, env, directory) -> None:
    """Multi-node mode: one line per named node (its health and how it signs in), all probed at once. A node
    other than the default being down is said, not fatal: the server works without it. The default's own lines
    follow, as in single mode."""
    report.line("Nodes", "%d named (multi-node mode); default: %s" % (len(directory.nodes), directory.default.name))

    def line(named):
        node = Node(env, named=named, default=named == directory.default)
        try:
            node.connect()
            return named, "%s, auth %s" % (node.health()["status"], _MODE_TEXT[node.auth_mode]), True
        except NodeError as error:
            return named, str(error), False

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=len(directory.nodes)) as pool:
        results = list(pool.map(line, directory.nodes))
    for named, said, ok in results:
        label = "%s%s%s" % (named.name, " (default)" if named == directory.default else "",
                            " (ro)" if named.read_only else "")
        report.line("  " + label, "%s: %s" % (named.url, said if ok else "unreachable or refused: " + said))
        if not ok and named != directory.default:
            report.problem('node "%s" cannot be used now: %s' % (named.name, said),
                           "Start it (merod --node %s run), or fix its entry; the other nodes work meanwhile."
                           % named.name, fatal=False)


def _report_packages(report) -> bool:
    """The runtime packages this Python has; False when requests is missing."""
    from importlib import metadata
    found, failed = [], None
    for package in RUNTIME_PACKAGES:
        try:
            __import__(package)
        except ImportError as error:
            failed = failed or (package, error)
            found.append("%s missing" % package)
            continue
        try:
            found.append("%s %s" % (package, metadata.version(package)))
        except metadata.PackageNotFoundError:         # importable, but installed without metadata
            found.append(package)
    report.line("Python", "%s (%s)" % (sys.executable, ", ".join(found)))
    if failed:                            # one problem naming every missing package
        report.problem(missing_package(*failed, advice=False), install_advice(absent_packages(failed[0])))
    return "requests missing" not in found


def _report_handoff(report, env):
    directory = state_dir(env)
    if os.path.exists(directory) and not os.path.isdir(directory):
        report.problem("The state directory %s is a file, not a directory: tokens cannot be cached and app handles "
                       "will not survive a restart" % directory, STATE_DIR_FIX, fatal=False)
    handoff, ignored = read_handoff(directory)
    if handoff:
        report.line("Handoff", "%s (node %s)" % (handoff.path, handoff.node_url or "not named"))
        if os.name != "nt" and _mode_of(handoff.path) & 0o077:
            report.problem("%s can be read by other users, and it holds an admin token" % handoff.path,
                           "chmod 600 %s (the desktop app writes it; this server never changes it)" % handoff.path,
                           fatal=False)
    elif ignored:
        report.line("Handoff", "ignored: " + ignored)
        report.problem(ignored, "Reconnect the agent from the Calimero desktop app, or delete the file.", False)
    else:
        report.line("Handoff", "none in %s" % directory)
    return handoff


def _mode_of(path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:                      # gone since it was read
        return 0


def _report_apps(report, node, apps, read_only=False, left_out=(), abi_named=False):
    """`abi_named`: a problem already names abi.py (missing beside mero_mcp.py, or from another release): it is not
    said again, and no abi.py found elsewhere on sys.path counts tools the server, which refuses that one, lacks."""
    report.line("Apps", "%d installed" % len(apps) if apps else "none installed (install one with "
                                                                 "install_application)")
    abi = None
    try:
        if not abi_named:
            import abi
    except Exception as error:           # abi.py broken: the apps are still listed
        report.problem("abi.py cannot be imported (%s), so tool counts are unknown" % error,
                       "Reinstall mero-mcp.", False)
    for app in apps:
        label = " ".join(str(part) for part in (app.get("package") or app.get("id"), app.get("version")) if part)
        services = _services_of(node, app)
        counts = [_tool_count(report, node, abi, app, label, service, read_only) for service in services or [None]]
        shown = ", ".join("%s: %s" % (service, count) for service, count in zip(services, counts)) \
            if len(services) > 1 else counts[0]
        if app.get("id") in left_out:
            shown += " (left out by CALIMERO_MCP_APPS: call still reaches its methods)"
        report.out.write("  - %s: %s\n" % (label, shown))


# Hosts that pass only so many tools to the model: Cursor sends the first 40, VS Code at most 128.
TOOL_LIMITS = (("Cursor", 40), ("VS Code", 128))


def _count_tools(report, count_tools, env, node):
    if count_tools is None:
        return None
    # What the server count_tools builds logs on stderr would land amid this report: its catalog's lines (an app
    # skipped for its ABI, a missing abi.py) are said by the report itself, per app and as module problems, and the
    # rest (a setting it read, e.g. CALIMERO_MCP_MAX_RESULT_CHARS) become non-fatal problems.
    import io
    logged = io.StringIO()
    try:
        with contextlib.redirect_stderr(logged):
            return count_tools(env, node)
    except Exception as error:           # abi.py or a package missing, a node that fails mid-read
        report.line("Tools", "unknown: %s" % error)
        return None
    finally:
        for line in logged.getvalue().splitlines():
            text = line[len(LOG_PREFIX):] if line.startswith(LOG_PREFIX) else line
            if text and not text.startswith(CATALOG_LINES):
                report.problem(text, SETTING_FIX, fatal=False)


LOG_PREFIX = "[mero-mcp] "
CATALOG_LINES = ("skipping ", "app list ")     # mero_mcp.py's catalog: an app left without tools, a failed read
SETTING_FIX = "Correct or unset the setting it names (README.md, Configuration)."


def _report_tool_budget(report, counted, apps):
    """The number of tools a host will be offered, the host limits it passes, how to trim; and the
    CALIMERO_MCP_APPS names that match nothing (the server logs them too)."""
    over = [name for name, limit in TOOL_LIMITS if counted.advertised > limit]
    limits = " and ".join("%s (%d)" % (name, limit) for name, limit in TOOL_LIMITS if name in over)
    report.line("Tools", "%d advertised (%d fixed, %d for apps)%s" % (
        counted.advertised, counted.fixed, counted.advertised - counted.fixed,
        "; over the limit%s of %s" % ("s" if len(over) > 1 else "", limits) if over else ""))
    if over:
        trims = ["CALIMERO_MCP_APPS=<app>,<app> gives tools only to the apps named (call reaches every app)"]
        if counted.fewest_fixed < counted.fixed:
            trims.insert(0, "CALIMERO_MCP_TOOLSETS=core keeps %d of the %d fixed tools"
                         % (counted.fewest_fixed, counted.fixed))
        report.out.write("  To trim: %s.\n" % "; ".join(trims))
    installed = ", ".join(str(app.get("package") or app.get("id")) for app in apps) or "(none)"
    for name in counted.unmatched:
        report.problem('CALIMERO_MCP_APPS names "%s", which matches no installed application' % name,
                       "Name an app by its id, package, last package segment or display name; installed: %s."
                       % installed, fatal=False)


def _services_of(node, app) -> List[str]:
    """Service names of a multi-service app; the list carries them in newer releases, else the app record."""
    services = app.get("services")
    if services is None:
        try:
            services = (node.application(app["id"]) or {}).get("services")
        except NodeError:
            services = None
    return sorted(services) if isinstance(services, dict) and len(services) > 1 else []


def _tool_count(report, node, abi, app, label, service, read_only=False) -> str:
    """How many tools the app's ABI generates (abi.tool_methods); in read-only mode only its [view] methods' tools
    are offered."""
    if abi is None:
        return "tools unknown"
    where = label + ("/" + service if service else "")
    try:
        manifest = abi.parse_manifest(node.abi(app["id"], service), where)
    except NodeError as error:
        report.problem("%s: %s" % (where, error), error.fix or "Rebuild the application with `cargo mero build` "
                                                               "so it embeds its ABI, then reinstall it.", False)
        return "no tools (ABI unavailable)"
    except ValueError as error:           # abi.AbiError: a manifest we refuse
        report.problem("%s: %s" % (where, error), "Rebuild the application with a current `cargo mero build`.",
                       False)
        return "no tools (ABI refused)"
    methods = abi.tool_methods(manifest)
    count = len([m for m in methods if abi.is_read_only(m)] if read_only else methods)
    shown = "%d tool%s" % (count, "" if count == 1 else "s")
    return shown + (" ([view] only; %d in all)" % len(methods) if read_only and count != len(methods) else "")


# ── Events: the node's SSE stream, one per Node (node-api §0.9) ───────────────────────────────────────────────
# One reader thread per node parses, filters and appends; subscriptions go out on a second short-lived thread;
# both use the stream's own requests.Session, so the stream never holds a connection the calls need. The node
# keeps no history: what is known starts when a context was first watched, and every break is a Gap entry.

EVENTS_VARIABLE = "CALIMERO_MCP_EVENTS"
EVENT_CONTEXTS = 32                      # contexts subscribed at once; the least recently used goes out
EVENT_ENTRIES = 100                      # entries kept per context
EVENT_PAYLOAD = 2048                     # characters of a payload's JSON kept; the rest is cut, its size said
EVENT_FRAME_LIMIT = 8 << 20              # a frame larger than this is skipped as a gap, never held whole
EVENT_KIND_LIMIT = 100                   # core's own bound on an event's kind
EVENT_ECHOES = 16                        # recent StateMutations remembered per context, to keep an echo once
SSE_READ_TIMEOUT = 45.0                  # the node sends a keep-alive every 15 s: three missed is a stall
EVENT_POLL_SECONDS = 5.0                 # how often a wait reads the state hash (a write that emitted nothing)
EVENT_PROGRESS_SECONDS = 10.0            # how often a wait says it still waits, when the caller asked
EVENT_FOLLOW_SECONDS = 2.0               # how long a first touch waits for its context to be subscribed
SSE_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
STREAM_KINDS = ("Changed", "SyncStatus", "AppVersionChanged", "XCall", "Gap")
EVENTS_OFF = ("off", "0", "false", "no")


def events_off(env: Mapping[str, str]) -> bool:
    return (setting(env, EVENTS_VARIABLE) or "").lower() in EVENTS_OFF


def _now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class SseParser:
    """Frames of a text/event-stream (WHATWG's rules: `event`, `data`, `id` fields, `:` comments, a blank line ends a
    frame; LF, CRLF or CR end lines). Bytes in, (event, id, data) out; a frame past `limit` bytes is dropped as it
    arrives and reported as SKIPPED, so no frame is ever held whole past the limit."""

    SKIPPED = ("skipped", None, None)

    def __init__(self, limit: int = EVENT_FRAME_LIMIT):
        self.limit = limit
        self._pieces, self._held = [], 0          # the unfinished line, in pieces (a long line arrives in many)
        self._cr = False                           # the last chunk ended in CR: a LF starting the next is its pair
        self._event, self._data, self._size, self._skipping = None, [], 0, False
        self.last_id = None

    def feed(self, chunk: bytes) -> List[Tuple[Optional[str], Optional[str], Optional[str]]]:
        frames = []
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._cr = chunk.endswith(b"\r")
        lines = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for index, piece in enumerate(lines):
            if index == len(lines) - 1:            # no line end yet: hold it (or, past the limit, drop it)
                if piece:
                    self._held += len(piece)
                    if self._held > self.limit or self._skipping:
                        self._skipping, self._pieces = True, []
                    else:
                        self._pieces.append(piece)
                break
            line = b"".join(self._pieces) + piece if self._pieces else piece
            over = self._held + len(piece) > self.limit
            self._pieces, self._held = [], 0
            frame = self._line(line, over)
            if frame is not None:
                frames.append(frame)
        return frames

    def _line(self, line: bytes, over: bool):
        if not line:
            return self._dispatch()
        if over:
            self._skipping, self._data = True, []
            return None
        if line.startswith(b":"):
            return None                            # a comment: the node's keep-alive
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        text = value.decode("utf-8", "replace")
        if name == b"data" and not self._skipping:
            self._size += len(value) + 1
            if self._size > self.limit:
                self._skipping, self._data = True, []
            else:
                self._data.append(text)
        elif name == b"event":
            self._event = text
        elif name == b"id" and "\0" not in text:
            self.last_id = text
        return None

    def _dispatch(self):
        skipped, data, event = self._skipping, self._data, self._event
        self._event, self._data, self._size, self._skipping = None, [], 0, False
        if skipped:
            return self.SKIPPED
        if not data:
            return None
        return (event or "message", self.last_id, "\n".join(data))


def event_payload(data) -> Tuple[Any, Optional[int]]:
    """An app event's `data` (a JSON array of byte values holding the payload's UTF-8 JSON, §0.9) as JSON data, cut
    to EVENT_PAYLOAD characters of its JSON text: (payload, original size in characters when cut, else None)."""
    if isinstance(data, list):
        try:
            raw = bytes(data)
        except (TypeError, ValueError):
            raw = None
        if raw is not None:
            if not raw:
                return None, None                 # a unit variant
            text = raw.decode("utf-8", "replace")
            try:
                data = json.loads(text)
            except (ValueError, RecursionError):
                data = text
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None, None
    if len(text) <= EVENT_PAYLOAD:
        return data, None
    return text[:EVENT_PAYLOAD], len(text)


class _Watched:
    """One context's known events: a ring of entries, numbered from 1 in arrival order."""

    def __init__(self):
        self.entries = collections.deque(maxlen=EVENT_ENTRIES)
        self.count = 0                             # entries ever written (the last one's n)
        self.since = _now_text()
        self.subscribed = False
        self.refused = False                       # the node dropped it from a subscription: not ours to observe
        self.echoes = collections.deque(maxlen=EVENT_ECHOES)
        self.mutations = 0                         # StateMutation frames seen (an echo included)
        self.hash = None                           # the state hash the last poll read
        self.framed = False                        # a StateMutation came since that poll

    def add(self, entry: Dict[str, Any]) -> None:
        self.count += 1
        self.entries.append(dict({"n": self.count, "at": _now_text()}, **entry))


class EventStream:
    """The node's event stream as the session sees it (node-api §0.9): opened on the first `touch`, then kept
    connected (backoff, Last-Event-ID, re-subscribing a new session, a token refresh) until the process ends."""

    def __init__(self, node: "Node"):
        self._node = node
        self._cond = threading.Condition()
        self._watched = collections.OrderedDict()    # context id -> _Watched, least recently used first
        self._pending, self._leaving = set(), set()
        self.state = "idle"                          # idle, connecting, live, reconnecting, polling
        self.why = None                              # why polling only, or what the last connect met
        self._session_id = None
        self._last_id = None
        self._thread = None
        self._subscriber = None
        self._response = None
        self._http = None
        self._down_since = None
        if events_off(node._env):
            self.state, self.why = "polling", "%s=off turns the stream off" % EVENTS_VARIABLE

    # ---- what the tools ask ----
    def touch(self, context_id: str, opens: bool = True) -> bool:
        """Watch this context from now on (the least recently used past EVENT_CONTEXTS goes out), opening the
        stream if need be (`opens`: else only while it is open); never waits for the node. True when it is new."""
        with self._cond:
            watched = self._watched.get(context_id)
            if watched is not None:
                self._watched.move_to_end(context_id)
                return False
            if not opens and self._thread is None and self.state != "polling":
                return False
            self._watched[context_id] = _Watched()
            while len(self._watched) > EVENT_CONTEXTS:
                gone, old = self._watched.popitem(last=False)
                self._pending.discard(gone)
                if old.subscribed:
                    self._leaving.add(gone)
            if self.state == "polling":
                return True
            self._pending.add(context_id)
            if self._thread is None:
                self.state = "connecting"
                self._thread = threading.Thread(target=self._run, name="events", daemon=True)
                self._thread.start()
            elif self._session_id is not None:
                self._kick()
            return True

    def subscribed(self, context_id: str) -> bool:
        with self._cond:
            watched = self._watched.get(context_id)
            return bool(watched and watched.subscribed and self.state == "live")

    def status(self, context_id: str) -> Dict[str, Any]:
        """The stream's state as one context sees it: live, connecting, reconnecting or polling (and why)."""
        with self._cond:
            watched = self._watched.get(context_id)
            state, why = self.state, self.why
            if watched is not None and watched.refused:
                state, why = "polling", "the node did not subscribe this context (the token may not observe it)"
            elif state == "live" and watched is not None and not watched.subscribed:
                state = "subscribing"
            shown = {"stream": state}
            if why and state != "live":
                shown["why"] = why
            if watched is not None:
                shown["knownSince"] = watched.since
            return shown

    def follow(self, context_id: str, seconds: float) -> bool:
        """Wait up to `seconds` for a touched context to be subscribed, while the stream connects or subscribes it
        (never while it reconnects or polls): what comes before that is lost (§0.9: no history). True when it is."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while True:
                watched = self._watched.get(context_id)
                if watched is None or watched.refused or self.state not in ("connecting", "live") \
                        or current_scope().cancelled:
                    return False
                if watched.subscribed and self.state == "live":
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))      # connecting -> reconnecting is not notified

    def mark(self, context_id: str) -> Optional[Tuple[int, int]]:
        """Where this context's entries and mutations stood as a call was sent; None unless it is subscribed."""
        with self._cond:
            watched = self._watched.get(context_id)
            if watched is None or not watched.subscribed or self.state != "live":
                return None
            return watched.count, watched.mutations

    def since_mark(self, context_id: str, mark: Tuple[int, int], grace: float) -> Tuple[List[Dict[str, Any]], bool]:
        """(the entries written after `mark`, whether a StateMutation came after it), once one came or `grace`
        seconds passed."""
        deadline = time.monotonic() + grace
        with self._cond:
            while True:
                watched = self._watched.get(context_id)
                if watched is None:
                    return [], False
                left = deadline - time.monotonic()
                if watched.mutations > mark[1] or left <= 0:
                    return [e for e in watched.entries if e["n"] > mark[0]], watched.mutations > mark[1]
                self._cond.wait(left)

    def entries(self, context_id: str, after: int = 0, kinds=None) -> Tuple[List[Dict[str, Any]], int, int]:
        """(entries after `after`, of `kinds` if given, oldest first; the last n written; the oldest n kept)."""
        with self._cond:
            watched = self._watched.get(context_id)
            if watched is None:
                return [], 0, 0
            found = [e for e in watched.entries if e["n"] > after and (not kinds or e["kind"] in kinds)]
            oldest = watched.entries[0]["n"] if watched.entries else watched.count + 1
            return found, watched.count, oldest

    def wait(self, context_id, after, kinds, seconds, poll_every, progress=None) -> bool:
        """Wait up to `seconds` for an entry after `after` (of `kinds`), reading the state hash every `poll_every`
        seconds; a cancel of the calling call (its scope's ticket) ends it at once. True when one came."""
        start = time.monotonic()
        deadline, next_poll = start + seconds, start + poll_every
        next_progress = start + EVENT_PROGRESS_SECONDS
        while True:
            now = time.monotonic()
            if self.entries(context_id, after, kinds)[0]:
                return True
            if now >= deadline or current_scope().cancelled:
                return False
            if now >= next_poll:
                next_poll = now + poll_every
                try:
                    self.poll(context_id)
                except NodeError:
                    pass                          # the next poll tries again; the wait goes on
                continue
            if progress is not None and now >= next_progress:
                next_progress = now + EVENT_PROGRESS_SECONDS
                progress(now - start)
            with self._cond:
                self._cond.wait(min(0.1, deadline - now, next_poll - now))

    def poll(self, context_id: str) -> None:
        """Read the context's state hash (a GET on the calls' session): a move that no StateMutation explains is
        a `Changed` entry (a peer's write that emitted nothing raises no frame, §0.9)."""
        record = self._node.context(context_id)
        state_hash = (record or {}).get("contextStateHash")
        with self._cond:
            watched = self._watched.get(context_id)
            if watched is None:
                return
            if watched.hash is not None and state_hash != watched.hash and not watched.framed:
                watched.add({"kind": "Changed", "note": "the state changed with no event (one write or more)"})
                self._cond.notify_all()
            watched.hash, watched.framed = state_hash, False

    # ---- the reader thread ----
    def _run(self):
        attempt = 0
        while True:
            try:
                response = self._connect()
            except NodeError as error:
                response, self.why = None, str(error)
            if response is not None:
                attempt = 0 if self._read(response) else attempt
            with self._cond:
                if self.state == "polling":
                    return
                if self._down_since is None and self._session_id is not None:
                    self._down_since = _now_text()
                self.state = "reconnecting"
            time.sleep(SSE_BACKOFF[min(attempt, len(SSE_BACKOFF) - 1)])
            attempt += 1

    def _session(self):
        if self._http is None:
            self._http = _new_session()
        return self._http

    def _send(self, method, path, body=None, stream=False, extra=None):
        """One request of the stream, bearer token in its header (never in the URL), renewing an expired token."""
        node = self._node
        node.connect()
        url = node._base + path
        session, sent = self._session(), []

        def send(token):
            if sent:
                sent.pop().close()                  # a refused attempt: its connection goes back, unread
            headers = _headers(token, "application/json" if body is not None else None)
            headers.update(extra or {})
            try:
                sent.append(session.request(method, url, headers=headers, json=body, stream=stream,
                                            allow_redirects=False,
                                            timeout=(node._timeout, SSE_READ_TIMEOUT if stream else node._timeout)))
            except _requests().RequestException as error:
                raise network_error(error, url, node._timeout, "GET") from None
            return sent[-1]
        return node._send_authenticated(send)

    def _connect(self):
        extra = {"Accept": "text/event-stream"}
        if self._session_id is not None and self._last_id:
            extra["Last-Event-ID"] = self._last_id
        response = self._send("GET", "/sse", stream=True, extra=extra)
        if response.status_code in (403, 404):
            response.close()
            why = ("this node has SSE switched off (GET /sse answered 404)" if response.status_code == 404 else
                   "the token lacks the context:subscribe permission (GET /sse answered 403)")
            self._polling(why)
            return None
        if response.status_code != 200:
            response.close()
            self.why = "GET /sse answered HTTP %d" % response.status_code
            return None
        return response

    def _polling(self, why):
        with self._cond:
            self.state, self.why = "polling", why
            for watched in self._watched.values():
                watched.subscribed = False
            self._cond.notify_all()
        log.warning("Events: %s; the events tool reads the state hash instead.", why)

    def _read(self, response) -> bool:
        """Read frames until the stream ends or stalls; True when it had connected (the node sent its frame)."""
        parser, connected = SseParser(), False
        self._response = response
        try:
            for chunk in response.iter_content(None):
                for frame in parser.feed(chunk):
                    if frame is SseParser.SKIPPED:
                        self._gap_all("a frame over %d bytes was skipped" % EVENT_FRAME_LIMIT)
                        continue
                    connected = self._take(frame, response) or connected
                if parser.last_id:
                    self._last_id = parser.last_id
        except Exception as error:          # a reset, a stall past SSE_READ_TIMEOUT, a closed response
            self.why = "the stream broke (%s)" % type(error).__name__
        finally:
            self._response = None
            response.close()
        return connected

    def _take(self, frame, response) -> bool:
        try:
            message = json.loads(frame[2])
        except (ValueError, RecursionError):
            return False
        if not isinstance(message, dict):
            return False
        if message.get("type") == "connect":
            self._connected(str(message.get("session_id")), message.get("reconnect") is True
                            or response.headers.get("X-SSE-Reconnect") == "true")
            return True
        event = message.get("result")
        if isinstance(event, dict) and isinstance(event.get("contextId"), str):
            self._event(event)
        return False

    def _connected(self, session_id, resumed):
        with self._cond:
            new = session_id != self._session_id or not resumed
            self._session_id, self.state, self.why = session_id, "live", None
            down, self._down_since = self._down_since, None
            for context_id, watched in self._watched.items():
                if down is not None:
                    watched.add({"kind": "Gap", "note": "the stream was down from %s: events then are lost" % down})
                if new:
                    watched.subscribed = False
                    self._pending.add(context_id)
            self._cond.notify_all()
            if self._pending or self._leaving:
                self._kick()

    def _event(self, event):
        context_id, kind, data = event["contextId"].lower(), event.get("type"), event.get("data")
        with self._cond:
            watched = self._watched.get(context_id)
            if watched is None or not isinstance(data, dict):
                return                              # not watched (an unsubscribe in flight), or no record
            if kind == "StateMutation":
                self._mutation(watched, data)
            elif kind in ("SyncStatus", "AppVersionChanged", "XCall"):
                payload, size = event_payload(data)
                watched.add(dict({"kind": kind, "data": payload}, **({"size": size} if size else {})))
            else:
                return                              # Ephemeral presence, and what a newer core adds
            self._cond.notify_all()

    @staticmethod
    def _mutation(watched, data):
        watched.mutations += 1
        watched.framed = True
        events = data.get("events") if isinstance(data.get("events"), list) else []
        try:
            key = json.dumps([data.get("newRoot"), events], sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            key = None
        if key is not None and key in watched.echoes:
            return                                  # the author's own delta, echoed back over gossip
        watched.echoes.append(key)
        if not events:                              # a local write that emitted nothing (an event-less app's)
            watched.add({"kind": "Changed", "note": "a write that emitted no event"})
        for item in events:
            if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
                continue
            payload, size = event_payload(item.get("data"))
            entry = {"kind": item["kind"][:EVENT_KIND_LIMIT], "payload": payload}
            if size:
                entry["size"] = size
            watched.add(entry)

    def _gap_all(self, why):
        with self._cond:
            for watched in self._watched.values():
                watched.add({"kind": "Gap", "note": why})
            self._cond.notify_all()

    # ---- subscriptions, on their own thread ----
    def _kick(self):
        """Start the subscriber unless it runs (called under the lock)."""
        if self._subscriber is None or not self._subscriber.is_alive():
            self._subscriber = threading.Thread(target=self._subscribe_pending, name="events-subscribe", daemon=True)
            self._subscriber.start()

    def _subscribe_pending(self):
        while True:
            with self._cond:
                asked, leaving = sorted(self._pending), sorted(self._leaving)
                self._pending, self._leaving = set(), set()
                session_id = self._session_id
                if (not asked and not leaving) or session_id is None or self.state == "polling":
                    return
            try:
                if leaving:
                    self._subscription(session_id, "unsubscribe", leaving)
                if asked:
                    answer = self._subscription(session_id, "subscribe", asked)
                    self._subscribed(asked, answer)
            except NodeError as error:
                self._retry_later(asked, error)
                return

    def _subscription(self, session_id, method, contexts):
        body = {"id": session_id, "method": method, "params": {"contextIds": contexts}}
        response = self._send("POST", "/sse/subscription", body=body)
        if response.status_code == 403:
            self._polling("the token lacks the context:subscribe permission (POST /sse/subscription answered 403)")
            return None
        if response.status_code in (400, 404):       # the node forgot the session: reconnect for a new one
            with self._cond:
                self._down_since = self._down_since or _now_text()     # what it sent meanwhile is lost: a Gap
                self._session_id, self._last_id = None, None
            reading = self._response
            if reading is not None:
                reading.close()
            return None
        if response.status_code != 200:
            raise NodeError("POST /sse/subscription answered HTTP %d" % response.status_code)
        try:
            return response.json().get("result") or {}
        except (ValueError, AttributeError):
            raise NodeError("POST /sse/subscription answered no JSON object") from None

    def _subscribed(self, asked, answer):
        if answer is None:
            return
        kept = {c.lower() for c in answer.get("contexts") or [] if isinstance(c, str)}
        with self._cond:
            for context_id in asked:
                watched = self._watched.get(context_id)
                if watched is not None:
                    watched.subscribed = context_id in kept
                    watched.refused = context_id not in kept       # dropped silently: not ours to observe
            self._cond.notify_all()

    def _retry_later(self, asked, error):
        with self._cond:
            self._pending.update(c for c in asked if c in self._watched)
            self.why = str(error)
        timer = threading.Timer(2.0, self._kick_locked)
        timer.daemon = True
        timer.start()

    def _kick_locked(self):
        with self._cond:
            self._kick()
