"""node.py — the Calimero node (merod) as the server sees it: `Node`, one method per node operation, every
path, body and answer shape the server uses (each answer checked before a caller sees it), discovery's probe,
and `check()`, the `mero-mcp --check` doctor. The server reaches the node only through this module: the names
it uses from the siblings below are re-exported here.

Siblings, lowest first: mero_node_errors (NodeError, secrets), mero_node_config (environment, node homes,
handoff file, node directory, tokens), mero_node_http (sessions, trust, deadlines, error mapping),
mero_node_events (the event stream). `requests` is imported lazily (first HTTP call): the server's cold start
must not pay for it. Spec references: reference-behaviour.md (§1 configuration and auth, §2 endpoints, §6 error
texts) and node-api.md (§1.2 envelopes, §1.5 auth guard, §2 auth service, §4 JSON-RPC).
"""
from __future__ import annotations

import contextlib
import http
import itertools
import json
import os
import stat
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple
from urllib.parse import quote

from mero_node_errors import (AnswerTooLarge, BadRequest, BodyTooDeep, Forbidden, kept_secret, log,
    LOG_LEVEL_VARIABLE, LOG_LEVELS, log_threshold, NodeError, NotFound, NotPublished, Refused, refused, redacted,
    sent_secret, Unauthorized, UnexpectedAnswer, Unreachable)
from mero_node_config import (_checked_node_url, _configured_location, _home_note, _logged, _logged_lock, auth_advice,
    auth_plan, CONFIG_FIX, configured_name, configured_nodes, display_url, Handoff, has_expired, is_newer, jwt_claims,
    LOCAL_FILE_LIMIT, Location, NamedNode, node_directory, node_dirs, node_home, NODES_FIX, nodes_setting_problem,
    ORPHAN_PASSWORD_FIX, password_without_username, read_handoff, read_password, registry_place, REGISTRY_VARIABLE,
    RegistryPlace, request_timeout, response_cap, RESPONSE_CAP_FIX, response_cap_setting, RESPONSE_CAP_VARIABLE,
    said_as, same_node, setting, sign_in_fix, start_fix, state_dir, STATE_DIR_FIX, TIMEOUT_FIX, timeout_setting,
    token_bundle, token_cache_path,
    token_problem, TokenStore)
from mero_node_http import (_base_of, _headers, _is_short, _NETWORK_REASONS, _new_session, _not_json, _prepared,
    _registry_session, _requests, _session, _session_lock, _unreadable_hint, absent_packages, BODY_EXCERPT,
    ca_bundle_line, CA_FIX, CA_SETTINGS, current_scope, cut_off, decode_json, fetch, http_error, install_advice, Late,
    late, LONE_NODE_FIX, MAX_ANSWER_NESTING, missing_package, nested_past, network_error, refuse_if_cancelled,
    rpc_error, RUNTIME_PACKAGES, scope, too_large, TooLarge, traced)
from mero_node_events import EventStream

# What the server reads of the node beyond what this module uses itself: it reaches the node only through here.
from mero_node_errors import NoAnswer, NotSent, ServerError      # NodeError's kinds not raised here
from mero_node_config import ensure_dir, is_loopback_url, keep_private
from mero_node_http import preload
from mero_node_events import EVENT_ENTRIES
FOR_THE_SERVER = (EVENT_ENTRIES, ensure_dir, is_loopback_url, keep_private, preload,   # (so pyflakes sees them used)
                  NoAnswer, NotSent, ServerError)

# ── Constants ─────────────────────────────────────────────────────────────────────────────────────

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"
PROBE_PORTS = (2528, 2428, 2529, 2429)   # desktop app, merod CLI convention, then their neighbours (§1.3)
PROBE_TIMEOUT = 2.0
JOIN_TIMEOUT = 65.0                      # namespace join waits for peers (§1.4)
PAGE_LIMIT = 1000                        # the node's largest page; its default is 100 (node-api §3.3, §3.6)
MAX_OFFSET = 100000                      # the node clamps larger offsets, which would repeat the last page forever
CLIENT_NAME = "mero-mcp"
MAX_MIME_TYPE = 255                      # characters of a blob's MIME type (RFC 6838: 127 + / + 127)

REVOKED = ("token_reuse", "token_revoked")

