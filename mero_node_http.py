"""HTTP to a node: the lazy `requests` import, the sessions, trust (CA bundles), deadlines, a call's scope
(traceparent, cancel ticket), and every shape a node failure takes mapped to one NodeError.

Imports mero_node_errors and mero_node_config; node.py and mero_node_events import it."""
from __future__ import annotations

import contextlib
import http
import json
import os
import re
import sys
import threading
import time
from typing import Any, List, Mapping, NamedTuple, Optional, Tuple
from urllib.parse import urlsplit

from mero_node_errors import (_sent_userinfo, AnswerTooLarge, CancelledBeforeSent, NoAnswer, NodeError, refused,
    sent_secret, UnexpectedAnswer, Unreachable)
from mero_node_config import display_url, RESPONSE_CAP_VARIABLE, setting

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"

POOL_CONNECTIONS = 4
POOL_MAXSIZE = 48                        # call_many fans out to 32 at once, plus headroom
USER_AGENT = "mero-mcp"
BODY_EXCERPT = 300                       # characters of a plain-text error body we show (§6)

# W3C trace context, as the reference forwards it (§1.4): no `ff` version, no all-zero ids.
TRACEPARENT = re.compile(r"(?!ff-)[0-9a-f]{2}-(?!0{32}-)[0-9a-f]{32}-(?!0{16}-)[0-9a-f]{16}-[0-9a-f]{2}")
ABI_ROUTE = re.compile(r"/admin-api/applications/[^/]+/abi$")
BYTE_LIST = re.compile(r"\[[\d,\s]+\]")

OLD_NODE_ABI = ("This node's merod does not support the ABI endpoint (GET /admin-api/applications/:id/abi). "
                "Upgrade merod to a release that includes it.")


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


@contextlib.contextmanager
def _deadline(timeout):
    """The request sent in this block is bound to `timeout` seconds (its connection shut when they pass); a failure
    once they have passed is Late. Yields the watch: `fired` says the deadline passed even where nothing failed."""
    watch = _deadlines.start(timeout)
    _watched.value = watch
    try:
        yield watch
    except BaseException:
        if watch.fired:
            raise Late(watch.sent) from None
        raise
    finally:
        _watched.value = None
        _deadlines.stop(watch)


def _in_time(watch, response):
    """The response, unless the deadline shut it: a close-delimited body shut at the deadline looks complete."""
    if watch.fired:
        response.close()
        raise Late(True)
    return response


def fetch(session, prepared, timeout, cap):
    """Send `prepared` and read its whole answer within `timeout` seconds, connect to last byte (a node or proxy
    dripping a byte at a time is cut off at the deadline), holding at most `cap` bytes of body: a larger one is
    refused unread (by its Content-Length) or as soon as it passes the cap. Raises requests' exceptions, Late or
    TooLarge; the response returned has its content read."""
    response = None
    with _deadline(timeout) as watch:
        try:
            response = session.send(prepared, timeout=(timeout, timeout), allow_redirects=False, stream=True)
            response._content = _capped_body(response, prepared, cap)   # what requests keeps once a body is read
        except BaseException:
            if response is not None:
                response.close()
            raise
    return _in_time(watch, response)


def _capped_body(response, prepared, cap) -> bytes:
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
    return b"".join(chunks)


def opened(session, prepared, timeout, read_timeout):
    """Send `prepared` and return its response once its head came, within `timeout` seconds as `fetch` bounds a
    whole answer, its body unread (a stream, read by `arriving`; each read then waits at most `read_timeout`).
    Raises requests' exceptions or Late."""
    with _deadline(timeout) as watch:
        response = session.send(prepared, timeout=(timeout, read_timeout), allow_redirects=False, stream=True)
    return _in_time(watch, response)


def arriving(response, size=READ_CHUNK):
    """An opened body's bytes as they arrive, whatever its framing (chunked, a Content-Length, or running until
    the connection closes): one socket read at most each, where requests' iter_content waits to fill its chunk, or
    for the end of an unchunked body. An encoded body (gzip) goes through requests' decoding."""
    read1 = getattr(getattr(response.raw, "_fp", None), "read1", None)
    if read1 is None or response.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        yield from response.iter_content(None)
        return
    while True:
        chunk = read1(size)
        if not chunk:
            return
        yield chunk


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


# ── Error mapping: every shape a node failure takes → one NodeError of its kind (§6) ──────────────

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
    fix = "Start the node at %s, %s" % (base, LONE_NODE_FIX)
    if isinstance(error, requests.exceptions.SSLError):
        fix = tls_fix(base)
    return Unreachable("Cannot reach the node at %s: %s" % (shown, reason), fix=fix, hint=hint or fix)


LONE_NODE_FIX = "or point CALIMERO_NODE_URL at a running node."    # a named node's is its own (Node._placed)


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
    return NoAnswer("The request to %s was sent, but no answer came (%s)" % (shown, said), hint=CARRIED_OUT % base)


CARRIED_OUT = ("The node may have carried it out: check before repeating it (list or read what it would change). "
               "If the node at %s is slow, a larger CALIMERO_MCP_TIMEOUT gives it longer.")


def late(shown, base, timeout, sent, method) -> NodeError:
    """The request's deadline passed: never connected, or connected and not answered in full in time."""
    if sent and method != "GET":
        return no_answer(shown, base, "timed out", timeout)
    hint = "The node at %s did not answer in time: retry, and check its log if this keeps happening." % base
    fix = "Start the node at %s, %s" % (base, LONE_NODE_FIX)
    return Unreachable("Cannot reach the node at %s: timed out after %g s" % (shown, timeout), fix=fix, hint=hint)


def too_large(shown, base, error, method) -> NodeError:
    """An answer past the size cap, refused without reading it all."""
    size = ("is %d bytes (its Content-Length)" % error.declared if error.declared is not None
            else "passed %d bytes before it ended" % error.cap)
    hint = ("Ask for less (a narrower method or argument), or raise %s (now %d bytes) if answers this large are "
            "expected." % (RESPONSE_CAP_VARIABLE, error.cap))
    if method != "GET":
        hint = "The node may have carried it out: check before repeating it. " + hint
    return AnswerTooLarge("The answer from %s %s, more than this server reads (%d bytes, %s): refused, the rest "
                          "unread" % (shown, size, error.cap, RESPONSE_CAP_VARIABLE), hint=hint)


def cut_off(shown, base, method="GET"):
    return NoAnswer("Unreadable response from %s: the connection closed mid-response" % shown,
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
            return refused(OLD_NODE_ABI, status, fix="Upgrade merod to a release with the ABI endpoint.")
        message = "%s from %s - the node returned no message" % (status_line, shown)
        return refused(message, status, retryable, auth_error=auth_error, hint=_server_error_hint(status, url))
    said = node_message(text)
    advice = None if auth_error else node_advice(status, urlsplit(url).path, said or text)
    if said:                             # the node's own words; "not yet" gets advice added (and the url)
        return refused(said, status, retryable, auth_error=auth_error,
                       hint=advice or (_server_error_hint(status, url) if retryable else None))
    return refused("%s from %s - the node said: %s" % (status_line, shown, text[:BODY_EXCERPT]),
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