# What some older nodes require on namespace and group creation (reference §2.1); sent only when a node asks.
UPGRADE_POLICY = {"upgradePolicy": "LazyOnAccess"}


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


def _probed_location(env, ports) -> Location:
    found = probe(PROBE_PORTS if ports is None else ports)
    if found:
        return Location(found[0], None, "probe")
    passed = [entry.problem for entry in node_dirs(env) if entry.problem]
    raise Unreachable("No Calimero node found. Start one in the Calimero desktop app, or set CALIMERO_NODE_URL. "
                      "(Looked in %s and probed local ports.)%s%s" % (node_home(env), _home_note(env), "".join(
                          " Passed over: %s." % problem for problem in passed)),
                      fix=CONFIG_FIX if passed else "Start a node (Calimero desktop app, or `merod --node <name> "
                                                    "run`), or set CALIMERO_NODE_URL to a running node's address.")


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
REGISTRY_FIELDS = Fields(required=("package",), texts=("appVersion", "signerId"), objects=("metadata",))


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


def kept_invitation(answer) -> Dict[str, Any]:
    """Answer.invitation, its bearer parts recorded as secrets before anything else sees them."""
    invitation = Answer.invitation(answer)
    signed, _ = signed_invitation(invitation)
    inner = signed.get("invitation")
    kept_secret(signed.get("inviter_signature"))
    kept_secret(inner.get("secret_salt") if isinstance(inner, dict) else None)
    return invitation


# A registry miss at install (§0.5.3), in the node's words.
PUBLISHED_MISS = "has no application published at"
PUBLISHED_MISS_TEXT = "the configured Http source has no application published at %s@%s"


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
    if isinstance(error, NotFound):
        where = "on this node or among its context's peers" if context_id else "on this node"
        return NotFound("Blob %s is not %s" % (blob_id, where), 404,
                        hint="list_blobs shows the blobs this node holds%s." % (
                            "" if context_id else "; pass context to have the node ask that context's peers"))
    if isinstance(error, BadRequest) and not is_hex64(blob_id):
        return BadRequest('"%s" is not a blob id%s' % (blob_id, ", or the context id is not valid" if context_id
                                                        else ""),
                          400, hint="A blob id is 64 hex characters (list_blobs shows them).")
    if isinstance(error, BadRequest):   # a well-formed id refused: the node's reason, never "not a blob id"
        return BadRequest("The node refused to read blob %s%s: %s" % (
            blob_id, " through context %s" % context_id if context_id else "", str(error).rstrip(".")), 400,
            hint="list_blobs shows the blobs this node holds%s." % (
                "; context must be a context id or left out" if context_id else ""))
    return error


def _blob_too_large(blob_id: str, size: int, cap: int) -> NodeError:
    return AnswerTooLarge("Blob %s is %d bytes, more than the %d bytes this server takes in one answer (%s): the "
                          "node sends a blob whole, with no ranges" % (blob_id, size, cap, RESPONSE_CAP_VARIABLE),
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
    def connected_url(self) -> Optional[str]:
        """The node's address, found (discovery) and connected to first if need be."""
        return self.connect().url

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
            raise BodyTooDeep("%s was not sent to the node: its arguments are nested too deeply to encode (more "
                              "levels than Python's JSON encoder allows)" % method) from None
        except RecursionError:          # json.loads gives up past Python's recursion limit
            raise UnexpectedAnswer("%s ran, but its output is nested too deeply to decode (more levels than Python's "
                                   "JSON decoder allows)" % method) from None
        reply = answer.value if isinstance(answer.value, dict) else {}
        if reply.get("error") is not None:
            raise self._scrubbed(rpc_error(reply["error"], context_id, method))
        result = reply.get("result")
        if not isinstance(result, dict) or "output" not in result:     # never a made-up output (node-api §4.2)
            raise self._unexpected("POST", "/jsonrpc", 'a JSON-RPC reply: a "result" object with the "output", or '
                                   'an "error"', answer.body)
        return result["output"]

    def sync_status(self, context_id: str, timeout=None) -> Dict[str, Any]:
        """JSON-RPC sync_status (§0.8): {contextId, isInitialized, syncState: {state, …}, failureCount, lastError?}."""
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": "sync_status", "params": {"contextId": context_id}}
        answer = self._exchange("POST", "/jsonrpc", body=body, timeout=timeout)
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

    def identity(self, timeout=None) -> Dict[str, Any]:
        """`{accountId, publicKey, deviceId?, ...}`; a fresh node answers 404 with why it has none yet (§0.6)."""
        return self._call("GET", "/admin-api/identity", lambda a: a.object("accountId"), timeout=timeout)

    def peers(self, timeout=None) -> int:
        """How many peers the node is connected to: `{"count": N}`, no wrapper (§0.6)."""
        return self._call("GET", "/admin-api/peers", lambda a: a.count("count"), timeout=timeout)

    # applications (§3.2)
    def applications(self) -> List[Dict[str, Any]]:
        """The installed applications' records, each with its `id` (lists may omit `services`) and its `metadata`
        decoded (decode_metadata)."""
        return self._call("GET", "/admin-api/applications",
                          lambda a: [app_metadata_decoded(row) for row in a.rows("apps", "id", fields=APP_FIELDS)])

    def application(self, app_id: str, timeout=None) -> Optional[Dict[str, Any]]:
        """One application's full record (with `services`, `metadata` decoded), or None when the node has none of
        that id: a 404, or (core's `application: Option<Application>`, older releases) `{"application": null}`."""
        return self._absent_as_none(NotFound, "GET", "/admin-api/applications/" + quoted(app_id), _application,
                                    timeout=timeout)

    def abi(self, app_id: str, service: Optional[str] = None, timeout=None) -> Dict[str, Any]:
        """The application's embedded ABI manifest (of one service, for a multi-service bundle)."""
        return self._call("GET", "/admin-api/applications/%s/abi" % quoted(app_id), Answer.object,
                          params={"service_name": service} if service else None, timeout=timeout)

    def install_application(self, package: str, version: str) -> Dict[str, Any]:
        """Install package@version from the node's own registry: `{applicationId}`. A registry miss (a 502 in
        the node's words, §0.5.3) is a NotPublished said as such, not a gateway fault to retry."""
        try:
            return self._call("POST", "/admin-api/install-application", lambda a: a.object("applicationId"),
                              body={"package": package, "version": version})
        except ServerError as error:
            if error.status != 502 or PUBLISHED_MISS not in str(error):
                raise
            raise NotPublished("The registry this node installs from does not publish %s@%s (the node: \"%s\")."
                               % (package, version, PUBLISHED_MISS_TEXT % (package, version)), 502,
                               hint=error.hint) from None

    def install_dev_application(self, path: str) -> Dict[str, Any]:
        """Install the bundle at `path` on the node's own filesystem: `{applicationId}`. The newest body is
        `{path}`; an older node requires `metadata` (ignored for a bundle) and is sent `[]` when it asks (§0.6)."""
        route = "/admin-api/install-dev-application"
        try:
            return self._call("POST", route, lambda a: a.object("applicationId"), body={"path": path})
        except NodeError as error:
            if isinstance(error, BadRequest) and "missing field `metadata`" in str(error):
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
        registry may ignore the filter), a package listed twice by one signer in the latest list refused; whatever is wrong is
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
            raise Unreachable("Cannot reach %s: %s" % (shown, reason), hint="Check that the registry is up, or "
                              "point %s at one that is." % REGISTRY_VARIABLE) from None
        if package and response.status_code == 404:
            return []
        said = shown[0].upper() + shown[1:]
        if not 200 <= response.status_code < 300:
            excerpt = redacted(response.content[:BODY_EXCERPT].decode("utf-8", "replace"))
            raise refused("%s answered HTTP %d: %s" % (said, response.status_code, " ".join(excerpt.split())),
                          response.status_code, hint="Check %s: it should be the registry's base URL "
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
        for row in asked:                                   # a version listed twice counts once (per signer)
            versions.setdefault((row.get("appVersion"), row.get("signerId")), row)
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
        """The latest list holds each package once per signer (two signers may publish one name: an application
        id hashes package and signer): one listed twice by one signer (a registry paging as it changes) is said,
        never passed on as two packages of one name."""
        seen, twice = set(), []
        for row in rows:
            key = (row["package"], row.get("signerId"))
            if key in seen and row["package"] not in twice:
                twice.append(row["package"])
            seen.add(key)
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

    def context(self, context_id: str, timeout=None) -> Optional[Dict[str, Any]]:
        """One context, or None when the node knows no such context (404; 400 for a string no id could be)."""
        return self._absent_as_none((BadRequest, NotFound), "GET", "/admin-api/contexts/" + quoted(context_id),
                                    lambda a: a.object("id", CONTEXT_FIELDS), timeout=timeout)

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

    def sync_context(self, context_id: str, timeout=None) -> None:
        """Ask the node to sync the context from its peers (answers `{"data": null}`)."""
        self._call("POST", "/admin-api/contexts/sync/" + quoted(context_id), Answer.optional_object, timeout=timeout)

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
        return self._absent_as_none((BadRequest, NotFound), "POST",
                                    "/admin-api/alias/lookup/context/" + quoted(name), Answer.alias_value, body={})

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

    def invite_to_namespace(self, namespace_id: str, expires_in: Optional[int] = None,
                            secret: bool = False) -> Dict[str, Any]:
        """The signed invitation, bare or wrapped as `{invitation, groupName}` depending on the release.
        `expires_in`: seconds it stays valid (the request's expirationTimestamp is a duration, §0.8). `secret`:
        an invitation no one is shown (a hand-over): its signature and salt are secrets as soon as they are read,
        so no text of ours carries them (`redacted`), even a joiner's refusal quoting it."""
        body = {} if expires_in is None else {"expirationTimestamp": int(expires_in)}
        shape = kept_invitation if secret else Answer.invitation
        return self._call("POST", "/admin-api/namespaces/%s/invite" % quoted(namespace_id), shape, body=body)

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
        except (Forbidden, NotFound):
            return []

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

    def _absent_as_none(self, kinds, method, path, shape, **request):
        """_call, or None when the node's refusal is one of `kinds`: its way of saying "no such thing"."""
        try:
            return self._call(method, path, shape, **request)
        except kinds:
            return None

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
            if isinstance(error, BadRequest) and "upgradePolicy" in str(error):
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
            started = time.monotonic()
            response = fetch(session, prepared, timeout, self.max_response_bytes)
            if log.isEnabledFor(10):          # --log-level debug: each node request, its status and time
                log.debug("%s %s: %d in %.0f ms", method, display_url(url), response.status_code,
                          (time.monotonic() - started) * 1000)
            return response
        except requests.RequestException as error:
            raise self._placed(network_error(error, url, timeout, kind)) from None
        except Late as error:
            raise self._placed(late(display_url(url), display_url(_base_of(url)), timeout, error.sent, kind)) from None
        except TooLarge as error:
            raise too_large(display_url(url), display_url(_base_of(url)), error, kind) from None

    def _placed(self, error: NodeError) -> NodeError:
        """A named node (one of several, or a node home's) that cannot be reached: its fix is the one node_status
        gives (its start command, or the setting that named it), not the lone node's CALIMERO_NODE_URL, in every
        answer that quotes it (call_many's rows and wait_for_sync's too)."""
        if self._named is not None and isinstance(error, Unreachable) and LONE_NODE_FIX in (error.fix or ""):
            fix = self.fix_for(error)
            if fix and LONE_NODE_FIX not in fix:
                error.fix = fix
                error.hint = error.hint if error.hint and LONE_NODE_FIX not in error.hint else fix
        return error

    def _refusal(self, response, url) -> NodeError:
        error = http_error(response.status_code, response.reason, self._redacted_body(response), url,
                           _auth_error(response))
        # Only the auth guard's answers get login advice: a 403 without x-auth-error is the node's own
        # refusal (a blob an app still uses, a group this node may not join) and its text says why.
        token = self._access_token()
        if response.status_code == 401 and token and not error.auth_error and not response.content.strip():
            advice = auth_advice(self._mode)
            return Unauthorized("%s Sign in again: %s%s" % (no_longer_accepted(token, url), advice[0].lower(),
                                                             advice[1:]), 401, fix=advice)
        if response.status_code == 401 or (response.status_code == 403 and error.auth_error):
            advice = auth_advice(self._mode)
            return refused("%s. %s" % (error.message.rstrip("."), advice), error.status, fix=advice,
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
            raise Unauthorized("no refresh token is available", 401)
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
        failure = Unauthorized("The access token expired and could not be refreshed: %s. %s"
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
            # the node it names, or the default node when it names none: never another node of the directory
            if handoff and auth_plan(self._env, handoff, self.url or self._base, self._default)[0] == "handoff" \
                    and is_newer(handoff.access_token, {"access_token": failed_token}):
                fresh = token_bundle(handoff.access_token, handoff.refresh_token)
                self._store.write(fresh)
                return fresh
        return None

    def _raise_revoked(self, reason, status, url):
        """The cache file is gone; the dead token stays in memory only so a newer handoff can be told apart."""
        advice = auth_advice(self._mode)
        raise refused("Authentication revoked (%s): HTTP %d %s from %s. The cached tokens were cleared. %s"
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
        """What node_status reports; never raises: when the node is down, `health` describes the failure and `fix`
        what to do about it. `registry`: the registry address list_registry and installs by coords would use."""
        try:
            self.connect()
        except NodeError as error:
            location, mode = self._attempt or (None, self._planned_mode())
            status = {"health": _failed_health(error), "url": location.url if location else None,
                      "nodeName": location.name if location else None,
                      "discoverySource": location.source if location else None, "authMode": mode,
                      "peers": None, "identity": None}
            return self._with_registry(dict(status, fix=self.fix_for(error, location, mode)))
        try:
            health, failed = self.health(), None
        except NodeError as error:
            health, failed = _failed_health(error), error
        status = {"health": health, "url": self.url, "nodeName": self.name, "discoverySource": self.source,
                  "authMode": self.auth_mode}
        if health.get("status") == "alive":
            facts, failed = self._facts()
            status.update(facts)
        else:
            status.update(peers=None, identity=None)
        if failed is not None and self.fix_for(failed, self._location, self.auth_mode):
            status["fix"] = self.fix_for(failed, self._location, self.auth_mode)
        return self._with_registry(status)

    def _with_registry(self, status: Dict[str, Any]) -> Dict[str, Any]:
        place = registry_place(self._env, status.get("nodeName"))
        status["registry"] = {"url": place.url, "from": place.source} if place.url else None
        if place.problem:
            status["registryNote"] = place.problem
        return status

    def fix_for(self, error: NodeError, location: Optional[Location] = None, mode: Optional[str] = None
                ) -> Optional[str]:
        """What to do about a node that cannot be used (issue 42): for a refused login the variables that sign in
        there; for one that does not answer the command that starts it (a node home on this machine holds it), else
        check it and the setting naming its URL; else the error's own fix."""
        if location is None and self._named is not None:
            location = Location(self._named.url, self._named.name, "named")
        mode = mode or self._planned_mode()
        name = location.name if location else (self._named.name if self._named else None)
        if isinstance(error, Refused) and not isinstance(error, NotFound) and (
                error.status in (401, 403) or error.auth_error or str(error).startswith("Authentication failed")):
            return sign_in_fix(self._env, name, location.url if location else None, self._default, mode)
        if isinstance(error, Unreachable) and location is not None:
            variable = {"env": "CALIMERO_NODE_URL", "named": self._named_variable()}.get(location.source)
            return start_fix(self._env, name, location.url, variable) or error.fix
        return error.fix

    def down_fix(self) -> str:
        """list_nodes' fix for a node its probe found down, from the local files alone (no request)."""
        return start_fix(self._env, self._named.name, self._named.url, self._named_variable()) or (
            "Start the node at %s." % display_url(self._named.url))

    def _named_variable(self) -> Optional[str]:
        """The setting that names this node's URL, when one does (a node home's config.toml is found by start_fix)."""
        return self._named.source if self._named and self._named.source == "CALIMERO_NODES" else None

    def _facts(self):
        """node_status's peers and identity, each null with the node's reason when it cannot be had (a fresh node
        has no identity yet), never a failure of node_status; and the first failure (its fix is said)."""
        facts, failed = {}, None
        for key, read in (("peers", lambda: {"peers": self.peers()}), ("identity", self._identity_facts)):
            try:
                facts.update(read())
            except NodeError as error:
                facts[key] = None
                facts[key + "Note"] = str(error)
                failed = failed or error
        return facts, failed

    def _identity_facts(self) -> Dict[str, Any]:
        """The node's account under the one name every answer gives it, a members listing's `identity` (issue 42),
        and its public key."""
        identity = self.identity()
        return {"identity": identity["accountId"], "publicKey": identity.get("publicKey")}

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
    return {"status": "error" if isinstance(error, Refused) else "unreachable", "error": str(error)}


def _login_error(error: NodeError, base: str) -> NodeError:
    """`Authentication failed: <msg>` (§1.4), with a 404 read as "this node has no auth service"."""
    if not isinstance(error, Refused):
        return error                      # unreachable: the network message says it better
    fix = auth_advice("credentials")
    if isinstance(error, NotFound):
        return NotFound("Authentication failed: the node at %s has no login service (POST /auth/token answered "
                        "404), so it probably runs without auth" % display_url(base), 404,
                        fix="Unset CALIMERO_USERNAME and CALIMERO_PASSWORD for a node without auth.")
    message = str(error)
    if not message.startswith("Authentication failed"):
        message = "Authentication failed: " + message
    return refused(message, error.status, error.retryable, fix=error.hint or fix, auth_error=error.auth_error,
                   hint=error.hint)


# ── check: the `mero-mcp --check` doctor ──────────────────────────────────────────────────────────

_SOURCE_TEXT = {                         # said_as: a flag that set the variable is named as the flag
    "env": "%(url)s",
    "handoff": "the desktop app's handoff file",
    "named": "%(name)s in the node home",
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
    level_problem = log_threshold(env)[1]
    if level_problem:
        report.problem(level_problem, "Set %s to one of %s, or unset it." % (LOG_LEVEL_VARIABLE, ", ".join(LOG_LEVELS)),
                       fatal=False)
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
        if directory.default is not None:     # the server's default: a named node (a lone CALIMERO_NODES one too)
            location = Location(directory.default.url, directory.default.name, "named")
            found_by = _default_found_by(env, directory)
        else:
            location, handoff = _resolve(env, ports)
            found_by = _SOURCE_TEXT[location.source] % {
                "url": said_as("CALIMERO_NODE_URL"), "name": said_as("CALIMERO_NODE_NAME")}
    except NodeError as error:
        report.line("Node", "none: %s" % error)
        report.line("Auth", _MODE_TEXT[auth_plan(env, handoff, None)[0]])
        report.problem(str(error), error.fix or "Set CALIMERO_NODE_URL to a running node's address.")
        return report.finish()
    report.line("Node", "%s, found by %s (name: %s)" % (location.url, found_by, location.name or "none"))
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


CHECK_PROBES = 16       # nodes --check probes at once: a directory of 600 is 600 threads otherwise


def _named_where(named: NamedNode) -> str:
    """Where a named node is named: CALIMERO_NODES (or the --nodes flag), or its node home's folder."""
    return said_as(named.source) if named.source != "home" else "the node home %s" % named.home


def _default_found_by(env, directory) -> str:
    """--check's "found by" for the default named node: where it is named, and what made it the default."""
    where = _named_where(directory.default)
    if setting(env, "CALIMERO_NODE_NAME"):
        return "%s, the default by %s" % (where, said_as("CALIMERO_NODE_NAME"))
    if setting(env, "CALIMERO_NODE_URL"):
        return "%s, the default by %s" % (where, said_as("CALIMERO_NODE_URL"))
    return where if len(directory.nodes) == 1 else "%s, the default as the first named node" % where


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
    with ThreadPoolExecutor(max_workers=min(len(directory.nodes), CHECK_PROBES)) as pool:
        results = list(pool.map(line, directory.nodes))
    for named, said, ok in results:
        label = "%s%s%s" % (named.name, " (default)" if named == directory.default else "",
                            " (ro)" if named.read_only else "")
        report.line("  " + label, "%s from %s: %s" % (named.url, _named_where(named),
                                                        said if ok else "unreachable or refused: " + said))
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
    from_zip = getattr(sys.modules.get("__main__"), "FROM_ZIP", None)     # the pyz's bootstrap: why not unpacked
    if isinstance(from_zip, str):
        report.line("Pyz", "runs from the zip itself, not unpacked (%s)" % from_zip)
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
EVENT_POLL_SECONDS = 5.0                 # how often a wait reads the state hash (a write that emitted nothing)
EVENT_FOLLOW_SECONDS = 2.0               # how long a first touch waits for its context to be subscribed
STREAM_KINDS = ("Changed", "SyncStatus", "AppVersionChanged", "XCall", "Gap")
