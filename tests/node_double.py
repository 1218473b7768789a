"""A fake `merod` for mero-mcp's tests: the node's HTTP API as current releases (rc.27+/rc.83) serve it.

The source of truth is `../shared/spec/node-api.md` (section numbers below refer to it; §7 is the fidelity
checklist). Every id is 64-char lowercase hex. Standard library only, so the double runs anywhere the tests do.

    with NodeDouble(apps=[spec], contexts=[{"app": "com.calimero.kv-store"}]) as node:
        ...  # node.url, node.log, node.faults, node.executions

Run on its own for `make demo`:  python3 tests/node_double.py --sample [--port N] [--auth]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

# ---------------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------------

HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
HEX_STRING = re.compile(r"^(?:[0-9a-fA-F]{2})*$")
ALIAS = re.compile(r"^[A-Za-z0-9._-]{1,50}$")  # §3.4
ZERO_HASH = "0" * 64
REGISTRY_URL = "https://registry.calimero.network"
REGISTRY_PATH = "/registry"          # where the double serves a registry's own API: its base_url is url + this
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"

# §1.2: the literal runs of ten spaces come from the node's multi-line string.
AUTHORITY_NOT_YET = (
    "authority for '{}' cannot be resolved at this op's causal cut yet" + " " * 10
    + "— this node is missing history or a key it is entitled to; retry once it" + " " * 10 + "has synced"
)
MISSING_CONTENT_TYPE = "Expected request with `Content-Type: application/json`"
NO_USABLE_ABI = "application has no usable embedded ABI (absent or malformed); rebuild it with `cargo mero build`"
VISIBILITY_ERROR = "Field 'subgroup_visibility' has invalid format: must be 'open' or 'restricted'"
ROLES = ("Admin", "Member", "ReadOnly", "ReadOnlyTee", "RelayTee")   # RelayTee since rc.83 (§0.5.7)
ACCESS_TTL = 3600          # §2.2
REFRESH_TTL = 2_592_000    # §2.2 (30 days)
CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "x-auth-error, x-auth-user, x-auth-permissions",
}


# Request bodies current core reads as closed sets (§0.5.1: deny_unknown_fields on every request type but alias
# create, POST /namespaces/:ns/groups and delete context). The field lists are the request structs' own.
NAMESPACE_CREATE_FIELDS = ("applicationId", "name", "appKey", "bytecodeId")
GROUP_CREATE_FIELDS = ("applicationId", "parentGroupId", "name", "groupId", "appKey", "bytecodeId")
INSTALL_FIELDS = ("package", "version")
CONTEXT_CREATE_FIELDS = ("applicationId", "groupId", "serviceName", "contextSeed", "initializationParams",
                         "identitySecret", "name")
EMPTY_FIELDS = ()                                        # DELETE /namespaces/:id and /groups/:id take `{}`
REMOVE_MEMBERS_FIELDS = ("members",)                     # each an account id (§0.6)
ROLE_FIELDS = ("role",)
UPGRADE_FIELDS = ("targetApplicationId", "cascade", "forceCodeOnly")
RESYNC_FIELDS = ("force",)
DEV_INSTALL_FIELDS = ("path",)
# The older (rc.25-era) bodies of the §0.6 routes, which `legacy_lifecycle` serves (their extra keys are known).
LEGACY_FIELDS = {
    "install_dev_application": ("path", "metadata", "package", "version"),
    "delete_group": ("requester", "requesterSecret"),
    "remove_group_members": ("members", "requester"),
    "upgrade_group": ("targetApplicationId", "requester", "migrateMethod", "cascade"),
}
MEMBERS_FIELDS = ("members",)
MEMBER_FIELDS = ("identity", "role")                     # each entry of add-members
METADATA_FIELDS = ("name", "data")
VISIBILITY_FIELDS = ("subgroupVisibility",)
INVITE_FIELDS = ("expirationTimestamp", "recursive", "admitters", "admitterAddrs")
JOIN_FIELDS = ("invitation", "groupName")
LOGIN_FIELDS = ("auth_method", "public_key", "client_name", "permissions", "timestamp", "provider_data")
REFRESH_FIELDS = ("access_token", "refresh_token")
LOGOUT_FIELDS = ("refresh_token",)
RPC_PAYLOAD_FIELDS = ("method", "params")                # RequestPayload: adjacently tagged, beside jsonrpc/id
EXECUTE_FIELDS = ("contextId", "method", "argsJson")     # ExecutionRequest

# Typed errors of current releases (§0.5.2), `{"error": "<text>"}`. Texts node-api.md quotes are verbatim; the
# others follow core's style (lowercase, the caller's id echoed in quotes) where the spec names only the case.
GROUP_NOT_FOUND = "group '{}' not found"
CONTEXT_NOT_FOUND = "context '{}' not found"
NAMESPACE_NOT_FOUND = "namespace '{}' not found"
APPLICATION_ID_NOT_FOUND = "application '{}' not found"
NOT_A_MEMBER = "node is not a member of group '{}'"                       # §1.2, verbatim
NOT_AN_ADMIN = "node is not an admin of group '{}'"
SUBGROUP_NEEDS_ADMIN = "creating a subgroup needs admin of namespace '{}'"
LAST_ADMIN = "node is the last admin of group '{}'; make another member admin first"
GROUP_EXISTS = "group '{}' already exists"
GROUP_HAS_CONTEXTS = "group '{}' has registered contexts; delete or detach them first"
INVITATION_SPENT = "invitation already consumed or expired"
NOT_ELIGIBLE = "identity not eligible for inheritance-based join"                      # core's typed 403s, verbatim
NO_NAMESPACE_IDENTITY = "no namespace identity for this group; join the parent namespace first"
LEAVE_NAMESPACE_AS_GROUP = "group '{}' is a namespace: leave it through /admin-api/namespaces/{{id}}/leave"
INVITATION_INVALID = "invitation is invalid: its signature does not verify"
JOIN_NO_PEER = ("could not reach any member of this namespace to complete the join; make sure the inviting node is "
                "online and retry")                                       # §1.2, verbatim (504)
JOIN_KEY_PENDING = ("the join went out and the key is on its way: namespace '{}' key delivery timed out; retry once "
                    "it has arrived")                                     # 503
JOIN_NOT_ENDORSED = "a member answered but has not endorsed the join to namespace '{}' yet; retry shortly"  # 503
# Install failures of current releases are 502 text/plain (§0.5.3), verbatim.
NAMESPACE_ROOT = "cannot delete the namespace root {}; use delete_namespace instead"       # §0.6, gov-err
LAST_ADMIN_REMOVED = "cannot remove the last admin of the group"
LAST_ADMIN_DEMOTED = "cannot demote the last admin of the group"
MEMBER_NOT_FOUND = "member {} not found in group {}"
BAD_ACCOUNT = "Invalid account format: expected 64 hex characters (32 bytes)"
ALREADY_TARGETING = "group {} is already targeting this application; install a new version of it to upgrade"
NOTHING_TO_UPGRADE = "group {} has no contexts to upgrade"
UPGRADE_RUNNING = "an upgrade is already in progress for group {}; wait for it to finish"
FRESH_IDENTITY = ("this node holds neither a usable device nor an account root yet; both are minted the first time "
                  "it takes part in a namespace")
FRESH_IDENTITY_RC25 = ("this node holds neither a device nor an account root yet; both are minted the first time it "
                       "takes part in a namespace")
DEV_INSTALL_REFUSED = "install path is not permitted"
DEV_INSTALL_UNRESOLVED = "install path could not be resolved"
REGISTRY_MISS = "the configured Http source has no application published at {}@{}"
DHT_REGISTRY_MODE = ("this node is in dht registry mode, which cannot install by package@version; install from a "
                     "local .mpk bundle or via governance instead")
RAW_WASM_ABI = "application is raw wasm, which never runs; reinstall it as a signed bundle"    # §0.5.4
READ_ONLY_ROLES = ("ReadOnly", "ReadOnlyTee", "RelayTee")              # a write there is refused (§0.5.5)
NO_EXECUTE_GRANT = "this caller's token does not grant context:execute for this call"         # §0.5.5
LOGIN_THROTTLED = "Too many failed login attempts; please try again later"                    # §0.5.6
REFRESH_MISMATCH = "Access and refresh tokens do not belong to the same key"                  # §0.5.6
BLOB_MISSING = "bytecode blob {} not found in blobstore"                                     # §0.8 (the double's data)
LOGIN_ATTEMPTS = 5             # failed logins per (auth_method, public_key) before 429
RETRY_AFTER_SECONDS = 60
# Request validation (core's `Validate` impls, crates/server/primitives): the limits and ValidationError's texts.
MAX_PACKAGE_LENGTH, MAX_VERSION_LENGTH = 128, 64                      # install coordinates (§0.5.3)
MAX_INIT_PARAMS = 1024 * 1024                                          # create-context initializationParams (§3.3)
MAX_METADATA_NAME, MAX_METADATA_ENTRIES, MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 64, 64, 4096   # bytes (§3.7)
EMPTY_FIELD = "Field '{}' is required but was empty"
TOO_LONG = "Field '{}' exceeds maximum length of {} characters (got {})"
TOO_LARGE = "Field '{}' exceeds maximum size of {} bytes (got {})"
INVALID_FORMAT = "Field '{}' has invalid format: {}"
READ_ONLY_TEE_ADDED = INVALID_FORMAT.format("members[].role",
                                           "ReadOnlyTee role can only be assigned via TEE attestation")


def coordinate_problems(package: Any, version: Any) -> List[str]:
    """InstallApplicationRequest: both strings (serde), non-empty and within their lengths (Validate)."""
    if not isinstance(package, str) or not isinstance(version, str):
        return ["Invalid JSON data: Failed to deserialize the JSON body into the target type: invalid type: "
                "expected a string"]
    problems = []
    for field, value, limit in (("package", package, MAX_PACKAGE_LENGTH), ("version", version, MAX_VERSION_LENGTH)):
        if not value:
            problems.append(EMPTY_FIELD.format(field))
        elif utf8_size(value) > limit:
            problems.append(TOO_LONG.format(field, limit, utf8_size(value)))
    return problems


def utf8_size(text: str) -> int:
    """Core's limits count UTF-8 bytes (Rust's `str::len`)."""
    return len(text.encode("utf-8"))


def metadata_problem(name: Optional[str], data: Dict[str, str]) -> Optional[str]:
    """core's validate_metadata_payload (crates/primitives/src/metadata.rs), the reason it gives."""
    if name is not None and not name:
        return "metadata name must not be the empty string — use null to clear it"
    if name is not None and utf8_size(name) > MAX_METADATA_NAME:
        return "metadata name too long: {} bytes (max {})".format(utf8_size(name), MAX_METADATA_NAME)
    if len(data) > MAX_METADATA_ENTRIES:
        return "metadata data has too many entries: {} (max {})".format(len(data), MAX_METADATA_ENTRIES)
    for key, value in sorted(data.items()):
        if not key:
            return "metadata data key must not be the empty string"
        if utf8_size(key) > MAX_METADATA_KEY:
            return "metadata data key too long: {} bytes (max {})".format(utf8_size(key), MAX_METADATA_KEY)
        if utf8_size(value) > MAX_METADATA_VALUE:
            return "metadata data value too long: {} bytes (max {})".format(utf8_size(value), MAX_METADATA_VALUE)
    return None


def sniffed_mime(data: bytes) -> str:
    """The node sniffs a blob's MIME type from its bytes (§0.6): a few magic numbers, else text or octets."""
    for magic, mime in ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"%PDF-", "application/pdf"),
                        (b"PK\x03\x04", "application/zip")):
        if data.startswith(magic):
            return mime
    try:
        data.decode("utf-8")
        return "text/plain"
    except UnicodeDecodeError:
        return "application/octet-stream"


def hex_id(label: str) -> str:
    """A deterministic 64-hex id for tests: sha256 of the label."""
    return hashlib.sha256(label.encode("utf-8")).hexdigest()


NODE_ACCOUNT = hex_id("node-double:account")
NODE_DEVICE = hex_id("node-double:device")
NODE_PUBLIC_KEY = hex_id("node-double:public-key")


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def id_bytes(hex_string: str) -> List[int]:
    return list(bytes.fromhex(hex_string))


# ---------------------------------------------------------------------------------------------------------------
# Replies: a handler returns a plain value (200 JSON) or a Reply; it may also raise one.
# ---------------------------------------------------------------------------------------------------------------

class Reply(Exception):
    def __init__(self, status: int, body: bytes = b"", content_type: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None):
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}


def json_reply(status: int, value: Any, headers: Optional[Dict[str, str]] = None) -> Reply:
    return Reply(status, compact_json(value).encode("utf-8"), JSON_TYPE, headers)


def error_reply(status: int, message: str) -> Reply:
    """Handled errors are `{"error": "<message>"}` JSON (§1.2)."""
    return json_reply(status, {"error": message})


def validation_reply(problems: List[str]) -> Reply:
    """core's ValidatedJson after its Validate impl: one problem as is, several joined (§1.2)."""
    return error_reply(400, problems[0] if len(problems) == 1 else "Validation errors: " + "; ".join(problems))


def text_reply(status: int, message: str) -> Reply:
    """Framework rejections and install failures are text/plain (§1.2, checklist 6)."""
    return Reply(status, message.encode("utf-8"), TEXT_TYPE)


def empty_reply(status: int, headers: Optional[Dict[str, str]] = None) -> Reply:
    return Reply(status, b"", None, headers)


def internal_error() -> Reply:
    """Untyped node errors all become this 500 (§1.2); a fresh instance each time, since Replies are raised."""
    return error_reply(500, "Internal server error")


# ---------------------------------------------------------------------------------------------------------------
# Request parsing helpers (serde/axum-shaped messages)
# ---------------------------------------------------------------------------------------------------------------

def serde_syntax_message(body: bytes) -> str:
    """A serde_json-like syntax error for a body that is not JSON."""
    if not body.strip():
        return "EOF while parsing a value at line 1 column 0"
    try:
        json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return "invalid unicode code point at line 1 column 1"
    except json.JSONDecodeError as exc:
        return "expected value at line {} column {}".format(exc.lineno, exc.colno)
    return "trailing characters at line 1 column 1"


def parse_json_body(body: bytes) -> Tuple[bool, Any]:
    try:
        return True, json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False, None


def missing_field(body: Dict[str, Any], names: Tuple[str, ...]) -> Optional[str]:
    for name in names:
        if name not in body:
            return name
    return None


def normalise_hex64(value: Any) -> Optional[str]:
    if isinstance(value, str) and HEX64.match(value):
        return value.lower()
    return None


def paging(query: Dict[str, str]) -> Tuple[int, int]:
    """offset/limit as §3.3: default 100, limit ≤ 1000 and offset ≤ 100 000, silently clamped."""
    try:
        offset = int(query.get("offset", "0"))
        limit = int(query.get("limit", "100"))
    except ValueError:
        raise text_reply(400, "Failed to deserialize query string: invalid digit found in string")
    return max(0, min(offset, 100_000)), max(0, min(limit, 1000))


def paginate(items: list, query: Dict[str, str]) -> list:
    offset, limit = paging(query)
    return items[offset:offset + limit]


def paginate_stream(ids: list, resolve, query: Dict[str, str]) -> list:
    """Core's context listing (get_context_ids.rs): `offset` skips ids of the store's stream, resolvable or not,
    while `limit` counts the contexts collected, so an id that resolves to nothing shifts later pages."""
    offset, limit = paging(query)
    page = []
    for context_id in ids[offset:]:
        row = resolve(context_id)
        if row is not None:
            page.append(row)
            if len(page) >= limit:
                break
    return page


# ---------------------------------------------------------------------------------------------------------------
# The guest: argument decoding the way the SDK's serde structs do it (§4.4), sample values, the kv and counter apps
# ---------------------------------------------------------------------------------------------------------------

class GuestPanic(Exception):
    """`guest panicked: <message>` (§4.2)."""


class AppError(Exception):
    """The method returned `Err(value)`; the node shows its JSON bytes Debug-formatted (§4.2, checklist 23)."""

    def __init__(self, value: Any):
        super().__init__(value)
        self.value = value


def panic_location(method_name: str) -> str:
    line = 40 + int(hashlib.sha256(method_name.encode()).hexdigest()[:4], 16) % 200
    return "src/lib.rs:{}:5".format(line)


SCALAR_RUST = {"string": "String", "bool": "bool", "unit": "()"}
INTEGER_RANGES = {
    "u32": (0, 2 ** 32 - 1), "u64": (0, 2 ** 64 - 1),
    "i32": (-2 ** 31, 2 ** 31 - 1), "i64": (-2 ** 63, 2 ** 63 - 1),
}


class TypeSystem:
    """Reads TypeRefs of one manifest (§5.3–5.4): Rust spelling, JSON checks, sample values."""

    def __init__(self, manifest: Dict[str, Any]):
        self.types = manifest.get("types") or {}

    def resolve(self, ref: Dict[str, Any]) -> Tuple[Optional[str], Dict[str, Any]]:
        """Follow `$ref`s and aliases; returns (type name or None, concrete definition)."""
        name = None
        for _ in range(32):
            if "$ref" in ref:
                name = ref["$ref"]
                ref = self.types.get(name) or {"kind": "unit"}
            elif ref.get("kind") == "alias":
                ref = ref.get("target") or {"kind": "unit"}
            elif ref.get("crdt_type") and "inner_type" in ref:
                ref = ref["inner_type"]   # CRDT wrappers are transparent on the wire (§4.4)
            else:
                break
        return name, ref

    def rust(self, ref: Dict[str, Any], nullable: bool = False) -> str:
        text = self._rust(ref)
        return "Option<{}>".format(text) if nullable else text

    def _rust(self, ref: Dict[str, Any]) -> str:
        if "$ref" in ref:
            return ref["$ref"]
        kind = ref.get("kind")
        if kind in SCALAR_RUST:
            return SCALAR_RUST[kind]
        if kind == "bytes":
            return "[u8; {}]".format(ref["size"]) if ref.get("size") else "Vec<u8>"
        if kind == "list":
            return "Vec<{}>".format(self._rust(ref.get("items") or {}))
        if kind == "map":
            return "BTreeMap<String, {}>".format(self._rust(ref.get("value") or {}))
        if kind == "tuple":
            return "({})".format(", ".join(self._rust(e) for e in ref.get("elements") or []))
        if kind == "record":
            return "{ .. }"
        return str(kind)

    def problem(self, ref: Dict[str, Any], value: Any, nullable: bool = False, depth: int = 0) -> Optional[str]:
        """serde's message for a value that does not fit, or None."""
        if value is None:
            return None if nullable else self._invalid(value, self.expected(ref))
        if depth > 24:
            return None
        name, ref = self.resolve(ref)
        kind = ref.get("kind")
        checker = getattr(self, "_check_" + str(kind), None)
        if checker is None:
            return None  # opaque CRDTs (Counter, RGA) and unknown kinds: accept
        return checker(ref, value, name, depth)

    def expected(self, ref: Dict[str, Any]) -> str:
        name, ref = self.resolve(ref)
        kind = ref.get("kind")
        if kind == "string":
            return "a string"
        if kind == "bool":
            return "a boolean"
        if kind in ("list", "bytes"):
            return "a sequence"
        if kind == "map":
            return "a map"
        if kind == "record":
            return "struct {}".format(name) if name else "a map"
        if kind == "variant":
            return "enum {}".format(name or "")
        if kind == "tuple":
            return "a tuple of size {}".format(len(ref.get("elements") or []))
        return str(kind)

    @staticmethod
    def _describe(value: Any) -> str:
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "boolean `{}`".format("true" if value else "false")
        if isinstance(value, int):
            return "integer `{}`".format(value)
        if isinstance(value, float):
            return "floating point `{}`".format(value)
        if isinstance(value, str):
            return "string {}".format(json.dumps(value, ensure_ascii=False))
        return "sequence" if isinstance(value, list) else "map"

    def _invalid(self, value: Any, expected: str) -> str:
        return "invalid type: {}, expected {}".format(self._describe(value), expected)

    def _check_string(self, ref, value, name, depth):
        return None if isinstance(value, str) else self._invalid(value, "a string")

    def _check_bool(self, ref, value, name, depth):
        return None if isinstance(value, bool) else self._invalid(value, "a boolean")

    def _check_unit(self, ref, value, name, depth):
        return self._invalid(value, "unit")

    def _check_integer(self, ref, value, name, depth):
        kind = ref["kind"]
        if isinstance(value, bool) or not isinstance(value, int):
            return self._invalid(value, kind)
        low, high = INTEGER_RANGES[kind]
        if not low <= value <= high:
            return "invalid value: integer `{}`, expected {}".format(value, kind)
        return None

    _check_u32 = _check_u64 = _check_i32 = _check_i64 = _check_integer

    def _check_float(self, ref, value, name, depth):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self._invalid(value, ref["kind"])
        return None

    _check_f32 = _check_f64 = _check_float

    def _check_bytes(self, ref, value, name, depth):
        size = ref.get("size")
        if size == 32 and isinstance(value, str) and HEX64.match(value):
            return None  # id newtypes describe as bytes but travel as hex (§4.4)
        if not isinstance(value, list):
            return self._invalid(value, "a sequence")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= 255:
                return self._invalid(item, "u8") if not isinstance(item, int) or isinstance(item, bool) \
                    else "invalid value: integer `{}`, expected u8".format(item)
        if size and len(value) != size:
            return "invalid length {}, expected an array of length {}".format(len(value), size)
        return None

    def _check_list(self, ref, value, name, depth):
        if not isinstance(value, list):
            return self._invalid(value, "a sequence")
        item_type = ref.get("items") or {}
        for item in value:
            found = self.problem(item_type, item, False, depth + 1)
            if found:
                return found
        return None

    def _check_map(self, ref, value, name, depth):
        if not isinstance(value, dict):
            return self._invalid(value, "a map")
        value_type = ref.get("value") or {}
        for item in value.values():
            found = self.problem(value_type, item, False, depth + 1)
            if found:
                return found
        return None

    def _check_tuple(self, ref, value, name, depth):
        elements = ref.get("elements") or []
        if not isinstance(value, list):
            return self._invalid(value, self.expected(ref))
        if len(value) != len(elements):
            return "invalid length {}, expected a tuple of size {}".format(len(value), len(elements))
        for element_type, item in zip(elements, value):
            found = self.problem(element_type, item, False, depth + 1)
            if found:
                return found
        return None

    def _check_record(self, ref, value, name, depth):
        if not isinstance(value, dict):
            return self._invalid(value, "struct {}".format(name) if name else "a map")
        for field in ref.get("fields") or []:
            if field["name"] not in value:
                if not field.get("nullable"):
                    return "missing field `{}`".format(field["name"])
                continue
            found = self.problem(field["type"], value[field["name"]], bool(field.get("nullable")), depth + 1)
            if found:
                return found
        return None

    def _check_variant(self, ref, value, name, depth):
        variants = {v["name"]: v for v in ref.get("variants") or []}
        if isinstance(value, str):
            tag, payload = value, None
        elif isinstance(value, dict) and len(value) == 1:
            tag, payload = next(iter(value.items()))
        else:
            return self._invalid(value, "enum {}".format(name or ""))
        if tag not in variants:
            return "unknown variant `{}`, expected {}".format(tag, serde_one_of(list(variants)))
        payload_type = variants[tag].get("payload")
        if payload_type is None:
            return None if payload is None else self._invalid(payload, "unit variant")
        return self.problem(payload_type, payload, False, depth + 1)

    def sample(self, ref: Optional[Dict[str, Any]], depth: int = 0) -> Any:
        """A deterministic value of the type, for generic apps (the shapes of §4.4)."""
        if not ref or depth > 8:
            return None
        _, ref = self.resolve(ref)
        kind = ref.get("kind")
        simple = {"string": "sample", "bool": True, "u32": 1, "u64": 1, "i32": -1, "i64": -1,
                  "f32": 1.5, "f64": 1.5, "unit": None}
        if kind in simple:
            return simple[kind]
        if kind == "bytes":
            return [1] * (ref.get("size") or 4)
        if kind == "list":
            return [self.sample(ref.get("items"), depth + 1)]
        if kind == "map":
            return {"key": self.sample(ref.get("value"), depth + 1)}
        if kind == "tuple":
            return [self.sample(e, depth + 1) for e in ref.get("elements") or []]
        if kind == "record":
            return {f["name"]: None if f.get("nullable") else self.sample(f["type"], depth + 1)
                    for f in ref.get("fields") or []}
        if kind == "variant":
            return self._sample_variant(ref, depth)
        return None

    def _sample_variant(self, ref: Dict[str, Any], depth: int) -> Any:
        variants = ref.get("variants") or []
        if not variants:
            return None
        first = variants[0]
        if first.get("payload") is None:
            return first["name"]
        return {first["name"]: self.sample(first["payload"], depth + 1)}


def serde_one_of(names: List[str]) -> str:
    """serde's list of expected names: `a`, `a` or `b`, one of `a`, `b`, `c`."""
    quoted = ["`{}`".format(n) for n in names]
    if not quoted:
        return "nothing"
    if len(quoted) == 1:
        return quoted[0]
    if len(quoted) == 2:
        return "{} or {}".format(*quoted)
    return "one of " + ", ".join(quoted)


def serde_unknown_field(key: str, fields) -> str:
    """serde's refusal of a key a `deny_unknown_fields` struct does not know."""
    if not fields:
        return "unknown field `{}`, there are no fields".format(key)
    return "unknown field `{}`, expected {}".format(key, serde_one_of(list(fields)))


NO_INPUT = object()   # create-context with `initializationParams: []`: the guest reads zero bytes


def decode_arguments(manifest: Dict[str, Any], method: Dict[str, Any], args: Any) -> None:
    """Raise GuestPanic as the SDK's `deny_unknown_fields` argument struct would (§4.2, checklist 22).

    A method without parameters accepts anything except a JSON object that names arguments
    (core `crates/sdk/macros/src/logic/method.rs`)."""
    params = method.get("params") or []
    types = TypeSystem(manifest)
    text = "" if args is NO_INPUT else compact_json(args)
    if params:
        message, column = _argument_problem(types, params, args, text)
    elif isinstance(args, dict) and args:
        message, column = serde_unknown_field(next(iter(args)), ()), len(text)
    else:
        return
    if message is None:
        return
    fields = ", ".join("{}: {}".format(p["name"], types.rust(p["type"], bool(p.get("nullable")))) for p in params)
    expected = "{{ {} }}".format(fields) if fields else "{}"
    raise GuestPanic('{}: failed to deserialize arguments (expected {}): Error({}, line: 1, column: {}) at {}'.format(
        method["name"], expected, json.dumps(message, ensure_ascii=False), column, panic_location(method["name"])))


def _argument_problem(types: TypeSystem, params: list, args: Any, text: str) -> Tuple[Optional[str], int]:
    if args is NO_INPUT:
        return "EOF while parsing a value", 0
    if not isinstance(args, dict):
        return types._invalid(args, "struct Input"), len(text)
    by_name = {p["name"]: p for p in params}
    for key, value in args.items():
        quoted_key = json.dumps(key, ensure_ascii=False)
        key_end = text.find(quoted_key + ":") + len(quoted_key)
        if key not in by_name:
            return serde_unknown_field(key, list(by_name)), key_end
        found = types.problem(by_name[key]["type"], value, bool(by_name[key].get("nullable")))
        if found:
            return found, key_end + 1 + len(compact_json(value))
    for param in params:
        if param["name"] not in args and not param.get("nullable"):
            return "missing field `{}`".format(param["name"]), len(text)
    return None, 0


def app_error_text(value: Any) -> str:
    """The node prints the guest's JSON error bytes as a Rust Debug byte list (§4.2)."""
    data = compact_json(value).encode("utf-8")
    return "the method call returned an error: [{}]".format(", ".join(str(b) for b in data))


# kv behaviour: one small function per method of the kv-store app; the state is a plain dict per context.

def _kv_set(store, args):
    store[args["key"]] = args["value"]


def _kv_get(store, args):
    return store.get(args["key"])


def _kv_remove(store, args):
    return store.pop(args["key"], None)


def _kv_entries(store, args):
    return dict(sorted(store.items()))


def _kv_len(store, args):
    return len(store)


def _kv_clear(store, args):
    store.clear()


def _kv_get_or_insert(store, args):
    return store.setdefault(args["key"], args["value"])


def _kv_update_if_exists(store, args):
    if args["key"] not in store:
        return False
    store[args["key"]] = args["value"]
    return True


def _kv_get_result(store, args):
    if args["key"] not in store:
        raise AppError("key not found: {}".format(args["key"]))
    return store[args["key"]]


def _kv_get_unchecked(store, args):
    if args["key"] not in store:
        raise GuestPanic("key not found at src/lib.rs:97:14")
    return store[args["key"]]


def _kv_init(store, args):
    store.clear()


KV_METHODS: Dict[str, Callable[[dict, dict], Any]] = {
    "set": _kv_set, "get": _kv_get, "remove": _kv_remove, "entries": _kv_entries, "len": _kv_len,
    "clear": _kv_clear, "get_or_insert": _kv_get_or_insert, "update_if_exists": _kv_update_if_exists,
    "get_result": _kv_get_result, "get_unchecked": _kv_get_unchecked, "init": _kv_init,
}


# counter behaviour (the sample counter app): one u64 per context, kept under "count" in the context's state.

U64_MAX = 2 ** 64 - 1


def _counter_increment(store, args):
    count = store.get("count", 0) + args["by"]
    if count > U64_MAX:
        raise GuestPanic("attempt to add with overflow at src/lib.rs:21:9")
    store["count"] = count
    return count


def _counter_value(store, args):
    return store.get("count", 0)


def _counter_init(store, args):
    store["count"] = 0


COUNTER_METHODS: Dict[str, Callable[[dict, dict], Any]] = {
    "increment": _counter_increment, "value": _counter_value, "init": _counter_init,
}

# Apps with real logic; any other app answers each call with a sample value of the method's return type.
BEHAVIOURS: Dict[str, Dict[str, Callable[[dict, dict], Any]]] = {"kv": KV_METHODS, "counter": COUNTER_METHODS}


def app_events(manifest: Dict[str, Any], method: str, before: dict, after: dict) -> List[Tuple[str, Any]]:
    """What a kv call emits, as the kv-store app does: Inserted/Updated/Removed per key, Cleared for clear; only
    the kinds its ABI declares (an app without events emits none)."""
    declared = {e.get("name") for e in manifest.get("events") or [] if isinstance(e, dict)}
    if method == "clear":
        found = [("Cleared", None)]
    else:
        found = [("Removed", {"key": k}) for k in before if k not in after]
        found += [("Inserted" if k not in before else "Updated", {"key": k, "value": v})
                  for k, v in after.items() if before.get(k, object()) != v]
    return [(kind, payload) for kind, payload in found if kind in declared]


def run_guest(behaviour: str, manifest: Dict[str, Any], method: Dict[str, Any], args: Any, store: dict) -> Any:
    """Execute one method: decode arguments, then the app's own logic or a sample of the return type."""
    decode_arguments(manifest, method, args)
    args = args if isinstance(args, dict) else {}
    logic = BEHAVIOURS.get(behaviour, {}).get(method["name"])
    if logic is not None:
        return logic(store, args)
    if method.get("returns_nullable"):
        return None
    return TypeSystem(manifest).sample(method.get("returns"))


def find_method(manifest: Optional[Dict[str, Any]], name: str) -> Optional[Dict[str, Any]]:
    for method in (manifest or {}).get("methods") or []:
        if method.get("name") == name:
            return method
    return None


def default_behaviour(manifest: Optional[Dict[str, Any]]) -> str:
    has_kv_core = find_method(manifest, "get") and find_method(manifest, "set")
    return "kv" if has_kv_core else "generic"


def is_read_only(method: Dict[str, Any]) -> bool:
    return method.get("intent") == "read_only"


# ---------------------------------------------------------------------------------------------------------------
# Embedded auth (§1.5, §2): HS256 JWTs, login, refresh with single-use refresh tokens, revocation
# ---------------------------------------------------------------------------------------------------------------

def grant_covers(grant: str, permission: str) -> bool:
    """`admin` covers everything; `context` covers `context:list`; a `[scope]` is left to the handler."""
    base = grant.split("[", 1)[0]
    return base == "admin" or permission == base or permission.startswith(base + ":")


def may_execute(grants: List[str], context_id: str, method: str) -> bool:
    """Whether a token's grants cover this call (core `crates/server/src/execute.rs`): `admin`,
    `context:execute`, or `context:execute[<context>,<user>,<method>]` with empty parts meaning any."""
    for grant in grants:
        if grant in ("admin", "context:execute"):
            return True
        if grant.startswith("context:execute[") and grant.endswith("]"):
            parts = grant[len("context:execute["):-1].split(",") + ["", "", ""]
            if parts[0] in ("", context_id) and parts[2] in ("", method):
                return True
    return False


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class AuthService:
    """Token bookkeeping. Every token's jti maps to its serial, family and (for refresh tokens) use.

    config: users {name: password}, access_ttl, refresh_ttl, login_attempts (failed logins before a 429), and
    legacy_tokens: play a node from before rc.83, whose tokens carry no `key_id` claim; `upgrade()` then turns
    it into a current one, and the tokens it minted stop verifying (§0.5.6).
    """

    def __init__(self, config: Dict[str, Any]):
        self.users: Dict[str, str] = dict(config.get("users") or {})
        self.access_ttl = int(config.get("access_ttl", ACCESS_TTL))
        self.refresh_ttl = int(config.get("refresh_ttl", REFRESH_TTL))
        self.login_attempts = int(config.get("login_attempts", LOGIN_ATTEMPTS))
        self.legacy_tokens = bool(config.get("legacy_tokens", False))
        self.secret = os.urandom(32)
        self.tokens: Dict[str, Dict[str, Any]] = {}
        self.revoked_families: set = set()
        self.failed_logins: Dict[Tuple[str, str], int] = {}
        self.serial = 0
        self.expired_upto = 0   # access tokens with serial <= this count as expired

    def mint_pair(self, subject: str, permissions: List[str], family: str, node_url: str = "") -> Tuple[str, str]:
        return (self._mint(subject, "access", self.access_ttl, permissions, family, node_url),
                self._mint(subject, "refresh", self.refresh_ttl, permissions, family, node_url))

    def _mint(self, subject, token_type, ttl, permissions, family, node_url) -> str:
        now = int(time.time())
        jti = uuid.uuid4().hex   # unique even for two tokens minted in the same second
        claims = {"sub": subject, "iss": "calimero-auth", "aud": "calimero-node", "exp": now + ttl, "iat": now,
                  "jti": jti, "token_type": token_type, "permissions": list(permissions)}
        if not self.legacy_tokens:
            claims["key_id"] = subject   # required since rc.83
        if node_url:
            claims["node_url"] = node_url
        self.serial += 1
        self.tokens[jti] = {"serial": self.serial, "family": family, "used": False}
        header = b64url(compact_json({"alg": "HS256", "typ": "JWT"}).encode())
        payload = b64url(compact_json(claims).encode())
        return "{}.{}.{}".format(header, payload, self._sign(header + "." + payload))

    def _sign(self, signing_input: str) -> str:
        return b64url(hmac.new(self.secret, signing_input.encode("ascii"), hashlib.sha256).digest())

    def decode(self, token: str) -> Optional[Dict[str, Any]]:
        """Claims of a token this node signed and remembers, else None."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            if not hmac.compare_digest(self._sign(parts[0] + "." + parts[1]), parts[2]):
                return None
            claims = json.loads(b64url_decode(parts[1]))
        except (ValueError, UnicodeError):
            return None
        if not isinstance(claims, dict) or claims.get("jti") not in self.tokens:
            return None
        if not self.legacy_tokens and "key_id" not in claims:
            return None   # minted before the upgrade: a current node no longer verifies it
        return claims

    def upgrade(self) -> None:
        """The node now runs a release whose tokens carry `key_id`: the ones it minted before stop verifying."""
        self.legacy_tokens = False

    def throttled(self, key: Tuple[str, str]) -> bool:
        """The login limiter (§2.1): once over budget every attempt is refused, and counted too."""
        if self.failed_logins.get(key, 0) < self.login_attempts:
            return False
        self.failed_logins[key] += 1
        return True

    def failed_login(self, key: Tuple[str, str]) -> None:
        self.failed_logins[key] = self.failed_logins.get(key, 0) + 1

    def is_expired(self, claims: Dict[str, Any]) -> bool:
        info = self.tokens[claims["jti"]]
        return info["serial"] <= self.expired_upto or claims.get("exp", 0) < time.time()

    def family_of(self, claims: Dict[str, Any]) -> str:
        return self.tokens[claims["jti"]]["family"]

    def guard(self, token: Optional[str], permission: str = "admin") -> Optional[Reply]:
        """What the guard answers for a protected route (§1.5); None lets the request through. `admin`
        satisfies every route, a route's own permission (scope aside: execute checks its scope) the mapped ones."""
        if token is None:
            return empty_reply(401)
        claims = self.decode(token)
        if claims is None or claims.get("token_type") != "access":
            return empty_reply(401)
        if self.is_expired(claims):
            return empty_reply(401, {"X-Auth-Error": "token_expired"})
        if self.family_of(claims) in self.revoked_families:
            return empty_reply(403, {"X-Auth-Error": "token_revoked"})
        if not any(grant_covers(grant, permission) for grant in claims.get("permissions") or []):
            return empty_reply(403, {"X-Auth-Error": "permission_denied"})
        return None

    def grants(self, token: Optional[str]) -> List[str]:
        claims = self.decode(token) if token else None
        return list(claims.get("permissions") or []) if claims else []

    def expire_all_access(self) -> None:
        self.expired_upto = self.serial

    def revoke_all(self) -> None:
        self.revoked_families.update(info["family"] for info in self.tokens.values())


def auth_success(pair: Tuple[str, str]) -> Dict[str, Any]:
    """§2.1: the TokenResponse keeps its own `error: null` inside `data`."""
    return {"data": {"access_token": pair[0], "refresh_token": pair[1], "error": None}, "error": None}


def auth_failure(status: int, message: str, headers: Optional[Dict[str, str]] = None) -> Reply:
    return json_reply(status, {"data": None, "error": message}, headers)


# ---------------------------------------------------------------------------------------------------------------
# Routing: (method, path pattern) -> handler, with the body extractor and auth class each route uses
# ---------------------------------------------------------------------------------------------------------------

# Body extractors (§1.2): "validated" = core's ValidatedJson (JSON 400s, body + content type required);
# "axum" = plain Json<T> (text 415/400/422); "optional" = body ignored; "raw" = bytes as sent.
# Auth classes: "public", "protected" (guarded in embedded mode), "auth" (embedded only, public),
# "auth-protected" (embedded only, guarded).

class Route:
    def __init__(self, method: str, pattern: str, handler: str, body: str = "optional", access: str = "protected",
                 bad_id: Optional[Dict[str, str]] = None, closed: Optional[Tuple[str, ...]] = None,
                 permission: str = "admin"):
        self.method = method
        self.pattern = pattern
        self.handler = handler
        self.body = body
        self.access = access
        self.bad_id = bad_id or {}
        self.closed = closed            # the body's known fields when it is a closed set (§0.5.1)
        # what a token must grant, `admin` or this (core's validator.rs maps a few read routes; the rest of
        # /admin-api is admin only, §1.5)
        self.permission = permission
        regex = re.sub(r":([a-z_]+)", r"(?P<\1>[^/]+)", pattern)
        self.regex = re.compile("^" + regex + "$")


# How a malformed id in a path param is refused (checklist 2): typed extractors answer text, manual parsers JSON
# (a route's `bad_id`). Core types the context id of GET /contexts/:id, …/group and …/identities; delete, join and
# leave parse it by hand.
ID_PARAM_ERRORS = {
    "application_id": ("text", "Invalid URL: Cannot parse `{}` as an application id: expected 64 hex characters"),
    "context_id": ("text", "Invalid URL: Cannot parse `{}` as a context id: expected 64 hex characters"),
    "blob_id": ("json", "Invalid blob ID format"),
    "group_id": ("json", "Invalid group id format: expected hex-encoded 32 bytes"),
    "namespace_id": ("json", "Invalid group id format: expected hex-encoded 32 bytes"),
}

PARSED_CONTEXT_ID = {"context_id": "Invalid context id format: expected base58 or hex-encoded 32 bytes"}

ROUTES = [
    # health & identity (§3.1)
    Route("GET", "/admin-api/health", "health", access="public"),
    Route("GET", "/admin-api/ready", "ready", access="public"),
    Route("GET", "/admin-api/is-authed", "is_authed", access="public"),
    Route("GET", "/admin-api/identity", "identity"),
    Route("GET", "/admin-api/peers", "peers"),
    Route("GET", "/admin-api/network/status", "network_status"),
    # applications (§3.2)
    Route("GET", "/admin-api/applications", "list_applications", permission="application:list"),
    Route("GET", "/admin-api/applications/:application_id", "get_application", permission="application:list"),
    Route("GET", "/admin-api/applications/:application_id/abi", "get_abi", permission="application:list"),
    Route("GET", "/admin-api/applications/:application_id/versions", "application_versions"),
    Route("DELETE", "/admin-api/applications/:application_id", "uninstall_application"),
    Route("POST", "/admin-api/install-application", "install_application", body="validated", closed=INSTALL_FIELDS),
    Route("POST", "/admin-api/install-dev-application", "install_dev_application", body="validated",
          closed=DEV_INSTALL_FIELDS),
    Route("GET", "/admin-api/packages", "list_packages"),
    Route("GET", "/admin-api/packages/:package/versions", "package_versions"),
    Route("GET", "/admin-api/packages/:package/latest", "package_latest"),
    # contexts (§3.3)
    Route("GET", "/admin-api/contexts", "list_contexts", permission="context:list"),
    Route("POST", "/admin-api/contexts", "create_context", body="validated", closed=CONTEXT_CREATE_FIELDS),
    Route("GET", "/admin-api/contexts/for-application/:application_id", "contexts_for_application",
          permission="context:list"),
    Route("GET", "/admin-api/contexts/:context_id", "get_context", permission="context:list"),
    Route("DELETE", "/admin-api/contexts/:context_id", "delete_context", bad_id={"context_id": "Invalid context id"}),
    Route("POST", "/admin-api/contexts/:context_id/join", "join_context", bad_id=PARSED_CONTEXT_ID),
    Route("POST", "/admin-api/contexts/:context_id/leave", "leave_context", bad_id=PARSED_CONTEXT_ID),
    Route("GET", "/admin-api/contexts/:context_id/identities", "context_identities"),
    Route("GET", "/admin-api/contexts/:context_id/identities-owned", "context_identities"),
    Route("GET", "/admin-api/contexts/:context_id/group", "context_group"),
    Route("POST", "/admin-api/contexts/sync", "sync_contexts"),
    Route("POST", "/admin-api/contexts/sync/:context_id", "sync_context"),
    Route("POST", "/admin-api/contexts/:context_id/resync", "resync_context", body="validated", closed=RESYNC_FIELDS,
          bad_id={"context_id": "Invalid context id"}),
    # aliases (§3.4)
    Route("POST", "/admin-api/alias/create/:kind", "create_alias", body="axum"),
    Route("POST", "/admin-api/alias/lookup/:kind/:name", "lookup_alias", permission="context:alias:lookup"),
    Route("GET", "/admin-api/alias/list/:kind", "list_aliases"),
    Route("POST", "/admin-api/alias/delete/:kind/:name", "delete_alias"),
    # blobs (§3.5)
    Route("PUT", "/admin-api/blobs", "upload_blob", body="raw"),
    Route("GET", "/admin-api/blobs", "list_blobs"),
    Route("GET", "/admin-api/blobs/:blob_id", "download_blob"),
    Route("HEAD", "/admin-api/blobs/:blob_id", "download_blob"),
    Route("DELETE", "/admin-api/blobs/:blob_id", "delete_blob"),
    # namespaces (§3.6)
    Route("GET", "/admin-api/namespaces", "list_namespaces"),
    Route("POST", "/admin-api/namespaces", "create_namespace", body="validated", closed=NAMESPACE_CREATE_FIELDS),
    Route("GET", "/admin-api/namespaces/for-application/:application_id", "namespaces_for_application",
          bad_id={"application_id": "Invalid application id"}),
    Route("GET", "/admin-api/namespaces/:namespace_id", "get_namespace"),
    Route("DELETE", "/admin-api/namespaces/:namespace_id", "delete_group", body="validated", closed=EMPTY_FIELDS),
    Route("POST", "/admin-api/namespaces/:namespace_id/invite", "invite_namespace", body="validated",
          closed=INVITE_FIELDS),
    Route("POST", "/admin-api/namespaces/:namespace_id/join", "join_namespace", body="validated", closed=JOIN_FIELDS),
    Route("POST", "/admin-api/namespaces/:namespace_id/leave", "leave_namespace"),
    Route("GET", "/admin-api/namespaces/:namespace_id/groups", "namespace_groups"),
    Route("POST", "/admin-api/namespaces/:namespace_id/groups", "create_namespace_group", body="axum"),
    # groups (§3.7)
    Route("POST", "/admin-api/groups", "create_group", body="validated", closed=GROUP_CREATE_FIELDS),
    Route("GET", "/admin-api/groups/:group_id", "group_info"),
    Route("DELETE", "/admin-api/groups/:group_id", "delete_group", body="validated", closed=EMPTY_FIELDS),
    Route("GET", "/admin-api/groups/:group_id/subgroups", "subgroups"),
    Route("GET", "/admin-api/groups/:group_id/contexts", "group_contexts"),
    Route("GET", "/admin-api/groups/:group_id/members", "group_members"),
    Route("POST", "/admin-api/groups/:group_id/members", "add_group_members", body="validated", closed=MEMBERS_FIELDS),
    Route("POST", "/admin-api/groups/:group_id/members/remove", "remove_group_members", body="validated",
          closed=REMOVE_MEMBERS_FIELDS),
    Route("PUT", "/admin-api/groups/:group_id/members/:account/role", "set_member_role", body="validated",
          closed=ROLE_FIELDS),
    Route("POST", "/admin-api/groups/:group_id/upgrade", "upgrade_group", body="validated", closed=UPGRADE_FIELDS),
    Route("GET", "/admin-api/groups/:group_id/upgrade/status", "upgrade_status"),
    Route("PUT", "/admin-api/groups/:group_id/settings/subgroup-visibility", "set_visibility", body="validated",
          closed=VISIBILITY_FIELDS),
    Route("GET", "/admin-api/groups/:group_id/metadata", "get_group_metadata"),
    Route("PUT", "/admin-api/groups/:group_id/metadata", "set_group_metadata", body="validated",
          closed=METADATA_FIELDS),
    Route("POST", "/admin-api/groups/:group_id/join-via-inheritance", "join_via_inheritance"),
    Route("POST", "/admin-api/groups/:group_id/leave", "leave_group"),
    # the registry's own API (§0.7), served beside the node at REGISTRY_PATH: a registry double, not a node route
    Route("GET", "/registry/api/v2/bundles", "registry_bundles", access="public"),
    # JSON-RPC (§4)
    Route("POST", "/jsonrpc", "jsonrpc", body="axum", permission="context:execute"),
    # embedded auth (§2)
    Route("POST", "/auth/token", "auth_token", body="auth", access="auth", closed=LOGIN_FIELDS),
    Route("POST", "/auth/refresh", "auth_refresh", body="auth", access="auth", closed=REFRESH_FIELDS),
    Route("POST", "/auth/logout", "auth_logout", body="auth", access="auth", closed=LOGOUT_FIELDS),
    Route("GET", "/auth/health", "auth_health", access="auth"),
    Route("GET", "/auth/providers", "auth_providers", access="auth"),
    Route("GET", "/admin/identity", "auth_identity", access="auth-protected"),
    Route("POST", "/admin/client-key", "client_key", body="auth", access="auth-protected"),
]


class Request:
    def __init__(self, method: str, path: str, query: Dict[str, str], headers: Dict[str, str], body: bytes):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.params: Dict[str, str] = {}
        self.json: Any = None

    @property
    def is_json_content(self) -> bool:
        return self.headers.get("content-type", "").split(";")[0].strip().lower() == JSON_TYPE

    def bearer_token(self) -> Optional[str]:
        """§1.5: an Authorization header is the only source when present, even if invalid."""
        if "authorization" in self.headers:
            value = self.headers["authorization"]
            return value[7:].strip() if value.lower().startswith("bearer ") else ""
        return self.query.get("token")


def decode_body(route: Route, request: Request) -> Optional[Reply]:
    """Run the route's body extractor; a Reply means the request is refused before the handler."""
    if route.body in ("optional", "raw"):
        request.json = parse_json_body(request.body)[1] if request.body else None
        return None
    ok, value = parse_json_body(request.body)
    if route.body == "validated":
        if not request.is_json_content:
            return error_reply(400, MISSING_CONTENT_TYPE)
        if not ok:
            return error_reply(400, "JSON syntax error: Failed to parse the request body as JSON: "
                               + serde_syntax_message(request.body))
        if not isinstance(value, dict):
            return error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                               "invalid type: expected a map")
    elif route.body == "axum":
        if not request.is_json_content:
            return text_reply(415, MISSING_CONTENT_TYPE)
        if not ok:
            return text_reply(400, "Failed to parse the request body as JSON: " + serde_syntax_message(request.body))
        if not isinstance(value, dict):
            return text_reply(422, "Failed to deserialize the JSON body into the target type: invalid type: "
                              "expected a map at line 1 column 1")
    elif not ok or not isinstance(value, dict):   # the auth crate's own extractor (§2)
        return json_reply(400, {"error": "Invalid JSON: " + serde_syntax_message(request.body), "status": 400})
    request.json = value
    return None


def check_id_params(route: Route, request: Request) -> Optional[Reply]:
    for name, value in list(request.params.items()):
        if name not in ID_PARAM_ERRORS:
            continue
        if HEX64.match(value):
            request.params[name] = value.lower()
            continue
        style, message = ID_PARAM_ERRORS[name]
        message = route.bad_id.get(name, message)
        if name in route.bad_id:
            style = "json"
        return text_reply(400, message.format(value)) if style == "text" else error_reply(400, message)
    return None


# ---------------------------------------------------------------------------------------------------------------
# The HTTP server
# ---------------------------------------------------------------------------------------------------------------

class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True     # stop() then start() must rebind the same port
    block_on_close = False
    request_queue_size = 128       # call_many opens 32 connections at once; the default backlog of 5 resets some

    def handle_error(self, request, client_address):
        # A client that goes away mid-keep-alive (a server process exiting) is normal, not worth a traceback.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)

    def __init__(self, address, double: "NodeDouble"):
        self.double = double
        self.open_connections: set = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):
        with self.connections_lock:
            self.open_connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.connections_lock:
            self.open_connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Kept-alive client connections must not outlive stop(), or a stopped node would still answer."""
        with self.connections_lock:
            connections = list(self.open_connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "merod-double"
    disable_nagle_algorithm = True   # headers and body go out as two writes: without this each reply waits ~40 ms

    def version_string(self):
        return self.server_version

    def log_message(self, format, *args):  # no stderr noise in test output
        pass

    def handle_any(self):
        self.server.double._serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = handle_any

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        headers = dict(CORS_HEADERS)
        if reply.content_type:
            headers["Content-Type"] = reply.content_type
        headers.update(reply.headers)
        headers["Content-Length"] = str(len(reply.body))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD" and reply.body:
            self.wfile.write(reply.body)

    def abort_with_reset(self) -> None:
        """SO_LINGER 0 turns close() into a TCP RST: the client sees a reset mid-request."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------------------------
# NodeDouble: state, test helpers, lifecycle
# ---------------------------------------------------------------------------------------------------------------

class NodeDouble:
    """The fake node. All state sits behind one lock; handlers hold it only while they touch state.

    Constructor specs are plain dicts:
      apps        app specs (package, version, signer_id, id?, metadata?, abi | services, abi_error?, raw_wasm?,
                  behaviour?)
      namespaces  {"app": id-or-package, "name"?, "id"?, "role"?: this node's (Admin), "member"?: bool}
      groups      {"namespace": id, "name"?, "id"?, "visibility"?, "metadata"?, "member"?: bool, "role"?}
      contexts    {"app": id-or-package, "id"?, "service"?, "group"?, "name"?, "state"?: kv dict,
                   "heads"?: int, "uninitialized"?: bool}
      aliases     {alias: context id}
      registry    {"package@version" (or a dev-install path): app spec}

    faults (a dict tests may change at any time; "paths": [prefix, …] limits it ("exact": True: to those paths
    themselves), "times": N heals it after N):
      down       close the connection without answering     reset      abort the socket with a TCP RST
      truncated  promise more Content-Length than is sent    garbage    200 with a non-JSON body
      delay      seconds to sleep first (combines with the rest)
      drip       seconds between bytes: the route's own answer, status line to last byte, one byte at a time
                 (a stalled node or proxy; the request is carried out first, as a slow node would)
      huge       bytes of a 200 body (a JSON string of that length), streamed without holding it; with
                 "declared": False no Content-Length is sent (the body ends when the connection closes)
      deep       200 with `{"data": …}` nested this many arrays deep (JSON nothing reads whole), on any route
      status     answer this status: with "body" (text/plain), "json" or "raw" (JSON text sent as is, for
                 bodies json.dumps cannot make), else the node's own text
                 (503 → the "authority … not yet resolvable" error, 500 → Internal server error)

    states a test sets to reach the typed errors of current releases (§0.5):
      join_outcome    None (joins succeed), "no_peer" (504), "key_pending" or "not_endorsed" (503),
                      "quote_invitation" (400 quoting the whole invitation, a deserializer's style: the bearer
                      secrets in the text)
      registry_mode   "http" (installs from `registry`; a miss is a 502) or "dht" (every install is a 502)
      legacy_group_info  True: group info as before rc.83, without namespaceId and ownerOpCounter
      alias_rows      True: GET /alias/list/context answers [{alias, value}] rows, as one branch of core does
      legacy_lifecycle   True: the §0.6 routes in their older (rc.25-era) forms: dev install requires `metadata`,
                         a group delete refuses a group with contexts (and cascades nothing), remove-members
                         answers null, an upgrade answers {total, completed, failed}, blob headers without
                         X-Blob-Source, rc.25's fresh-identity text; their older body keys are known
      fresh_identity  True: GET /identity is the 404 of a node that never took part in a namespace
      peer_count      what GET /peers counts;  dev_install_root: a path prefix, the node's MEROD_DEV_INSTALL_ROOT
      upgrade_pending_reads  N: an upgrade answers and reads `in_progress` (with counts) for N status reads before
                      it is `completed` (the §0.6 handler's other form); 0 (default): written `completed` at once,
                      `completedAt` and the counts null (§0.7)
    slow          {path prefix: seconds}: requests under that prefix wait that long first (longest prefix wins;
                  a slow route beside any fault, e.g. one context's reads while another's stay quick)
    after_delete  faults that take effect once a DELETE has been carried out (a read failing after a delete)
    syncs lists every sync and resync asked ({context, force}; context None for "all").
      move_group(group, app): the group and its contexts now run another application (their records say so);
      upgrade_with_intents(app, version, {method: intent}): a new version whose ABI changes methods' intents;
      expire_invitations(), a group's role for this node (groups/namespaces spec "role"), set_role(),
      auth={"legacy_tokens": True} + upgrade_node(), auth={"login_attempts": N}
    refusals lists every closed-set refusal (§0.5.1) as {method, path, field}: tests assert it stays empty.
    authorizations() lists every Authorization header received (None where a request had none).
    name          None: the fixed NODE_* identity; a name (Network.add gives one): its own account, device, public
                  key and peer id (`GET /network/status` localPeerId). `network`, `reads_lag`: see Network.
    """

    def __init__(self, apps=(), contexts=(), aliases=None, namespaces=(), groups=(), registry=None,
                 auth=None, list_services=True, exec_delay=0.0, port=0, legacy_upgrade_policy=False, host="127.0.0.1",
                 name=None):
        self._lock = threading.RLock()
        self._init_sse()
        # Who this node is. Unnamed: the fixed NODE_* ids every single-node test knows; named (a Network's
        # member): ids of its own, so an account, a member identity or a peer id tells which node it came from.
        self.name = name
        seed = "node-double" if name is None else "node-double:" + name
        self.account = NODE_ACCOUNT if name is None else hex_id(seed + ":account")
        self.device = NODE_DEVICE if name is None else hex_id(seed + ":device")
        self.public_key = NODE_PUBLIC_KEY if name is None else hex_id(seed + ":public-key")
        self.peer_id = peer_id_for(seed)
        self.network: Optional["Network"] = None   # set by Network.add: then state replicates (see Network)
        self.reads_lag = 0.0                 # Network only: a replicated write moves the hash this long before reads
        self._registered: Dict[str, Dict[str, Any]] = {}   # context registrations governance brought, not joined
        self._gov_rev: Dict[tuple, int] = {}  # governance fact -> the revision this node holds of it (Network)
        self.port = int(port)
        self.host = host                     # "::1" listens as merod's ip6 listen address does
        self.url = ""
        self.log: List[Dict[str, Any]] = []
        self.faults: Dict[str, Any] = {}
        self.exec_delay = float(exec_delay)
        self._held = threading.Condition()   # release() ends every exec_delay now running (a held call)
        self._releases = 0
        self.max_inflight = 0
        self.executions: List[Dict[str, Any]] = []
        self.refresh_count = 0
        self.handler_errors: List[str] = []   # tracebacks of handler crashes (answered 500)
        self.list_services = list_services
        self.legacy_upgrade_policy = legacy_upgrade_policy
        self.refusals: List[Dict[str, Any]] = []
        self.join_outcome: Optional[str] = None
        self.legacy_group_info = False       # releases before rc.83: group info without namespaceId
        self.alias_rows = False              # one branch: the alias list as [{alias, value}] rows (§0.6)
        self.legacy_lifecycle = False        # the §0.6 routes' older forms (see the docstring)
        self.subgroup_counts = True                # False: namespace rows without subgroupCount (nothing to compare)
        self.member_names: Dict[str, str] = {}     # account -> the name group members rows carry (§3, "name"?)
        self.blob_mime: Optional[str] = None       # X-Blob-MIME-Type sent instead of the sniffed one
        self.upgrade_pending_reads = 0       # status reads an upgrade stays in_progress (see the docstring)
        self.fresh_identity = False
        self.peer_count = 0
        self.dev_install_root: Optional[str] = None
        self.syncs: List[Dict[str, Any]] = []
        self.slow: Dict[str, float] = {}
        self.after_delete: Optional[Dict[str, Any]] = None
        self.registry_mode = "http"
        self._invitations: Dict[str, Dict[str, Any]] = {}   # secret salt (hex) -> {"spent": bool}
        self.registry: Dict[str, Dict[str, Any]] = dict(registry or {})
        self._auth = AuthService(auth) if auth is not None else None
        self._inflight = 0
        self._serial = 0
        self._apps: Dict[str, Dict[str, Any]] = {}
        self._contexts: Dict[str, Dict[str, Any]] = {}
        self.dangling_context_ids: Set[str] = set()   # in the store's id stream, but no context resolves from them
        self._groups: Dict[str, Dict[str, Any]] = {}
        self._aliases: Dict[str, Dict[str, str]] = {"context": {}, "application": {}}
        self._blobs: Dict[str, bytes] = {}
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._load(apps, namespaces, groups, contexts, aliases)

    def _load(self, apps, namespaces, groups, contexts, aliases) -> None:
        """Constructor specs are plain dicts: the helpers' keyword names, plus the short keys below."""
        for spec in apps:
            self.add_app(spec)
        for spec in namespaces:
            self.add_namespace(**spec_kwargs(spec, {"app": "app_id", "id": "namespace_id"}))
        for spec in groups:
            self.add_group(**spec_kwargs(spec, {"app": "app_id", "id": "group_id"}))
        for spec in contexts:
            self.add_context(**spec_kwargs(spec, {"app": "app_id", "id": "context_id", "group": "group_id"}))
        for alias, context_id in dict(aliases or {}).items():
            self.add_alias(alias, context_id)

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> "NodeDouble":
        if self._server is not None:
            return self
        self._server = (_Server6 if ":" in self.host else _Server)((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self.url = "http://{}:{}".format("[%s]" % self.host if ":" in self.host else self.host, self.port)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="node-double", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self.release()                       # a call still held would keep its handler thread past the test
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "NodeDouble":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- inspection -----------------------------------------------------------------------------------------

    @property
    def registry_url(self) -> str:
        """The base_url of the registry this double serves (a node's config.toml [registry] base_url)."""
        return self.url + REGISTRY_PATH

    def requests_to(self, method: Optional[str] = None, path_prefix: Optional[str] = None) -> List[Dict[str, Any]]:
        with self._lock:
            return [entry for entry in self.log
                    if (method is None or entry["method"] == method.upper())
                    and (path_prefix is None or entry["path"].startswith(path_prefix))]

    def kv_state(self, context_id: str) -> Dict[str, Any]:
        """A copy of a context's kv store (tests assert state was or was not changed)."""
        with self._lock:
            return dict(self._contexts[context_id]["kv"])

    # -- applications ---------------------------------------------------------------------------------------

    def add_app(self, spec: Dict[str, Any]) -> str:
        """Install (or replace in place) an app from a plain-data spec; returns its id."""
        signer = spec.get("signer_id")
        app_id = spec.get("id") or hex_id(spec.get("package", "") + "\0" + (signer or ""))
        services = dict(spec.get("services") or {})
        abi = spec.get("abi")
        manifests = list(services.values()) or [abi]
        behaviour = spec.get("behaviour") or ("kv" if any(default_behaviour(m) == "kv" for m in manifests)
                                              else "generic")
        with self._lock:
            history = self._apps[app_id]["history"] if app_id in self._apps else []
            record = {
                "id": app_id, "package": spec.get("package", ""), "version": spec.get("version", ""),
                "signer_id": signer, "metadata": spec.get("metadata"), "abi": abi, "services": services,
                "abi_error": spec.get("abi_error"), "raw_wasm": bool(spec.get("raw_wasm")),
                "behaviour": behaviour, "history": history,
            }
            record["size"] = 4096 + 7 * len(compact_json(manifests))
            self._apps[app_id] = record
            self._remember_version(record)
        return app_id

    def _remember_version(self, record: Dict[str, Any]) -> None:
        entry = {"version": record["version"], "blobId": self._blob_ids(record)[0], "size": record["size"],
                 "package": record["package"]}
        record["history"][:] = [e for e in record["history"] if e["version"] != record["version"]] + [entry]

    def remove_app(self, app_id: str) -> None:
        with self._lock:
            self._apps.pop(app_id, None)

    def upgrade_app(self, app_id: str, version: str, abi=None, metadata=None) -> None:
        """A new version under the same id: new bytecode blob id, optionally a new ABI (a manifest, or for a
        multi-service app a {service: manifest} dict) and new metadata."""
        with self._lock:
            record = self._apps[app_id]
            record["version"] = version
            if abi is not None:
                if record["services"]:
                    record["services"] = dict(abi)
                else:
                    record["abi"] = abi
            if metadata is not None:
                record["metadata"] = metadata
            self._remember_version(record)

    def upgrade_with_intents(self, app_id: str, version: str, intents: Dict[str, str]) -> None:
        """A new version whose ABI is the current one with these methods' intents changed ({method: "mutating"}):
        a method [view] in the installed build becomes [mut] in the next (single-service apps)."""
        with self._lock:
            abi = json.loads(compact_json(self._apps[app_id]["abi"]))
        for method in abi["methods"]:
            if method["name"] in intents:
                method["intent"] = intents[method["name"]]
        self.upgrade_app(app_id, version, abi=abi)

    def move_group(self, group_id: str, app_id: str) -> None:
        """The group (and every context in it) now runs another application, as a group upgrade to another
        application's id leaves it (§0.6: a different package or signer is a different id): the group runs that
        row's current bytecode, and each context's record names that application at once (its version flips when
        next used, §0.7)."""
        app_id = self._app_key(app_id)
        with self._lock:
            group = self._group_or_404(group_id)
            self._move_group_contexts([group], app_id)

    def _move_group_contexts(self, groups: List[Dict[str, Any]], app_id: str) -> List[Dict[str, Any]]:
        """Move `groups` to `app_id`'s current bytecode; their contexts (returned) name that application now."""
        ids = {g["id"] for g in groups}
        old = self._apps.get(groups[0]["applicationId"]) if groups else None
        from_version = next((e["version"] for e in (old or {"history": []})["history"]
                             if groups and e["blobId"] == groups[0]["bytecode"]), None)
        for group in groups:
            group.update(bytecode=self._blob_ids(self._apps[app_id])[0], applicationId=app_id, upgrade=None)
        contexts = [c for c in self._contexts.values() if c["groupId"] in ids]
        for context in contexts:
            context["version"] = context.get("version") or from_version
            context["applicationId"] = app_id
        return contexts

    def _app_key(self, app: str) -> str:
        """Accept an app id or a package name (constructor convenience)."""
        with self._lock:
            if app in self._apps:
                return app
            for record in self._apps.values():
                if record["package"] == app:
                    return record["id"]
        raise ValueError("no app {!r} in the double".format(app))

    @staticmethod
    def _blob_ids(record: Dict[str, Any], service: str = "") -> Tuple[str, str]:
        """Deterministic per (app, version, service): an upgrade changes the bytecode blob id (§3.2)."""
        label = "{}:{}:{}".format(record["id"], record["version"], service)
        return hex_id("bytecode:" + label), hex_id("compiled:" + label)

    def _metadata_bytes(self, record: Dict[str, Any]) -> bytes:
        """Bundle metadata is the UTF-8 JSON object stored as bytes (§3.2, checklist 10–11)."""
        metadata = record["metadata"]
        if isinstance(metadata, bytes):
            return metadata
        if isinstance(metadata, str):
            return metadata.encode("utf-8")
        body = {"package": record["package"], "version": record["version"]}
        body.update(metadata or {})
        return compact_json(body).encode("utf-8")

    def _app_view(self, record: Dict[str, Any], with_services: bool) -> Dict[str, Any]:
        bytecode, compiled = self._blob_ids(record)
        view = {"id": record["id"], "blob": {"bytecode": bytecode, "compiled": compiled}, "size": record["size"],
                "source": "{}/api/v2/bundles/{}/{}.mpk".format(REGISTRY_URL, record["package"], record["version"]),
                "metadata": list(self._metadata_bytes(record))}
        if record["signer_id"]:
            view["signer_id"] = record["signer_id"]
        if record["package"]:
            view["package"] = record["package"]
        if record["version"]:
            view["version"] = record["version"]
        if with_services and record["services"]:
            view["services"] = {}
            for name in sorted(record["services"]):
                service_bytecode, service_compiled = self._blob_ids(record, name)
                view["services"][name] = {"bytecode": service_bytecode, "compiled": service_compiled}
        return view

    def _app_blob_ids(self) -> Dict[str, int]:
        """Every blob an installed app references, with its size (they cannot be deleted, §3.5)."""
        blobs = {}
        for record in self._apps.values():
            for service in [""] + sorted(record["services"]):
                for blob_id in self._blob_ids(record, service):
                    blobs[blob_id] = record["size"]
        return blobs

    def _manifest_for(self, record: Dict[str, Any], service: Optional[str]) -> Optional[Dict[str, Any]]:
        if record["services"]:
            if service in record["services"]:
                return record["services"][service]
            if service is None and len(record["services"]) == 1:
                return next(iter(record["services"].values()))
            return None
        return record["abi"]

    # -- contexts, aliases, namespaces, groups ----------------------------------------------------------------

    def _member_key(self, context_id: str) -> str:
        """This node's member key in a context: its own (a named node's differs from every other node's)."""
        return hex_id("member:" + context_id if self.name is None else "member:%s:%s" % (self.name, context_id))

    def _new_id(self, kind: str) -> str:
        """A new id, as a node makes them: never one another node of a Network made (each named node its own)."""
        with self._lock:
            self._serial += 1
            label = "{}:{}".format(kind, self._serial)
            return hex_id(label if self.name is None else "{}/{}".format(self.name, label))

    def add_context(self, app_id, context_id=None, service=None, group_id=None, name=None,
                    state=None, heads=None, uninitialized=False) -> str:
        """A context of an installed app. group_id defaults to the app's first namespace (if any);
        heads (DAG head count) defaults to 1 or 2 depending on the id, so some contexts have two."""
        app_id = self._app_key(app_id)
        with self._lock:
            record = self._apps[app_id]
            if record["services"] and service is None and len(record["services"]) > 1:
                raise ValueError("multi-service app needs a service for add_context")
            context_id = context_id or self._new_id("context")
            if group_id is None:
                group_id = next((g["id"] for g in self._groups.values()
                                 if g["parent"] is None and g["applicationId"] == app_id), None)
            if heads is None:
                heads = 2 if int(context_id[-1], 16) % 2 == 0 else 1
            self._contexts[context_id] = {
                "id": context_id, "applicationId": app_id, "serviceName": service, "groupId": group_id,
                "name": name, "kv": dict(state or {}), "seq": 0, "uninitialized": uninitialized,
                "heads": [hex_id("head:{}:{}".format(context_id, i)) for i in range(heads)],
            }
        return context_id

    def add_alias(self, alias: str, context_id: str) -> None:
        with self._lock:
            self._aliases["context"][alias] = context_id

    def add_namespace(self, app_id, name=None, namespace_id=None, role="Admin", member=True) -> str:
        return self.add_group(app_id=app_id, name=name, group_id=namespace_id, visibility="open", role=role,
                              member=member)

    def add_group(self, namespace=None, app_id=None, name=None, group_id=None, visibility="restricted",
                  metadata=None, parent=None, member=True, role="Admin") -> str:
        """A namespace (no parent) or a subgroup; this node's account joins it with `role` unless member=False."""
        parent = parent or namespace
        with self._lock:
            if parent is not None:
                app_id = self._groups[parent]["applicationId"]
            group_id = group_id or self._new_id("namespace" if parent is None else "group")
            self._groups[group_id] = {
                "id": group_id, "parent": parent, "applicationId": self._app_key(app_id), "name": name,
                "visibility": visibility, "metadata": metadata, "createdAt": int(time.time()),
                "members": {self.account: role} if member else {}, "founder": self.account,
                "bytecode": self._blob_ids(self._apps[self._app_key(app_id)])[0],   # what it runs: upgrades move it
                "upgrade": None,
            }
        return group_id

    def set_role(self, group_id: str, role: str, account: Optional[str] = None) -> None:
        """Give an account (this node's by default) a role in a group, e.g. ReadOnly for a read-only replica."""
        with self._lock:
            self._groups[group_id]["members"][account or self.account] = role

    def _lineage(self, group: Dict[str, Any]) -> List[Dict[str, Any]]:
        """The group, then its parent, up to the namespace."""
        chain = [group]
        while chain[-1]["parent"] in self._groups and len(chain) < 64:
            chain.append(self._groups[chain[-1]["parent"]])
        return chain

    def _role_in(self, group: Dict[str, Any]) -> Optional[str]:
        """This node's role: its own row in the group, else the nearest ancestor's."""
        return next((g["members"][self.account] for g in self._lineage(group) if self.account in g["members"]), None)

    def _is_admin(self, group: Dict[str, Any]) -> bool:
        """This node holds Admin in the group or in a group above it."""
        return any(g["members"].get(self.account) == "Admin" for g in self._lineage(group))

    def _require_admin(self, group: Dict[str, Any]) -> None:
        """Governing a group takes Admin there or in a group above it (403s of §0.5.2)."""
        if self._is_admin(group):
            return
        if self._role_in(group) is None:
            raise error_reply(403, NOT_A_MEMBER.format(group["id"]))
        raise error_reply(403, NOT_AN_ADMIN.format(group["id"]))

    # -- auth helpers (embedded mode only) ----------------------------------------------------------------------

    def _require_auth(self) -> AuthService:
        if self._auth is None:
            raise RuntimeError("the double runs in proxy mode (auth=None)")
        return self._auth

    def expire_access_tokens(self) -> None:
        with self._lock:
            self._require_auth().expire_all_access()

    def revoke_all(self) -> None:
        with self._lock:
            self._require_auth().revoke_all()

    def issue_tokens(self, username: str = "admin", permissions=("admin",)) -> Tuple[str, str]:
        with self._lock:
            return self._require_auth().mint_pair(hex_id("root-key:" + username), list(permissions),
                                                  uuid.uuid4().hex)

    def upgrade_node(self) -> None:
        """Restart as a current release: tokens the older node minted (no `key_id`) stop verifying (§0.5.6)."""
        with self._lock:
            self._require_auth().upgrade()

    def expire_invitations(self) -> None:
        """Every invitation minted so far is past its validity (join answers 409, §0.5.2)."""
        with self._lock:
            for entry in self._invitations.values():
                entry["spent"] = True

    # -- request pipeline -----------------------------------------------------------------------------------------

    def _serve(self, handler: _Handler) -> None:
        split = urlsplit(handler.path)
        try:
            body = handler.read_body()
        except (OSError, ValueError):
            handler.close_connection = True
            return
        request = Request(handler.command, split.path, dict(parse_qsl(split.query, keep_blank_values=True)),
                          {k.lower(): v for k, v in handler.headers.items()}, body)
        if request.path == "/sse" or request.path.startswith("/sse/"):
            self._serve_sse(handler, request)       # logged in sse_log, so the admin log reads as before
            return
        ok, parsed = parse_json_body(body) if body else (False, None)
        entry = {"method": request.method, "path": request.path, "query": dict(request.query),
                 "headers": dict(request.headers), "json": parsed if ok else None, "body": body,
                 "at": time.monotonic()}   # arrival; "done_at" once answered: which request waited for which
        with self._lock:
            self.log.append(entry)
        try:
            self._wait_if_slow(request.path)
            if not self._apply_fault(handler, request):
                marks = self._replicated_marks() if self.network is not None and request.method != "GET" else None
                reply = self._answer(request)
                if marks is not None:
                    self.network.spread(self, marks)
                self._arm_after(request, reply)
                entry["answering_at"] = time.monotonic()   # before a byte of it: no reply to it can come earlier
                handler.send(reply)
        except OSError:   # the client went away, or stop() shut the connection down
            handler.close_connection = True
            entry["cut"] = True        # the answer was not all written: the client stopped reading
        with self._lock:
            entry["answered"] = True   # written out: a test waiting on a late answer waits for this
            entry["done_at"] = time.monotonic()

    def _wait_if_slow(self, path: str) -> None:
        with self._lock:
            prefixes = [p for p in self.slow if path.startswith(p)]
            seconds = self.slow[max(prefixes, key=len)] if prefixes else 0
        if seconds:
            time.sleep(float(seconds))

    def _arm_after(self, request: Request, reply: Reply) -> None:
        with self._lock:
            if request.method == "DELETE" and 200 <= reply.status < 300 and self.after_delete is not None:
                self.faults, self.after_delete = dict(self.after_delete), None

    def _answer(self, request: Request) -> Reply:
        if request.method == "OPTIONS":   # CORS preflight is never guarded (§1.3)
            return empty_reply(200, {"Access-Control-Allow-Methods": "POST, GET, DELETE, PUT, OPTIONS",
                                     "Access-Control-Allow-Headers": "*"})
        route, refusal = self._route(request)
        if route is None:
            return refusal
        for check in (self._guard, decode_body, self._closed_body, check_id_params):
            refusal = check(route, request)
            if refusal is not None:
                return refusal
        return self._call_handler(route, request)

    def _route(self, request: Request) -> Tuple[Optional[Route], Optional[Reply]]:
        path_known = False
        for route in ROUTES:
            match = route.regex.match(request.path)
            if match is None or (route.access.startswith("auth") and self._auth is None):
                continue   # proxy mode has no /auth or /admin routes at all (§1.4)
            path_known = True
            method = "GET" if request.method == "HEAD" and route.method == "GET" else request.method
            if route.method == method:
                request.params = {k: unquote(v) for k, v in match.groupdict().items()}
                return route, None
        # unknown route → bodyless 404; known path with another method → bodyless 405 (§1.2)
        return None, empty_reply(405 if path_known else 404)

    def _guard(self, route: Route, request: Request) -> Optional[Reply]:
        if self._auth is None or route.access in ("public", "auth"):
            return None   # proxy mode has no guard at all; public routes never are guarded (§1.4–1.5)
        with self._lock:
            return self._auth.guard(request.bearer_token(), route.permission)

    def _closed_body(self, route: Route, request: Request) -> Optional[Reply]:
        """A key a closed request body does not know is a 400 with serde's text, never dropped (§0.5.1)."""
        body = request.json
        if route.closed is None or not isinstance(body, dict):
            return None
        fields = route.closed
        if self.legacy_upgrade_policy and route.handler in ("create_namespace", "create_group"):
            fields += ("upgradePolicy",)
        if self.legacy_lifecycle and route.handler in LEGACY_FIELDS:
            fields = tuple(dict.fromkeys(fields + LEGACY_FIELDS[route.handler]))
        found = self._unknown_key(body, fields, "")
        members = body.get("members") if route.handler == "add_group_members" else None
        for index, member in enumerate(members if isinstance(members, list) else []):
            if found is None and isinstance(member, dict):   # each member is a closed set too
                found = self._unknown_key(member, MEMBER_FIELDS, "members[%d]." % index)
        if found is None:
            return None
        where, key, known = found
        message = serde_unknown_field(key, known)
        self._record_refusal(request, where + key)
        if route.body == "auth":   # the auth crate's own extractor (§2)
            return json_reply(400, {"error": "Invalid JSON: " + message, "status": 400})
        column = request.body.decode("utf-8", "replace").find(json.dumps(key)) + len(json.dumps(key))   # its quote
        return error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                                "{} at line 1 column {}".format(message, column))

    @staticmethod
    def _unknown_key(body: Dict[str, Any], fields: Tuple[str, ...], where: str):
        key = next((k for k in body if k not in fields), None)
        return None if key is None else (where, key, fields)

    def _record_refusal(self, request: Request, field: str) -> None:
        with self._lock:
            self.refusals.append({"method": request.method, "path": request.path, "field": field})

    def _call_handler(self, route: Route, request: Request) -> Reply:
        try:
            result = getattr(self, "_h_" + route.handler)(request)
        except Reply as reply:
            return reply
        except Exception:   # a bug in the double: answer like the node's catch-all, keep the trace for the test
            with self._lock:
                self.handler_errors.append(traceback.format_exc())
            return internal_error()
        return result if isinstance(result, Reply) else json_reply(200, result)

    # -- faults ---------------------------------------------------------------------------------------------

    def _current_fault(self, path: str) -> Dict[str, Any]:
        with self._lock:
            fault = dict(self.faults)
            prefixes = fault.get("paths")
            matches = (lambda p: path == p) if fault.get("exact") else path.startswith
            if not fault or (prefixes and not any(matches(p) for p in prefixes)):
                return {}
            if "times" in fault:   # optional: a fault that heals itself after N requests
                self.faults["times"] = fault["times"] - 1
                if self.faults["times"] <= 0:
                    self.faults.clear()
            return fault

    def _apply_fault(self, handler: _Handler, request: Request) -> bool:
        """Returns True when the fault already dealt with the connection."""
        fault = self._current_fault(request.path)
        if fault.get("delay"):
            time.sleep(float(fault["delay"]))
        if fault.get("down"):
            handler.close_connection = True   # FIN without a response: "connection closed"/refused
            return True
        if fault.get("reset"):
            handler.abort_with_reset()
            return True
        if fault.get("truncated"):
            self._send_truncated(handler)
            return True
        if fault.get("drip"):
            self._send_dripping(handler, self._answer(request), float(fault["drip"]))
            return True
        if fault.get("huge"):
            self._send_huge(handler, int(fault["huge"]), fault.get("declared", True))
            return True
        if fault.get("garbage"):
            handler.send(Reply(200, b"<html><body>502 Bad Gateway?</body>", JSON_TYPE))
            return True
        if fault.get("deep"):
            depth = int(fault["deep"])
            handler.send(Reply(200, b'{"data":' + b"[" * depth + b"]" * depth + b"}", JSON_TYPE))
            return True
        if "status" in fault or "json" in fault or "body" in fault or "raw" in fault:
            handler.send(self._fault_reply(fault, request.path))
            return True
        return False

    @staticmethod
    def _send_truncated(handler: _Handler) -> None:
        partial = b'{"data":{"status":"al'
        handler.send_response(200)
        handler.send_header("Content-Type", JSON_TYPE)
        handler.send_header("Content-Length", str(len(partial) + 64))
        handler.end_headers()
        handler.wfile.write(partial)
        handler.close_connection = True

    def _send_dripping(self, handler: _Handler, reply: Reply, seconds: float) -> None:
        head = "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (
            reply.status, HTTPStatus(reply.status).phrase, reply.content_type or JSON_TYPE, len(reply.body))
        handler.close_connection = True
        for index, byte in enumerate(head.encode("ascii") + reply.body):
            if self._server is None:
                return                       # stopped: no need to finish
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(seconds)

    @staticmethod
    def _send_huge(handler: _Handler, size: int, declared: bool) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", JSON_TYPE)
        if declared:
            handler.send_header("Content-Length", str(size))
        handler.end_headers()
        handler.close_connection = True
        chunk, sent = b"x" * (1 << 20), 0
        handler.wfile.write(b'"')
        while sent < size - 2:
            piece = chunk[:size - 2 - sent]
            handler.wfile.write(piece)
            sent += len(piece)
        handler.wfile.write(b'"')

    @staticmethod
    def _fault_reply(fault: Dict[str, Any], path: str) -> Reply:
        status = int(fault.get("status", 200))
        if "json" in fault:
            return json_reply(status, fault["json"])
        if "raw" in fault:
            return Reply(status, fault["raw"].encode("utf-8"), JSON_TYPE)
        if "body" in fault:
            return text_reply(status, str(fault["body"]))
        if status == 503:
            ids = re.findall(r"[0-9a-f]{64}", path)
            return error_reply(503, AUTHORITY_NOT_YET.format(ids[0] if ids else NODE_ACCOUNT))
        if status == 500:
            return internal_error()
        return error_reply(status, HTTPStatus(status).phrase)

    # =================================================================================================================
    # Handlers. Each returns a JSON-able value (200) or a Reply. Names: _h_<route handler>.
    # =================================================================================================================

    # -- health & identity (§3.1) -----------------------------------------------------------------------------

    def _h_health(self, request):
        return {"data": {"status": "alive"}}

    def _h_ready(self, request):
        return {"data": {"status": "ready"}}

    def _h_is_authed(self, request):
        return {"data": {"status": "alive"}}

    def _h_identity(self, request):
        if self.fresh_identity:
            raise error_reply(404, FRESH_IDENTITY_RC25 if self.legacy_lifecycle else FRESH_IDENTITY)
        return {"data": {"accountId": self.account, "deviceId": self.device, "publicKey": self.public_key,
                         "accountRootPublicKey": self.account, "holdsAccountRoot": True, "deviceCertified": True}}

    def _h_peers(self, request):
        count = self.network.peer_count(self) if self.network is not None else self.peer_count
        return {"count": count}   # no wrapper (§0.6)

    def _h_network_status(self, request):
        """§3.1: no wrapper; `localPeerId` is what another node's --boot-nodes names (§0.8)."""
        return {"localPeerId": self.peer_id, "listenAddrs": ["/ip4/127.0.0.1/tcp/{}".format(self.swarm_port)],
                "externalAddrs": [], "relays": [], "rendezvous": [], "directUpgrades": [],
                "autonat": {"status": "unknown"}}

    @property
    def swarm_port(self) -> int:
        """The libp2p port a real node would listen on beside its server (merod's default pairing: 2428/2528)."""
        return 20000 + int(self.public_key[:4], 16) % 20000

    # -- applications (§3.2) ------------------------------------------------------------------------------------

    def _app_or_404(self, app_id: str) -> Dict[str, Any]:
        record = self._apps.get(app_id)
        if record is None:
            raise error_reply(404, "Application not found")
        return record

    def _h_list_applications(self, request):
        with self._lock:
            apps = [self._app_view(self._apps[k], self.list_services) for k in sorted(self._apps)]
        return {"data": {"apps": apps}}

    def _h_get_application(self, request):
        with self._lock:
            return {"data": {"application": self._app_view(self._app_or_404(request.params["application_id"]), True)}}

    def _h_get_abi(self, request):
        with self._lock:
            record = self._app_or_404(request.params["application_id"])
            if record["raw_wasm"]:
                raise error_reply(400, RAW_WASM_ABI)
            if record["abi_error"]:
                raise error_reply(400, record["abi_error"])
            manifest = self._select_abi(record, request.query.get("service_name"))
        version = str(manifest.get("schema_version", ""))
        if version != "wasm-abi/1" and not version.startswith("wasm-abi/1."):
            raise error_reply(400, "unsupported ABI schema version {}".format(version))
        return {"data": manifest}

    @staticmethod
    def _select_abi(record: Dict[str, Any], service: Optional[str]) -> Dict[str, Any]:
        """The §3.2 service rules: one service answers without a name; several need one."""
        services = record["services"]
        available = ", ".join(sorted(services))
        if services:
            if service is None and len(services) > 1:
                raise error_reply(400, "application has multiple services; pass service_name (available: {})"
                                  .format(available))
            if service is not None and service not in services:
                raise error_reply(400, 'service "{}" not found (available: {})'.format(service, available))
            manifest = services[service] if service is not None else next(iter(services.values()))
        elif service is not None:
            raise error_reply(400, "application has no named services; omit service_name")
        else:
            manifest = record["abi"]
        if not isinstance(manifest, dict):
            raise error_reply(400, NO_USABLE_ABI)
        return manifest

    def _h_application_versions(self, request):
        with self._lock:
            record = self._app_or_404(request.params["application_id"])
            return {"data": [dict(entry) for entry in record["history"]]}

    def _h_uninstall_application(self, request):
        # idempotent: deleting the row of an unknown id still succeeds (checklist 8)
        self.remove_app(request.params["application_id"])
        return {"data": {"applicationId": request.params["application_id"]}}

    def _h_install_application(self, request):
        body = request.json
        absent = missing_field(body, ("package", "version"))
        if absent:
            raise error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                                   "missing field `{}` at line 1 column {}".format(absent, len(request.body)))
        problems = coordinate_problems(body["package"], body["version"])
        if problems:
            raise validation_reply(problems)
        if self.registry_mode == "dht":   # §0.5.3: such a node cannot install by coordinates at all
            raise text_reply(502, DHT_REGISTRY_MODE)
        spec = self.registry.get("{}@{}".format(body["package"], body["version"]))
        if spec is None:   # §0.5.3: the node only fetches from its own registry; a miss is a text/plain 502
            raise text_reply(502, REGISTRY_MISS.format(body["package"], body["version"]))
        app_id = self.add_app(dict(spec, package=body["package"], version=body["version"]))
        return {"data": {"applicationId": app_id}}

    def _h_install_dev_application(self, request):
        """§0.6: `{path}` (an older node requires `metadata` too); the node reads its own filesystem, confined to
        MEROD_DEV_INSTALL_ROOT when set. `registry` maps a path to the bundle found there."""
        body = request.json
        for field in ("path",) + (("metadata",) if self.legacy_lifecycle else ()):
            if field not in body:
                raise error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target "
                                       "type: missing field `{}` at line 1 column {}".format(field, len(request.body)))
        path = body["path"]
        if not isinstance(path, str) or ".." in path.split("/"):
            raise error_reply(400, INVALID_FORMAT.format("path", "must not contain '..'"))
        spec = self.registry.get(path)
        if self.dev_install_root is not None:
            if not path.startswith(self.dev_install_root.rstrip("/") + "/"):
                raise error_reply(403, DEV_INSTALL_REFUSED)
            if spec is None:
                raise error_reply(403, DEV_INSTALL_UNRESOLVED)
        if spec is None:
            raise text_reply(500, "failed to read bundle at {}: No such file or directory (os error 2)".format(path))
        return {"data": {"applicationId": self.add_app(spec)}}

    def _h_registry_bundles(self, request):
        """The registry's `GET /api/v2/bundles` over `registry`'s package@version entries (§0.7): the latest of
        every package (per signer: a spec's signer_id is its manifest's signerId) sorted by package; `?package=P`
        its latest, with `all_versions=true` every version."""
        package, every = request.query.get("package"), request.query.get("all_versions") == "true"
        if every and not package:
            raise json_reply(400, {"error": "invalid_params", "message": "all_versions requires package"})
        with self._lock:
            bundles = [self._registry_manifest(coords, spec) for coords, spec in self.registry.items()
                       if "@" in coords and not coords.startswith("/")]
        bundles.sort(key=lambda b: (b["package"], [int(p) if p.isdigit() else 0 for p in b["appVersion"].split(".")]))
        if package:
            bundles = [b for b in bundles if b["package"] == package]
            if not bundles:
                raise json_reply(404, {"error": "not_found"})
        if not every:        # the latest of each package per signer (two signers may publish one name)
            latest = {(b["package"], b.get("signerId") or ""): b for b in bundles}
            bundles = [latest[key] for key in sorted(latest)]
        return json_reply(200, bundles)

    @staticmethod
    def _registry_manifest(coords: str, spec: Dict[str, Any]) -> Dict[str, Any]:
        package, _, version = coords.partition("@")
        meta = spec.get("metadata") or {}
        return {"package": package, "appVersion": version,
                "metadata": {"name": meta.get("name", package), "description": meta.get("description", "")},
                "wasm": {"path": "app.wasm", "hash": hex_id("wasm:" + coords), "size": 4096},
                "minRuntimeVersion": "0.1.0", "verified": True, "downloads": 0, "yanked": bool(spec.get("yanked")),
                **({"signerId": spec["signer_id"]} if spec.get("signer_id") else {})}

    def _h_list_packages(self, request):
        with self._lock:
            return {"packages": sorted({r["package"] for r in self._apps.values() if r["package"]})}

    def _h_package_versions(self, request):
        with self._lock:
            return {"versions": sorted({r["version"] for r in self._apps.values()
                                        if r["package"] == request.params["package"]})}

    def _h_package_latest(self, request):
        with self._lock:
            records = [r for r in self._apps.values() if r["package"] == request.params["package"]]
        if not records:
            return {"applicationId": None, "version": None}
        latest = max(records, key=lambda r: [int(p) if p.isdigit() else 0 for p in r["version"].split(".")])
        return {"applicationId": latest["id"], "version": latest["version"]}

    # -- contexts (§3.3) -------------------------------------------------------------------------------------------

    def _context_view(self, context: Dict[str, Any], with_group: bool) -> Dict[str, Any]:
        app = self._apps.get(context["applicationId"])
        view = {"id": context["id"], "applicationId": context["applicationId"]}
        if context["serviceName"]:
            view["serviceName"] = context["serviceName"]
        view["contextStateHash"] = self._state_hash(context)
        if context["heads"]:   # omitted when empty (checklist 14)
            view["dagHeads"] = [id_bytes(head) for head in context["heads"]]
        group = self._groups.get(context["groupId"]) if context["groupId"] else None
        version = context.get("version") or (self._blob_version(app, group["bytecode"]) if app and group else None) \
            or (app["version"] if app else None)
        if version:   # a context runs the version it last ran until next used after an upgrade (§0.7)
            view["applicationVersion"] = version
        if context["name"]:
            view["name"] = context["name"]
        if with_group and context["groupId"]:
            view["groupId"] = context["groupId"]
        return view

    @staticmethod
    def _blob_version(app: Dict[str, Any], blob: str) -> Optional[str]:
        """The retained version whose bytecode blob this is (§0.7: a namespace's appVersion is its appKey's)."""
        return next((e["version"] for e in app["history"] if e["blobId"] == blob), None)

    @staticmethod
    def _state_hash(context: Dict[str, Any]) -> str:
        if context["uninitialized"]:
            return ZERO_HASH   # all-zero ⇒ state not initialised yet (§3.3)
        return hex_id("state:{}:{}:{}".format(context["id"], context["seq"], compact_json(sorted(context["kv"].items()))))

    def _context_or_404(self, context_id: str) -> Dict[str, Any]:
        context = self._contexts.get(context_id)
        if context is None:
            raise error_reply(404, "Context not found")
        return context

    def _h_list_contexts(self, request):
        with self._lock:
            ids = sorted(set(self._contexts) | self.dangling_context_ids)
            contexts = paginate_stream(ids, lambda k: self._context_view(self._contexts[k], True)
                                       if k in self._contexts else None, request.query)
        return {"data": {"contexts": contexts}}

    def _h_contexts_for_application(self, request):
        app_id = request.params["application_id"]
        with self._lock:
            contexts = [self._context_view(self._contexts[k], True) for k in sorted(self._contexts)
                        if self._contexts[k]["applicationId"] == app_id]
        return {"data": {"contexts": contexts}}

    def _h_get_context(self, request):
        with self._lock:
            return {"data": self._context_view(self._context_or_404(request.params["context_id"]), False)}

    def _h_delete_context(self, request):
        with self._lock:
            deleted = self._contexts.pop(request.params["context_id"], None) is not None
        return {"data": {"isDeleted": deleted}}

    def _h_join_context(self, request):
        context_id = request.params["context_id"]
        if self.network is not None:
            self._join_replica(context_id)
        with self._lock:
            if context_id not in self._contexts:
                raise error_reply(404, CONTEXT_NOT_FOUND.format(context_id))
        return {"data": {"contextId": context_id, "memberPublicKey": self._member_key(context_id)}}

    _h_leave_context = _h_join_context

    def _h_sync_contexts(self, request):
        with self._lock:
            self.syncs.append({"context": None, "force": False})
        return {"data": None}

    def _h_sync_context(self, request):
        context_id = request.params["context_id"]
        with self._lock:
            if context_id not in self._contexts:
                raise error_reply(404, CONTEXT_NOT_FOUND.format(context_id))
            self.syncs.append({"context": context_id, "force": False})
        if self.network is not None:
            self.network.pull_context(self, context_id)   # a sync asked now pulls now (§0.8)
        return {"data": None}

    def _h_resync_context(self, request):
        """§0.6: a resync replaces local state with a peer's; it is refused (409) for a context in no group, and
        for one holding local DAG heads unless forced."""
        context_id, force = request.params["context_id"], request.json.get("force", False)
        if not isinstance(force, bool):
            raise error_reply(400, "Invalid JSON data: force: invalid type: expected a boolean")
        with self._lock:
            context = self._contexts.get(context_id)
            if context is None:
                raise error_reply(404, CONTEXT_NOT_FOUND.format(context_id))
            if context["groupId"] is None:
                raise error_reply(409, "context {}: it is in no group, so no peer can be asked".format(context_id))
            if context["heads"] and not force:
                raise error_reply(409, "context {}: it holds local DAG heads a resync would discard; pass force"
                                  .format(context_id))
            self.syncs.append({"context": context_id, "force": force})
        return {"contextId": context_id, "resyncStarted": True}   # no wrapper (§0.6)

    def _h_context_identities(self, request):
        with self._lock:
            context = self._context_or_404(request.params["context_id"])
        return {"data": {"identities": [hex_id("member:" + context["id"])]}}

    def _h_context_group(self, request):
        with self._lock:
            return {"data": self._context_or_404(request.params["context_id"])["groupId"]}

    def _h_create_context(self, request):
        body = request.json
        absent = missing_field(body, ("applicationId", "initializationParams", "groupId"))
        if absent:
            raise error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                              "missing field `{}`".format(absent))
        params = body["initializationParams"]
        if isinstance(params, list) and len(params) > MAX_INIT_PARAMS:
            raise validation_reply([TOO_LARGE.format("initialization_params", MAX_INIT_PARAMS, len(params))])
        group_id = self._parse_group_id_field(body["groupId"])
        with self._lock:
            group = self._group_or_404(group_id)
            if self._role_in(group) is None:
                raise error_reply(403, NOT_A_MEMBER.format(group_id))
            # §3.3: the group's target application wins over the requested one (the node only warns)
            record = self._apps.get(group["applicationId"])
            if record is None:
                raise error_reply(404, APPLICATION_ID_NOT_FOUND.format(group["applicationId"]))
            service = self._create_context_service(record, body.get("serviceName"))
            manifest = self._manifest_for(record, service)
            init_input = self._init_input(body.get("initializationParams"))
            self._run_init(manifest, init_input)
            context_id = self.add_context(record["id"], service=service, group_id=group_id, name=body.get("name"))
        return {"data": {"contextId": context_id, "memberPublicKey": self._member_key(context_id),
                         "groupId": group_id, "groupCreated": False}}

    @staticmethod
    def _parse_group_id_field(value: Any) -> str:
        if not isinstance(value, str) or not HEX_STRING.match(value):
            raise error_reply(400, "Invalid group_id: expected hex-encoded 32 bytes")
        if len(value) != 64:
            raise error_reply(400, "Invalid group_id: must be exactly 32 bytes")
        return value.lower()

    @staticmethod
    def _create_context_service(record: Dict[str, Any], service: Optional[str]) -> Optional[str]:
        services = record["services"]
        if services and service is None and len(services) > 1:
            raise error_reply(400, "application has multiple services; pass serviceName (available: {})"
                              .format(", ".join(sorted(services))))
        if service is not None and service not in services:
            raise internal_error()
        return service

    @staticmethod
    def _init_input(params: Any) -> Any:
        """initializationParams: integer array of the UTF-8 JSON of init's arguments; [] = no input (§3.3)."""
        if params is None or params == []:
            return NO_INPUT
        try:
            return json.loads(bytes(params).decode("utf-8"))
        except (TypeError, ValueError):
            raise error_reply(400, "application initialization failed: guest panicked: init: failed to "
                              "deserialize arguments: Error(\"expected value\", line: 1, column: 1)")

    @staticmethod
    def _run_init(manifest: Optional[Dict[str, Any]], init_input: Any) -> None:
        init = find_method(manifest, "init")
        if init is None:
            return
        try:
            decode_arguments(manifest, init, init_input)
        except GuestPanic as panic:
            raise error_reply(400, "application initialization failed: guest panicked: {}".format(panic))

    # -- aliases (§3.4) ------------------------------------------------------------------------------------------

    def _alias_table(self, request) -> Dict[str, str]:
        table = self._aliases.get(request.params["kind"])
        if table is None:
            raise empty_reply(404)
        return table

    def _h_create_alias(self, request):
        body = request.json
        id_key = "contextId" if request.params["kind"] == "context" else "applicationId"
        alias, target = body.get("alias"), body.get(id_key)
        if not isinstance(alias, str) or not ALIAS.match(alias):
            raise text_reply(422, "Failed to deserialize the JSON body into the target type: alias: invalid alias "
                             "(1-50 characters of A-Z a-z 0-9 . _ -) at line 1 column {}".format(len(request.body)))
        if normalise_hex64(target) is None:
            raise text_reply(422, "Failed to deserialize the JSON body into the target type: {}: invalid id "
                             "at line 1 column {}".format(id_key, len(request.body)))
        with self._lock:
            table = self._alias_table(request)
            if alias in table:
                raise error_reply(409, "alias already exists")
            table[alias] = normalise_hex64(target)
        return {"data": None}

    def _h_lookup_alias(self, request):
        if not ALIAS.match(request.params["name"]):
            raise text_reply(400, "invalid path params")
        with self._lock:
            return {"data": {"value": self._alias_table(request).get(request.params["name"])}}

    def _h_list_aliases(self, request):
        with self._lock:
            table = self._alias_table(request)
            if self.alias_rows:   # one unmerged branch of core (§0.6)
                return {"data": [{"alias": alias, "value": table[alias]} for alias in sorted(table)]}
            return {"data": dict(sorted(table.items()))}

    def _h_delete_alias(self, request):
        if not ALIAS.match(request.params["name"]):
            raise text_reply(400, "invalid path params")
        with self._lock:
            self._alias_table(request).pop(request.params["name"], None)
        return {"data": None}

    # -- blobs (§3.5) ----------------------------------------------------------------------------------------------

    def _h_upload_blob(self, request):
        for key, message in (("hash", "The provided hash is not a valid format"),
                             ("context_id", "The provided context_id is not a valid format")):
            if key in request.query and normalise_hex64(request.query[key]) is None:
                raise error_reply(400, message)
        blob_id = hashlib.sha256(request.body).hexdigest()
        if normalise_hex64(request.query.get("hash")) not in (None, blob_id):   # core checks it once stored
            raise error_reply(500, "Failed to store blob: fatal: blob hash mismatch")
        with self._lock:
            self._blobs[blob_id] = request.body
        return {"data": {"blob_id": blob_id, "size": len(request.body)}}

    def _h_list_blobs(self, request):
        with self._lock:
            sizes = self._app_blob_ids()
            sizes.update({blob_id: len(data) for blob_id, data in self._blobs.items()})
        return {"data": {"blobs": [{"blob_id": k, "size": sizes[k]} for k in sorted(sizes)]}}

    def _h_download_blob(self, request):
        blob_id = request.params["blob_id"]
        with self._lock:
            data = self._blobs.get(blob_id)
        if data is None:
            raise error_reply(404, "Blob not found" if request.method == "HEAD"
                              else "Blob not found locally or in network")
        mime = self.blob_mime or sniffed_mime(data)
        headers = {"ETag": '"{}"'.format(hashlib.sha256(data).hexdigest()), "Cache-Control": "private, no-cache",
                   "X-Blob-ID": blob_id, "X-Blob-Hash": blob_id, "X-Blob-MIME-Type": mime, "X-Blob-Source": "local",
                   "Access-Control-Expose-Headers": "X-Blob-ID, X-Blob-Hash, X-Blob-MIME-Type, X-Blob-Source, ETag"}
        if self.legacy_lifecycle:         # older releases: cached for an hour, no X-Blob-Source (§0.6)
            headers["Cache-Control"] = "public, max-age=3600"
            del headers["X-Blob-Source"]
        return Reply(200, data, mime, headers)

    def _h_delete_blob(self, request):
        blob_id = request.params["blob_id"]
        with self._lock:
            if blob_id in self._app_blob_ids():
                raise error_reply(403, "Blob is referenced by an installed application and cannot be deleted")
            if self._blobs.pop(blob_id, None) is None:
                raise error_reply(404, "Blob not found")
        return {"blob_id": blob_id, "deleted": True}   # no wrapper (§1.2)

    # -- namespaces (§3.6) -----------------------------------------------------------------------------------------

    def _namespace_view(self, group: Dict[str, Any]) -> Dict[str, Any]:
        app = self._apps.get(group["applicationId"])
        view = {"namespaceId": group["id"],
                "appKey": group["bytecode"] if app else ZERO_HASH,     # the blob its root group runs (§0.7)
                "targetApplicationId": group["applicationId"], "createdAt": group["createdAt"],
                "founding": {"founderAccountId": group.get("founder", self.account), "salt": hex_id("founding:" + group["id"])}}
        if group["name"]:
            view["name"] = group["name"]
        view.update(self._group_counts(group))
        version = self._blob_version(app, group["bytecode"]) if app else None
        if version:
            view["appVersion"] = version
        return view

    def _group_counts(self, group: Dict[str, Any]) -> Dict[str, int]:
        counts = {"memberCount": len(group["members"]),
                  "contextCount": sum(1 for c in dict(self._registered, **self._contexts).values()
                                      if c["groupId"] == group["id"])}
        if self.subgroup_counts:
            counts["subgroupCount"] = sum(1 for g in self._groups.values() if g["parent"] == group["id"])
        return counts

    def _namespaces(self) -> List[Dict[str, Any]]:
        return [self._groups[k] for k in sorted(self._groups) if self._groups[k]["parent"] is None]

    def _h_list_namespaces(self, request):
        with self._lock:
            return {"data": [self._namespace_view(g) for g in paginate(self._namespaces(), request.query)]}

    def _h_namespaces_for_application(self, request):
        with self._lock:
            return {"data": [self._namespace_view(g) for g in self._namespaces()
                             if g["applicationId"] == request.params["application_id"]]}

    def _namespace_or_404(self, namespace_id: str) -> Dict[str, Any]:
        group = self._groups.get(namespace_id)
        if group is None or group["parent"] is not None:
            raise error_reply(404, NAMESPACE_NOT_FOUND.format(namespace_id))
        return group

    def _h_get_namespace(self, request):
        with self._lock:
            return {"data": self._namespace_view(self._namespace_or_404(request.params["namespace_id"]))}

    def _h_create_namespace(self, request):
        body = request.json
        self._require_legacy_policy(body)
        app_id = normalise_hex64(body.get("applicationId"))
        if "appKey" in body and normalise_hex64(body["appKey"]) is None:
            raise error_reply(400, "Invalid appKey: expected hex-encoded 32 bytes")
        with self._lock:
            if app_id not in self._apps:
                raise error_reply(404, APPLICATION_ID_NOT_FOUND.format(body.get("applicationId")))
            namespace_id = self.add_namespace(app_id, name=body.get("name"))
        return {"data": {"namespaceId": namespace_id}}

    def _require_legacy_policy(self, body):
        """Current core knows no `upgradePolicy` (the closed set refuses it); some older releases instead
        *required* it on namespace and group creation — `legacy_upgrade_policy` plays one of those."""
        if self.legacy_upgrade_policy and "upgradePolicy" not in body:
            raise error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                                   "missing field `upgradePolicy` at line 1 column 1")

    def _h_delete_group(self, request):
        """DELETE /namespaces/:id and /groups/:id; contexts outlive their namespace (§3.6). The newest group
        delete is the admin's cascade: the subgroups below and their contexts go too, and a namespace root is
        refused; the older one refuses a group that still has contexts (§0.6)."""
        group_id = request.params.get("namespace_id") or request.params["group_id"]
        with self._lock:
            if "namespace_id" in request.params:
                self._namespace_or_404(group_id)
            group = self._group_or_404(group_id)
            self._require_admin(group)
            doomed = self._descendants(group_id)
            if "group_id" in request.params and group["parent"] is None and not self.legacy_lifecycle:
                raise error_reply(400, NAMESPACE_ROOT.format(group_id))
            if group["parent"] is not None and self.legacy_lifecycle and any(
                    c["groupId"] == group_id for c in self._contexts.values()):
                raise error_reply(409, GROUP_HAS_CONTEXTS.format(group_id))   # a namespace's outlive it
            if group["parent"] is not None and not self.legacy_lifecycle:
                for context_id in [k for k, c in self._contexts.items() if c["groupId"] in doomed]:
                    del self._contexts[context_id]
            for doomed_id in doomed:
                self._groups.pop(doomed_id, None)
        return {"data": {"isDeleted": True}}

    def _descendants(self, group_id: str) -> List[str]:
        found = [group_id]
        for group in list(self._groups.values()):
            if group["parent"] == group_id:
                found.extend(self._descendants(group["id"]))
        return found

    def _invitation(self, group: Dict[str, Any], expiration: int) -> Dict[str, Any]:
        """A SignedGroupOpenInvitation (§3.6): snake_case, byte arrays, signature over the inner object."""
        salt = self._new_id("salt")
        self._invitations[salt] = {"spent": False}
        inner = {"inviter_identity": id_bytes(self.public_key), "group_id": id_bytes(group["id"]),
                 "expiration_timestamp": expiration, "secret_salt": id_bytes(salt), "invited_role": 1}
        app = self._apps.get(group["applicationId"])
        invitation = {"invitation": inner, "inviter_signature": self._invitation_signature(inner),
                      "inviter_account": self.account, "application_id": id_bytes(group["applicationId"])}
        if app:
            invitation["app_key"] = id_bytes(self._blob_ids(app)[0])
        return invitation

    @staticmethod
    def _invitation_signature(inner: Dict[str, Any]) -> str:
        digest = hashlib.sha512(json.dumps(inner, sort_keys=True).encode()).hexdigest()
        return digest   # 128 hex chars, the length of an ed25519 signature

    def _h_invite_namespace(self, request):
        body = request.json
        # `expirationTimestamp` is how many seconds the invitation stays valid (default a year, §3.6)
        expiration = int(time.time()) + int(body.get("expirationTimestamp") or 365 * 24 * 3600)
        with self._lock:
            group = self._group_or_404(request.params["namespace_id"], NAMESPACE_NOT_FOUND)
            if group["parent"] is not None:
                raise error_reply(400, "namespace_id must reference a root group (namespace)")
            self._require_admin(group)
            if body.get("recursive"):
                return {"data": {"invitations": [self._labelled_invitation(self._groups[g], expiration)
                                                  for g in self._descendants(group["id"])]}}
            data = {"invitation": self._invitation(group, expiration)}
            if group["name"]:
                data["groupName"] = group["name"]
        return {"data": data}

    def _labelled_invitation(self, group: Dict[str, Any], expiration: int) -> Dict[str, Any]:
        entry = {"groupId": group["id"], "invitation": self._invitation(group, expiration)}
        if group["name"]:
            entry["groupName"] = group["name"]
        return entry

    def _h_join_namespace(self, request):
        namespace_id = request.params["namespace_id"]
        signed = request.json.get("invitation")
        inner = signed.get("invitation") if isinstance(signed, dict) else None
        if not isinstance(inner, dict) or "group_id" not in inner:
            raise error_reply(400, "Invalid JSON data: missing field `invitation`")
        if inner["group_id"] != id_bytes(namespace_id):
            raise error_reply(400, "invitation group_id does not match namespace_id in path")
        if self.join_outcome == "quote_invitation":
            raise error_reply(400, "invitation rejected: {}".format(json.dumps(signed)))
        if signed.get("inviter_signature") != self._invitation_signature(inner):
            raise error_reply(400, INVITATION_INVALID)   # a reshaped invitation
        if self.network is not None:
            return self._network_join(namespace_id, inner)
        with self._lock:
            self._join_refusal(namespace_id, inner)
            if namespace_id in self._groups:
                self._groups[namespace_id]["members"].setdefault(self.account, "Member")
        return {"data": {"namespaceId": namespace_id, "memberIdentity": self.public_key,
                         "memberAccount": self.account}}

    def _join_refusal(self, namespace_id: str, inner: Dict[str, Any]) -> None:
        """What a join can meet after the invitation checked out: spent or expired (409), no member reachable
        (504), the key or an endorsement still on its way (503); a successful join spends the invitation."""
        salt = bytes(inner.get("secret_salt") or []).hex()
        entry = self._invitations.setdefault(salt, {"spent": False})
        if entry["spent"] or int(inner.get("expiration_timestamp") or 0) < time.time():
            raise error_reply(409, INVITATION_SPENT)
        if self.join_outcome == "no_peer":
            raise error_reply(504, JOIN_NO_PEER)
        if self.join_outcome in ("key_pending", "not_endorsed"):
            text = JOIN_KEY_PENDING if self.join_outcome == "key_pending" else JOIN_NOT_ENDORSED
            raise error_reply(503, text.format(namespace_id))
        entry["spent"] = True

    def _h_leave_namespace(self, request):
        namespace_id = request.params["namespace_id"]
        with self._lock:
            namespace = self._namespace_or_404(namespace_id)
            self._refuse_last_admin(namespace)
            namespace["members"].pop(self.account, None)
        return {"data": {"namespaceId": namespace_id, "memberPublicKey": self.public_key}}

    def _h_namespace_groups(self, request):
        with self._lock:
            self._namespace_or_404(request.params["namespace_id"])
            return {"data": self._child_groups(request.params["namespace_id"])}

    def _child_groups(self, parent_id: str) -> List[Dict[str, Any]]:
        children = []
        for key in sorted(self._groups):
            group = self._groups[key]
            if group["parent"] == parent_id:
                children.append(dict({"groupId": key}, **({"name": group["name"]} if group["name"] else {})))
        return children

    def _h_create_namespace_group(self, request):
        body = request.json
        visibility = str(body.get("visibility") or "restricted").lower()
        with self._lock:
            parent = self._group_or_404(request.params["namespace_id"], NAMESPACE_NOT_FOUND)
            # invalid visibility or a non-root id are untyped errors → 500 (§3.6)
            if parent["parent"] is not None or visibility not in ("open", "restricted"):
                raise internal_error()
            self._require_subgroup_admin(parent)
            group_id = self.add_group(namespace=parent["id"], name=body.get("groupName"), visibility=visibility)
        return {"data": {"groupId": group_id}}

    # -- groups (§3.7) -----------------------------------------------------------------------------------------

    def _group_or_404(self, group_id: str, text: str = GROUP_NOT_FOUND) -> Dict[str, Any]:
        group = self._groups.get(group_id)
        if group is None:
            raise error_reply(404, text.format(group_id))   # typed since rc.83 (was an untyped 500, §0.5.2)
        return group

    def _require_subgroup_admin(self, parent: Dict[str, Any]) -> None:
        """Creating a subgroup takes Admin of the namespace (or the parent group)."""
        if not self._is_admin(parent):
            raise error_reply(403, SUBGROUP_NEEDS_ADMIN.format(self._lineage(parent)[-1]["id"]))

    def _refuse_last_admin(self, group: Dict[str, Any]) -> None:
        """This node may not leave a group others still belong to when no other admin would remain."""
        others = {k: v for k, v in group["members"].items() if k != self.account}
        if group["members"].get(self.account) == "Admin" and others and "Admin" not in others.values():
            raise error_reply(409, LAST_ADMIN.format(group["id"]))

    def _h_create_group(self, request):
        body = request.json
        self._require_legacy_policy(body)
        parent_id = body.get("parentGroupId")
        with self._lock:
            if parent_id is not None:
                self._require_subgroup_admin(self._group_or_404(normalise_hex64(parent_id) or parent_id))
            app_id = normalise_hex64(body.get("applicationId"))
            if parent_id is None and app_id not in self._apps:
                raise error_reply(404, APPLICATION_ID_NOT_FOUND.format(body.get("applicationId")))
            if normalise_hex64(body.get("groupId")) in self._groups:
                raise error_reply(409, GROUP_EXISTS.format(body["groupId"]))
            group_id = self.add_group(parent=normalise_hex64(parent_id) if parent_id else None,
                                      app_id=app_id, name=body.get("name"),
                                      group_id=normalise_hex64(body.get("groupId")), visibility="restricted")
        return {"data": {"groupId": group_id}}   # always born restricted on this path

    def _h_group_info(self, request):
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            if self._role_in(group) is None:   # core's get_group_info gates on membership (typed 403, §0.5.2)
                raise error_reply(403, NOT_A_MEMBER.format(group["id"]))
            info = {"groupId": group["id"], "appKey": group["bytecode"], "targetApplicationId": group["applicationId"]}
            if not self.legacy_group_info:     # both since rc.83 (§0.5.7)
                info.update({"namespaceId": self._lineage(group)[-1]["id"], "ownerOpCounter": 0})
            counts = self._group_counts(group)
            info.update({"memberCount": counts["memberCount"], "contextCount": counts["contextCount"],
                         "defaultCapabilities": 0, "subgroupVisibility": group["visibility"]})
            if group["upgrade"] is not None:   # kept after completion (§0.7)
                info["activeUpgrade"] = self._upgrade_view(group["upgrade"])
            if group["metadata"] is not None:
                info["metadata"] = dict(group["metadata"])
            info["groupStateHash"] = hex_id("group-state:{}:{}".format(group["id"], compact_json(group["metadata"])))
        return {"data": info}

    def _h_subgroups(self, request):
        with self._lock:
            self._group_or_404(request.params["group_id"])
            # Restricted children are hidden unless this node's account is a member of them (§3.7 subgroups).
            return {"subgroups": [row for row in self._child_groups(request.params["group_id"])
                                  if self._groups[row["groupId"]]["visibility"] != "restricted"
                                  or self.account in self._groups[row["groupId"]]["members"]]}

    def _require_member(self, group: Dict[str, Any]) -> None:
        if self.account not in group["members"]:
            raise error_reply(403, "node is not a member of group '{}'".format(group["id"]))

    def _h_group_contexts(self, request):
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_member(group)
            entries = []   # a Network member lists the registrations governance brought, joined or not
            known = dict(self._registered, **self._contexts)
            for key in sorted(known):
                context = known[key]
                if context["groupId"] == group["id"]:
                    entries.append(dict({"contextId": key}, **({"name": context["name"]} if context["name"] else {})))
        return {"data": paginate(entries, request.query)}

    def _h_group_members(self, request):
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_member(group)
            members = [dict({"identity": k, "role": group["members"][k]},
                            **({"name": self.member_names[k]} if k in self.member_names else {}))
                       for k in sorted(group["members"])]
        return {"members": paginate(members, request.query)}   # no wrapper (checklist 25)

    def _h_add_group_members(self, request):
        members = request.json.get("members")
        if not isinstance(members, list):
            raise error_reply(400, "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
                                   "members: invalid type: expected a sequence")
        for member in members:
            problem = self._member_problem(member)
            if problem:
                raise error_reply(400, problem)
        problems = ([] if members else [EMPTY_FIELD.format("members")]) + [
            READ_ONLY_TEE_ADDED for member in members if member["role"] == "ReadOnlyTee"]
        if problems:
            raise validation_reply(problems)
        if any(member["role"] == "RelayTee" for member in members):   # the double's own rule: attestation grants it
            raise error_reply(400, "role RelayTee cannot be assigned directly")
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_admin(group)
            for member in members:
                group["members"][member["identity"]] = member["role"]
        return {}

    def _h_remove_group_members(self, request):
        """§0.6: accounts only, never checked for existence; the last admin stays."""
        accounts = request.json.get("members")
        if not isinstance(accounts, list) or not all(isinstance(a, str) and HEX64.match(a) for a in accounts):
            raise error_reply(400, "Invalid JSON data: members: expected a sequence of 64-hex account ids")
        if not accounts:
            raise validation_reply([EMPTY_FIELD.format("members")])
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_admin(group)
            left = {k: v for k, v in group["members"].items() if k not in {a.lower() for a in accounts}}
            if group["members"] and "Admin" not in left.values() and "Admin" in group["members"].values():
                raise error_reply(409, LAST_ADMIN_REMOVED)
            group["members"] = left
        return None if self.legacy_lifecycle else {}   # one older handler answered null

    def _h_set_member_role(self, request):
        account, role = request.params["account"], request.json.get("role")
        if not HEX64.match(account):
            raise error_reply(400, BAD_ACCOUNT)
        if role == "ReadOnlyTee":
            raise validation_reply([INVALID_FORMAT.format("role", "ReadOnlyTee can only be assigned via TEE "
                                                                  "attestation")])
        if role not in ROLES:
            raise error_reply(400, "Invalid JSON data: unknown variant `{}`, expected {}".format(role,
                                                                                                serde_one_of(ROLES)))
        account = account.lower()
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_admin(group)
            if account not in group["members"]:
                raise error_reply(404, MEMBER_NOT_FOUND.format(account, group["id"]))
            admins = [k for k, v in group["members"].items() if v == "Admin"]
            if admins == [account] and role != "Admin":
                raise error_reply(409, LAST_ADMIN_DEMOTED)
            group["members"][account] = role
        return {}

    def _h_upgrade_group(self, request):
        """§0.6: the group (with cascade, every descendant on the same bytecode) moves to the target row's current
        bytecode at once; the record is written completed, counts and completedAt null (§0.7), unless
        `upgrade_pending_reads` keeps it in progress for that many status reads."""
        body = request.json
        target, cascade = normalise_hex64(body.get("targetApplicationId")), bool(body.get("cascade"))
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_admin(group)
            app = self._apps.get(target)
            if app is None:
                raise error_reply(404, APPLICATION_ID_NOT_FOUND.format(body.get("targetApplicationId")))
            if (group["upgrade"] or {}).get("status") == "in_progress":
                raise error_reply(409, UPGRADE_RUNNING.format(group["id"]))
            bytecode = self._blob_ids(app)[0]
            if group["bytecode"] == bytecode and group["applicationId"] == target:
                raise error_reply(409, ALREADY_TARGETING.format(group["id"]))
            moved = [self._groups[g] for g in (self._descendants(group["id"]) if cascade else [group["id"]])
                     if self._groups[g]["bytecode"] == group["bytecode"]]
            contexts = [c for c in self._contexts.values() if c["groupId"] in {g["id"] for g in moved}]
            if not cascade and not contexts:
                raise error_reply(409, NOTHING_TO_UPGRADE.format(group["id"]))
            old = self._apps.get(group["applicationId"]) or {"history": []}
            from_version = next((e["version"] for e in old["history"] if e["blobId"] == group["bytecode"]), None)
            self._move_group_contexts(moved, target)   # each context's version flips when next used (§0.7)
            pending = self.upgrade_pending_reads
            group["upgrade"] = {
                "fromVersion": from_version, "toVersion": app["version"], "initiatedAt": int(time.time() * 1000),
                "initiatedBy": self.account, "status": "in_progress" if pending else "completed",
                "localContextsTotal": len(contexts) if pending else None, "localContextsSwapped": 0 if pending else None,
                "localContextsFailed": 0 if pending else None, "completedAt": None, "pendingReads": pending}
            record = group["upgrade"]
        if self.legacy_lifecycle:
            return {"data": {"groupId": group["id"], "status": record["status"],
                             "total": record["localContextsTotal"], "completed": record["localContextsSwapped"],
                             "failed": record["localContextsFailed"]}}
        return {"data": {"groupId": group["id"], "status": record["status"],
                         "localContextsTotal": record["localContextsTotal"],
                         "localContextsSwapped": record["localContextsSwapped"],
                         "localContextsFailed": record["localContextsFailed"]}}

    def _h_upgrade_status(self, request):
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            record = group["upgrade"]
            if record is None:
                return {"data": None}
            answer = self._upgrade_view(record)
            if record["status"] == "in_progress":
                record["pendingReads"] -= 1
                if record["pendingReads"] <= 0:   # the next read finds it done
                    record.update(status="completed", localContextsTotal=None, localContextsSwapped=None,
                                  localContextsFailed=None, completedAt=int(time.time() * 1000))
        return {"data": answer}

    @staticmethod
    def _upgrade_view(record: Dict[str, Any]) -> Dict[str, Any]:
        return {key: value for key, value in record.items() if key != "pendingReads"}

    @staticmethod
    def _member_problem(member: Any) -> Optional[str]:
        """serde's part of an entry: both fields, a 64-hex account or key (§0.5.7), a known role."""
        if not isinstance(member, dict) or "identity" not in member or "role" not in member:
            return "Invalid JSON data: missing field `identity` or `role`"
        identity = member["identity"]
        if not isinstance(identity, str) or not HEX64.match(identity):
            return "Invalid JSON data: invalid member identity: expected 64 hex characters"
        if member["role"] not in ROLES:
            return "Invalid JSON data: unknown variant `{}`, expected {}".format(member["role"], serde_one_of(ROLES))
        return None

    def _h_set_visibility(self, request):
        visibility = request.json.get("subgroupVisibility")
        if visibility not in ("open", "restricted"):
            raise error_reply(400, VISIBILITY_ERROR)
        with self._lock:
            group = self._group_or_404(request.params["group_id"])
            self._require_admin(group)
            group["visibility"] = visibility
        return {}

    def _h_get_group_metadata(self, request):
        with self._lock:
            metadata = self._group_or_404(request.params["group_id"])["metadata"]
        return {"data": dict(metadata) if metadata is not None else None}

    def _h_set_group_metadata(self, request):
        body = request.json
        data = body.get("data", {})
        name = body.get("name")
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise error_reply(400, "Invalid JSON data: data must map strings to strings")
        if name is not None and not isinstance(name, str):
            raise error_reply(400, "Invalid JSON data: name: invalid type: expected a string")
        problem = metadata_problem(name, data)
        if problem:
            raise validation_reply([INVALID_FORMAT.format("metadata", problem)])
        with self._lock:   # PUT replaces the whole record, an absent name erasing it (core's apply path, §3.7)
            group = self._group_or_404(request.params["group_id"])
            self._require_admin(group)
            group["metadata"] = {
                "name": name, "data": dict(data), "updatedAt": int(time.time() * 1000), "updatedBy": self.public_key}
            group["name"] = name              # one record holds the name every listing reads (§0.7)
        return {}

    def _h_join_via_inheritance(self, request):
        group_id = request.params["group_id"]
        with self._lock:
            group = self._group_or_404(group_id)
            parent = self._groups.get(group["parent"]) if group["parent"] else None
            if self.account not in self._lineage(group)[-1]["members"]:
                raise error_reply(403, NO_NAMESPACE_IDENTITY)
            if group["visibility"] != "open" or parent is None or self.account not in parent["members"]:
                raise error_reply(403, NOT_ELIGIBLE)
            group["members"].setdefault(self.account, "Member")
        return {"data": {"groupId": group_id, "memberPublicKey": self.public_key, "wasInherited": True}}

    def _h_leave_group(self, request):
        group_id = request.params["group_id"]
        with self._lock:
            group = self._group_or_404(group_id)
            if group["parent"] is None:
                raise error_reply(400, LEAVE_NAMESPACE_AS_GROUP.format(group_id))
            self._refuse_last_admin(group)
            group["members"].pop(self.account, None)
        return {"data": {"groupId": group_id, "memberPublicKey": self.public_key}}

    # -- a Network's member (§0.8) -------------------------------------------------------------------------------

    def _namespace_of(self, group_id: Optional[str]) -> Optional[str]:
        group = self._groups.get(group_id) if group_id else None
        return self._lineage(group)[-1]["id"] if group is not None else None

    def governance(self, namespace_id: Optional[str] = None) -> Dict[tuple, Tuple[Any, Optional[str], int]]:
        """What this node holds of namespaces' governance as facts a peer merges one by one, each
        {key: (value, namespace, revision)}: a group exists (key (group, "exists")), each of its fields, each
        member's role (group, "member", account), each context registration (context, "registered")."""
        with self._lock:
            facts: Dict[tuple, Tuple[Any, Optional[str], int]] = {}
            for group_id, group in self._groups.items():
                namespace = self._namespace_of(group_id)
                if namespace_id is not None and namespace != namespace_id:
                    continue
                found = [((group_id, "exists"), namespace)]
                found += [((group_id, f), json.loads(json.dumps(v))) for f, v in group.items() if f != "members"]
                found += [((group_id, "member", a), role) for a, role in group["members"].items()]
                for key, value in found:
                    facts[key] = (value, namespace, self._gov_rev.get(key, 0))
            for context_id, registration in self._registrations().items():
                namespace = self._namespace_of(registration["groupId"])
                if namespace is not None and namespace_id in (None, namespace):
                    key = (context_id, "registered")
                    facts[key] = (registration, namespace, self._gov_rev.get(key, 0))
            return facts

    def _registrations(self) -> Dict[str, Dict[str, Any]]:
        """The contexts registered in this node's groups: the ones it holds and the ones governance told of."""
        registered = {k: dict(r) for k, r in self._registered.items()}
        for key, context in self._contexts.items():
            if context["groupId"] in self._groups:
                app = self._apps.get(context["applicationId"])
                registered[key] = {"applicationId": context["applicationId"], "groupId": context["groupId"],
                                   "serviceName": context["serviceName"], "name": context["name"],
                                   "bytecode": self._blob_ids(app)[0] if app else context.get("bytecode")}
        return registered

    def _take_governance(self, facts: Dict[tuple, Tuple[Any, Optional[str], int]], joining: str = "") -> None:
        """Merge a peer's facts: each replaces this node's own unless this node holds a newer revision of it.
        Only namespaces this node holds take part (`joining`: the one its join brings)."""
        with self._lock:
            held = {g["id"] for g in self._namespaces()} | {joining}
            ordered = sorted(facts.items(), key=lambda item: item[0][1:] != ("exists",))   # groups first
            for key, (value, namespace, revision) in ordered:
                if namespace not in held or revision < self._gov_rev.get(key, 0):
                    continue
                self._gov_rev[key] = revision
                self._apply_fact(key, value)

    def _apply_fact(self, key: tuple, value: Any) -> None:
        subject, kind = key[0], key[1]
        if kind == "registered":
            if value is GONE:
                self._registered.pop(subject, None)
            elif subject not in self._contexts:
                self._registered[subject] = dict(value)
            return
        if kind == "exists":
            if value is GONE:
                self._groups.pop(subject, None)
            else:
                self._groups.setdefault(subject, {"id": subject, "members": {}})
            return
        group = self._groups.get(subject)
        if group is None:
            return
        if kind == "member":
            if value is GONE:
                group["members"].pop(key[2], None)
            else:
                group["members"][key[2]] = value
        elif value is GONE:
            group.pop(kind, None)
        else:
            group[kind] = json.loads(json.dumps(value))

    def context_state(self, context_id: str) -> Optional[Dict[str, Any]]:
        """A replica's state as a peer would send it (None: not held here, or not initialized)."""
        with self._lock:
            context = self._contexts.get(context_id)
            if context is None or context["uninitialized"]:
                return None
            return {"kv": dict(context["kv"]), "seq": context["seq"], "heads": list(context["heads"])}

    def _take_context_state(self, context_id: str, state: Dict[str, Any]) -> bool:
        """A newer replica replaces this one; with reads_lag the hash moves at once and reads follow later."""
        with self._lock:
            context = self._contexts.get(context_id)
            if context is None or not (state["seq"] > context["seq"] or context["uninitialized"]):
                return False
            if self.reads_lag and not context["uninitialized"]:
                context["stale_kv"] = dict(context.get("stale_kv", context["kv"]))
                timer = threading.Timer(self.reads_lag, self._reads_catch_up, (context_id, state["seq"]))
                timer.daemon = True
                timer.start()
            context.update(kv=dict(state["kv"]), seq=state["seq"], heads=list(state["heads"]), uninitialized=False)
            return True

    def release_reads(self) -> None:
        """End reads_lag now: every replica's reads catch up with its hash."""
        with self._lock:
            for context in self._contexts.values():
                context.pop("stale_kv", None)

    def _reads_catch_up(self, context_id: str, seq: int) -> None:
        with self._lock:
            context = self._contexts.get(context_id)
            if context is not None and context["seq"] == seq:
                context.pop("stale_kv", None)

    def _replicated_marks(self) -> Tuple[Dict[tuple, Any], Dict[str, int]]:
        """What a request may change that peers replicate: governance facts, each context's state."""
        with self._lock:
            contexts = {k: -1 if c["uninitialized"] else c["seq"] for k, c in self._contexts.items()}
            return self.governance(), contexts

    def _join_replica(self, context_id: str) -> None:
        """§0.8: a join waits for the context's registration to arrive by governance, checks membership, and
        makes an empty replica the next sync fills (a node without the app still joins and converges)."""
        deadline = time.monotonic() + self.network.join_wait
        while True:
            with self._lock:
                if context_id in self._contexts:
                    return
                registration = self._registered.get(context_id)
                if registration is not None or time.monotonic() >= deadline:
                    break
            time.sleep(0.02)
        if registration is None:
            return                                        # the ordinary 404 follows
        with self._lock:
            group = self._groups.get(registration["groupId"])
            if group is None or self._role_in(group) is None:
                raise error_reply(403, NOT_A_MEMBER.format(registration["groupId"]))
            self._contexts[context_id] = {
                "id": context_id, "applicationId": registration["applicationId"], "groupId": registration["groupId"],
                "serviceName": registration["serviceName"], "name": registration["name"], "kv": {}, "seq": 0,
                "uninitialized": True, "heads": [], "replica": True, "bytecode": registration["bytecode"]}
            self._registered.pop(context_id, None)
        self.network.later(lambda: self.network.pull_context(self, context_id))

    def _network_join(self, namespace_id: str, inner: Dict[str, Any]) -> Dict[str, Any]:
        """A join fetches the namespace's bundle from a reachable member: none reachable is the 504; the key
        on its way (join_outcome "key_pending") records the membership and answers 503 (§0.8)."""
        with self.network.lock:
            salt = bytes(inner.get("secret_salt") or []).hex()
            entry = self._invitations.setdefault(salt, {"spent": False})
            if entry["spent"] or int(inner.get("expiration_timestamp") or 0) < time.time():
                raise error_reply(409, INVITATION_SPENT)
            bundle = self.network.fetch_governance(self, namespace_id)
            if not bundle or self.join_outcome == "no_peer":
                raise error_reply(504, JOIN_NO_PEER)
            if self.join_outcome == "not_endorsed":
                raise error_reply(503, JOIN_NOT_ENDORSED.format(namespace_id))
            entry["spent"] = True
        self._take_governance(bundle, joining=namespace_id)
        with self._lock:
            self._groups[namespace_id]["members"].setdefault(self.account, "Member")
        if self.join_outcome == "key_pending":
            raise error_reply(503, JOIN_KEY_PENDING.format(namespace_id))
        return {"data": {"namespaceId": namespace_id, "memberIdentity": self.public_key,
                         "memberAccount": self.account}}

    def authorizations(self) -> List[Optional[str]]:
        """Every Authorization header this node received, in order (None for a request without one)."""
        with self._lock:
            return [entry["headers"].get("authorization") for entry in self.log]

    # -- JSON-RPC (§4) -------------------------------------------------------------------------------------------

    def _h_jsonrpc(self, request):
        body = request.json
        if body.get("jsonrpc") != "2.0":
            raise text_reply(422, "Failed to deserialize the JSON body into the target type: jsonrpc: Invalid "
                             "JSON-RPC version")   # core's own Version visitor
        if "id" not in body:
            raise text_reply(422, "Failed to deserialize the JSON body into the target type: missing field `id`")
        request_id = body["id"]
        if not (request_id is None or isinstance(request_id, str)
                or (isinstance(request_id, int) and not isinstance(request_id, bool) and request_id >= 0)):
            raise text_reply(422, "Failed to deserialize the JSON body into the target type: id: data did not "
                             "match any variant of untagged enum RequestId")
        stray = next((key for key in body if key not in ("jsonrpc", "id") + RPC_PAYLOAD_FIELDS), None)
        if stray is not None:   # RequestPayload denies unknown fields beside method/params (§0.5.1)
            self._record_refusal(request, stray)
            outcome = rpc_error("ParseError", 'invalid value: string {}, expected "method" or "params"'.format(
                json.dumps(stray)))
        else:
            outcome = self._rpc_dispatch(body.get("method"), body.get("params"), request)
        return dict({"jsonrpc": "2.0", "id": request_id}, **outcome)   # always HTTP 200 (checklist 21)

    def _rpc_dispatch(self, method: Any, params: Any, request: Request) -> Dict[str, Any]:
        handlers = {"execute": self._rpc_execute, "sync_status": self._rpc_sync_status,
                    "set_ephemeral": self._rpc_set_ephemeral}
        if method not in handlers:
            return rpc_error("ParseError", "unknown variant `{}`, expected one of `execute`, `sync_status`, "
                             "`set_ephemeral`".format(method))
        if not isinstance(params, dict):
            return rpc_error("ParseError", "invalid type: expected struct ExecutionRequest")
        return handlers[method](params, request)

    def _rpc_sync_status(self, params, request):
        with self._lock:
            context = self._contexts.get(params.get("contextId"))
            if context is None:
                return {"error": {"type": "ContextNotFound"}}
            status = {"contextId": context["id"], "isInitialized": not context["uninitialized"],
                      "syncState": {"state": "idle"}, "failureCount": 0}
        if self.network is not None and self.network.peer_count(self) == 0:
            status.update(syncState={"state": "waitingForPeers"}, lastError="No peers to sync with")
        return {"result": status}

    def _rpc_set_ephemeral(self, params, request):
        return {"result": {}}

    def _rpc_execute(self, params: Dict[str, Any], request: Request) -> Dict[str, Any]:
        stray = next((key for key in params if key not in EXECUTE_FIELDS), None)
        if stray is not None:   # ExecutionRequest denies unknown fields (§0.5.1)
            self._record_refusal(request, "params." + stray)
            return rpc_error("ParseError", serde_unknown_field(stray, EXECUTE_FIELDS))
        for field in EXECUTE_FIELDS:
            if field not in params:
                return rpc_error("ParseError", "missing field `{}`".format(field))
        if normalise_hex64(params["contextId"]) is None:
            return rpc_error("ParseError", "invalid context id: expected 64 hex characters")
        if not isinstance(params["method"], str) or not params["method"]:
            return rpc_error("ParseError", "Field 'method' is required but was empty")
        context_id = normalise_hex64(params["contextId"])
        with self._lock:
            # the token's scope first, before anything is read on the call's behalf (§0.5.5)
            if self._auth is not None and not may_execute(self._auth.grants(request.bearer_token()), context_id,
                                                          params["method"]):
                return rpc_error("FunctionCallError", NO_EXECUTE_GRANT)
            refusal = self._execute_refusal(context_id)
            if refusal is not None:
                return refusal
            self.executions.append({"contextId": context_id, "method": params["method"],
                                    "argsJson": params["argsJson"]})
            self._inflight += 1
            self.max_inflight = max(self.max_inflight, self._inflight)
        try:
            if self.exec_delay:
                self._hold(self.exec_delay)   # outside the lock, so concurrent calls overlap
            with self._lock:
                outcome = self._execute_in_app(self._contexts.get(context_id), params["method"], params["argsJson"])
            self._sse_flush()      # the StateMutation is out before the answer (§0.9)
            return outcome
        finally:
            with self._lock:
                self._inflight -= 1

    def _hold(self, seconds: float) -> None:
        """exec_delay: sleep `seconds`, or less if release() is called meanwhile."""
        deadline = time.monotonic() + seconds
        with self._held:
            releases = self._releases
            while self._releases == releases and time.monotonic() < deadline:
                self._held.wait(deadline - time.monotonic())

    def release(self) -> None:
        """End every exec_delay now running: the calls it holds are answered at once."""
        with self._held:
            self._releases += 1
            self._held.notify_all()

    def unanswered(self, method: Optional[str] = None, path_prefix: Optional[str] = None) -> List[Dict[str, Any]]:
        """The logged requests (as requests_to) whose answer is not written out yet."""
        with self._lock:
            return [entry for entry in self.requests_to(method, path_prefix) if not entry.get("answered")]

    def _execute_refusal(self, context_id: str) -> Optional[Dict[str, Any]]:
        """Errors the node returns before the app is reached (§4.2)."""
        context = self._contexts.get(context_id)
        if context is None:
            return {"error": {"type": "ContextNotFound"}}
        if context["groupId"] is not None and context["groupId"] not in self._groups:
            # a context stranded by deleting its namespace stays uncallable (tools.md delete_namespace)
            return {"error": {"type": "InternalError", "data": {"kind": "Group"}}}
        if context["uninitialized"]:
            return {"error": {"type": "Uninitialized"}}
        if context["applicationId"] not in self._apps and context.get("replica"):
            # joined from a peer, which never serves bytecode (core#3652): the state converged, the blob is absent
            return rpc_error("InternalError", {"kind": "Runtime", "message": BLOB_MISSING.format(context["bytecode"])})
        if context["applicationId"] not in self._apps:
            return {"error": {"type": "ApplicationNotInstalled",
                              "data": {"application_id": context["applicationId"]}}}
        return None

    def _execute_in_app(self, context: Optional[Dict[str, Any]], method_name: str, args: Any) -> Dict[str, Any]:
        if context is None:   # deleted while the call slept
            return {"error": {"type": "ContextNotFound"}}
        record = self._apps[context["applicationId"]]
        manifest = self._manifest_for(record, context["serviceName"]) or {}
        method = find_method(manifest, method_name)
        if method is None:
            return rpc_error("FunctionCallError", 'method "{}" not found'.format(method_name))
        # Execute upgrades a lagging context before it runs (§0.7): it then runs its app's version. A context that
        # never lagged keeps no key, so a [view] call leaves the record as it was.
        context.pop("version", None)
        store = dict(context.get("stale_kv", context["kv"]))   # reads_lag: the hash moved, reads not yet
        before = dict(store)
        try:
            output = run_guest(record["behaviour"], manifest, method, args, store)
        except GuestPanic as panic:
            return rpc_error("FunctionCallError", "guest panicked: {}".format(panic))
        except AppError as error:
            return rpc_error("FunctionCallError", app_error_text(error.value))
        if not is_read_only(method):
            if self._writes_refused(context, record, store):
                return {"error": {"type": "ReadOnlyWriteRefused", "data": {"context_id": context["id"]}}}
            self._commit(context, store)
            emitted = app_events(manifest, method_name, before, store) if record["behaviour"] == "kv" else []
            if store != before or emitted or record["behaviour"] != "kv":
                self.sse_mutation(context["id"], emitted)
        return {"result": {"output": output}}

    def _writes_refused(self, context: Dict[str, Any], record: Dict[str, Any], store: Dict[str, Any]) -> bool:
        """A node whose role in the context's group only reads discards a call's writes and refuses the call
        (§0.5.5); a kv call that changed nothing wrote nothing."""
        group = self._groups.get(context["groupId"])
        if group is None or self._role_in(group) not in READ_ONLY_ROLES:
            return False
        return store != context["kv"] if record["behaviour"] == "kv" else True

    @staticmethod
    def _commit(context: Dict[str, Any], store: Dict[str, Any]) -> None:
        """A write moves the state hash and leaves a single new DAG head."""
        context.pop("stale_kv", None)
        context["kv"] = store
        context["seq"] += 1
        context["heads"] = [hex_id("head:{}:{}".format(context["id"], context["seq"]))]

    # -- events over SSE (§0.9) ---------------------------------------------------------------------------------
    # sse_mode: "on", "off" (SSE switched off in config: 404) or "forbidden" (the token lacks context:subscribe:
    # 403). sse_hidden: contexts a subscription drops silently (the caller may not observe them). sse_log: every
    # /sse request (kept out of `log`). Test helpers: sse_event (a peer's frame), sse_mutation (a StateMutation,
    # times=2 for the author's echo), silent_change (the hash moves, no frame), sse_disconnect, sse_stall,
    # sse_flood. sse_keepalive: seconds between `:` comments (15 on core).
    # Odd streams, off unless a test asks (core never does these): sse_close_after_connect (each stream ends right
    # after its connect frame), sse_connect_id (the connect frame's `id` instead of `<sid>-0`), sse_chunked=False
    # (no chunked framing: `Connection: close`, the body runs until the stream ends), sse_subscription_body (the raw
    # bytes a 200 to every subscription POST carries: a huge or odd answer).

    def _init_sse(self) -> None:
        self.sse_mode = "on"
        self.sse_hidden: Set[str] = set()
        self.sse_log: List[Dict[str, Any]] = []
        self.sse_keepalive = 15.0
        self.sse_close_after_connect = False
        self.sse_connect_id: Optional[str] = None
        self.sse_chunked = True
        self.sse_subscription_body: Optional[bytes] = None
        self._sse_cond = threading.Condition()
        self._sse_sessions: Dict[str, Dict[str, Any]] = {}
        self._sse_ids = iter(range(7000001, 1 << 62))
        self._sse_stalled_until = 0.0

    def _serve_sse(self, handler: _Handler, request: Request) -> None:
        with self._lock:
            self.sse_log.append({"method": request.method, "path": request.path, "query": dict(request.query),
                                 "headers": dict(request.headers), "at": time.monotonic()})
            refusal = self._auth.guard(request.bearer_token(), "context:subscribe") if self._auth else None
        self._wait_if_slow(request.path)            # `slow` holds SSE routes too (a subscription slow to answer)
        if refusal is None and self.sse_mode != "on":
            refusal = empty_reply(404) if self.sse_mode == "off" else error_reply(403, "Forbidden")
        if refusal is not None:
            handler.send(refusal)
            return
        if request.method == "GET" and request.path == "/sse":
            self._sse_stream(handler, request)
        elif request.method == "POST" and request.path == "/sse/subscription":
            odd = self.sse_subscription_body
            handler.send(self._sse_subscription(request) if odd is None else Reply(200, odd, JSON_TYPE))
        elif request.method == "GET" and request.path.startswith("/sse/session/"):
            with self._sse_cond:
                session = self._sse_sessions.get(request.path.rsplit("/", 1)[1])
                answer = None if session is None else {"contexts": sorted(session["contexts"]), "counter": session["n"]}
            handler.send(empty_reply(404) if answer is None else json_reply(200, answer))
        else:
            handler.send(empty_reply(405))

    def _sse_subscription(self, request: Request) -> Reply:
        ok, body = parse_json_body(request.body)
        if not ok or not isinstance(body, dict) or body.get("method") not in ("subscribe", "unsubscribe"):
            return json_reply(400, {"error": "ParseError"})
        sid = body.get("id")
        if not isinstance(sid, str) or not sid.isdigit():
            return json_reply(400, {"error": "Invalid Session Id"})
        params = body.get("params") if isinstance(body.get("params"), dict) else {}
        asked = [c for c in params.get("contextIds") or [] if isinstance(c, str)]
        with self._lock:
            visible = [c for c in asked if c in self._contexts and c not in self.sse_hidden]
        with self._sse_cond:
            session = self._sse_sessions.get(sid)
            if session is None:
                return json_reply(404, {"error": "Session not found. Please reconnect to SSE endpoint first."})
            if body["method"] == "subscribe":
                session["contexts"].update(visible)
                return json_reply(200, {"result": {"status": "subscribed", "contexts": visible, "groups": []}})
            gone = [c for c in asked if c in session["contexts"]]
            session["contexts"].difference_update(asked)
            return json_reply(200, {"result": {"status": "unsubscribed", "unsubscribed": gone, "requested": asked}})

    def _sse_stream(self, handler: _Handler, request: Request) -> None:
        last = request.headers.get("last-event-id") or ""
        with self._sse_cond:
            sid = last.split("-", 1)[0]
            resumed = sid in self._sse_sessions
            if not resumed:
                sid = str(next(self._sse_ids))
                self._sse_sessions[sid] = {"contexts": set(), "n": 0, "written": 0, "queue": [], "live": None}
            session = self._sse_sessions[sid]
            mine = object()
            session.update(live=mine, queue=[], written=session["n"])   # what came while away is lost
        handler.close_connection = True
        handler.send_response(200)
        chunked, first_id = self.sse_chunked, self.sse_connect_id or "%s-0" % sid
        for name, value in (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                            ("X-SSE-Session-ID", sid), ("X-SSE-Reconnect", "true" if resumed else "false"),
                            ("Transfer-Encoding", "chunked") if chunked else ("Connection", "close")):
            handler.send_header(name, value)
        handler.end_headers()
        hello = {"type": "connect", "session_id": sid, "reconnect": resumed}
        try:
            self._sse_write(handler, "event: message\nid: %s\nretry: 3000\ndata: %s\n\n"
                            % (first_id, compact_json(hello)), chunked)
            quiet_since = time.monotonic()
            while self._server is not None and not self.sse_close_after_connect:
                with self._sse_cond:
                    if session["live"] is not mine:
                        break
                    if not session["queue"] or time.monotonic() < self._sse_stalled_until:
                        self._sse_cond.wait(0.05)
                    if session["live"] is not mine:
                        break
                    frames = [] if time.monotonic() < self._sse_stalled_until else session["queue"]
                    if frames:
                        session["queue"] = []
                if frames:
                    self._sse_write(handler, "".join(text for text, _ in frames), chunked)
                    with self._sse_cond:
                        session["written"] = max(session["written"], frames[-1][1])
                        self._sse_cond.notify_all()
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= self.sse_keepalive and \
                        time.monotonic() >= self._sse_stalled_until:
                    self._sse_write(handler, ":\n\n", chunked)
                    quiet_since = time.monotonic()
        except OSError:
            pass
        finally:
            with self._sse_cond:
                if session["live"] is mine:
                    session["live"] = None
                self._sse_cond.notify_all()
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _sse_write(handler: _Handler, text: str, chunked: bool = True) -> None:
        data = text.encode("utf-8")
        handler.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n" if chunked else data)
        handler.wfile.flush()

    def sse_event(self, context_id: str, kind: str, data: Any) -> None:
        """One context event to every live session subscribed to it (a session away loses it, §0.9)."""
        event = {"contextId": context_id, "type": kind, "data": data}
        with self._sse_cond:
            for sid, session in self._sse_sessions.items():
                if session["live"] is not None and context_id in session["contexts"]:
                    session["n"] += 1
                    session["queue"].append(("event: message\nid: %s-%d\ndata: %s\n\n" % (
                        sid, session["n"], compact_json({"result": event})), session["n"]))
            self._sse_cond.notify_all()

    def sse_mutation(self, context_id: str, events: List[Tuple[str, Any]], new_root: Optional[str] = None,
                     times: int = 1) -> None:
        """A StateMutation carrying app events [(kind, payload)], each payload's JSON as a byte array."""
        if new_root is None:
            with self._lock:
                context = self._contexts.get(context_id)
                new_root = self._state_hash(context) if context else hex_id("root:" + str(time.monotonic()))
        items = [{"kind": kind, "data": [] if payload is None else list(compact_json(payload).encode("utf-8")),
                  "handler": None} for kind, payload in events]
        for _ in range(times):
            self.sse_event(context_id, "StateMutation", {"newRoot": new_root, "events": items})

    def silent_change(self, context_id: str) -> None:
        """A peer's write that emitted nothing: the state hash moves, and no frame is raised (§0.9)."""
        with self._lock:
            context = self._contexts[context_id]
            self._commit(context, dict(context["kv"], **{"peer-%d" % context["seq"]: "written by a peer"}))

    def sse_disconnect(self) -> None:
        """Every live stream ends at once (the node restarted, a proxy cut it)."""
        with self._sse_cond:
            for session in self._sse_sessions.values():
                session["live"] = None
            self._sse_cond.notify_all()

    def sse_stall(self, seconds: float) -> None:
        """Nothing, not even a keep-alive, goes out on any stream for `seconds` (the connection stays open)."""
        with self._sse_cond:
            self._sse_stalled_until = time.monotonic() + seconds

    def sse_flood(self, context_id: str, count: int, kind: str = "Inserted") -> None:
        for index in range(count):
            self.sse_mutation(context_id, [(kind, {"key": "flood-%d" % index, "value": "x"})],
                              new_root=hex_id("flood:%d" % index))

    def sse_sessions(self) -> Dict[str, Set[str]]:
        with self._sse_cond:
            return {sid: set(session["contexts"]) for sid, session in self._sse_sessions.items()}

    def _sse_flush(self, timeout: float = 2.0) -> None:
        """Wait until every live stream has written what was published so far."""
        deadline = time.monotonic() + timeout
        with self._sse_cond:
            while any(s["live"] is not None and s["written"] < s["n"] for s in self._sse_sessions.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._sse_cond.wait(left)

    # -- embedded auth (§2) ------------------------------------------------------------------------------------

    def _h_auth_token(self, request):
        body = request.json
        absent = missing_field(body, ("auth_method", "public_key", "client_name", "timestamp", "provider_data"))
        if absent:
            return json_reply(400, {"error": "Invalid JSON: missing field `{}`".format(absent), "status": 400})
        if body["auth_method"] not in ("user_password", "username_password"):
            return auth_failure(400, "Unsupported authentication method: {}".format(body["auth_method"]))
        provider = body["provider_data"] if isinstance(body["provider_data"], dict) else {}
        username, password = provider.get("username"), provider.get("password")
        limiter_key = (str(body["auth_method"]), str(body["public_key"]))
        with self._lock:
            if self._auth.throttled(limiter_key):   # §0.5.6: before any credential work
                return auth_failure(429, LOGIN_THROTTLED, {"Retry-After": str(RETRY_AFTER_SECONDS)})
            if username not in self._auth.users or self._auth.users[username] != password:
                self._auth.failed_login(limiter_key)
                return auth_failure(401, "Authentication failed: invalid username or password")
            pair = self._auth.mint_pair(hex_id("root-key:" + username), ["admin"], uuid.uuid4().hex,
                                        str(body["client_name"]))
        return auth_success(pair)

    def _h_auth_refresh(self, request):
        body = request.json
        with self._lock:
            self.refresh_count += 1
            absent = missing_field(body, ("access_token", "refresh_token"))
            if absent:
                return json_reply(400, {"error": "Invalid JSON: missing field `{}`".format(absent), "status": 400})
            return self._refresh(str(body["access_token"]), str(body["refresh_token"]))

    def _refresh(self, access_token: str, refresh_token: str):
        auth = self._auth
        access, refresh = auth.decode(access_token), auth.decode(refresh_token)
        if access is None or access.get("token_type") != "access":
            return auth_failure(401, "Invalid access token")
        if refresh is None or refresh.get("token_type") != "refresh":
            return auth_failure(401, "Invalid refresh token")
        if not auth.is_expired(access):
            return auth_failure(401, "Access token still valid")   # §2.3: refresh only after expiry
        if access["sub"] != refresh["sub"]:
            return auth_failure(401, REFRESH_MISMATCH)
        family = auth.family_of(refresh)
        if auth.tokens[refresh["jti"]]["used"]:
            auth.revoked_families.add(family)   # replay revokes the whole family (§2.3)
            return auth_failure(401, "Refresh token reuse detected; re-authentication required",
                                {"X-Auth-Error": "token_reuse"})
        if family in auth.revoked_families:
            return auth_failure(401, "Token has been revoked", {"X-Auth-Error": "token_revoked"})
        auth.tokens[refresh["jti"]]["used"] = True
        # root keys keep their id; a client key's id rotates on refresh (§2.3)
        subject = refresh["sub"] if not refresh["sub"].startswith("client-") else "client-" + uuid.uuid4().hex
        return auth_success(auth.mint_pair(subject, refresh.get("permissions") or [], family,
                                           refresh.get("node_url", "")))

    def _h_auth_logout(self, request):
        """POST /auth/logout {refresh_token} (§0.5.6): the token's family is revoked."""
        token = request.json.get("refresh_token")
        with self._lock:
            claims = self._auth.decode(token) if isinstance(token, str) else None
            if claims is None or claims.get("token_type") != "refresh":
                return auth_failure(401, "Invalid refresh token")
            self._auth.revoked_families.add(self._auth.family_of(claims))
        return {"data": {"success": True}, "error": None}

    def _h_auth_health(self, request):
        return {"data": {"status": "alive", "storage": True, "uptime_seconds": 1}, "error": None}

    def _h_auth_providers(self, request):
        provider = {"name": "user_password", "type": "credentials",
                    "description": "Authenticates users with username and password credentials",
                    "configured": bool(self._auth.users),
                    "config": {"enabled": True, "description": "Username and password authentication"}}
        return {"data": {"providers": [provider], "count": 1}, "error": None}

    def _h_auth_identity(self, request):
        return {"data": {"service": "calimero-auth", "version": "0.11.0-rc.83", "authentication_mode": "forward",
                         "providers": ["user_password"]}, "error": None}

    def _h_client_key(self, request):
        """POST /admin/client-key: the desktop's "Connect AI agent" mint (§2.4)."""
        permissions = request.json.get("permissions") or ["admin"]
        if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
            return json_reply(400, {"error": "Invalid JSON: permissions must be a list of strings", "status": 400})
        with self._lock:
            pair = self._auth.mint_pair("client-" + uuid.uuid4().hex, permissions, uuid.uuid4().hex,
                                        str(request.json.get("target_node_url") or ""))
        return auth_success(pair)


# ---------------------------------------------------------------------------------------------------------------
# A network of doubles (§0.8): several nodes, each its own server, identity, auth, apps and replicas
# ---------------------------------------------------------------------------------------------------------------

class Network:
    """Named NodeDoubles that replicate like connected merods, for the cross-node flow of node-api.md §0.8.

        with Network() as net:
            a = net.add("node1", apps=[kv_store_spec()]); b = net.add("node2")
            ...   # a.url, b.url; every NodeDouble switch still works on each node

    Each node is a NodeDouble(name=...): its own HTTP server, account / device / public key / peer id (so a member
    identity tells which node it came from), auth (its own signing secret: a token one node minted is refused by
    another; `node.authorizations()` lists every Authorization header it got), installed apps and replicas.

    What replicates, `gossip_delay` seconds (default 0.1) after the request that changed it, to every connected
    running node that holds it: a namespace's governance (groups, members, roles, metadata, names, context
    registrations; the newest revision wins whole) and a context's state (kv, seq, DAG heads; the higher seq wins,
    so equal hashes follow). Invitations are one table for the whole network: spent once, valid on any node.
      POST /contexts/:id/join  waits up to `join_wait` (default 2 s) for the registration, needs membership, and
                         makes an uninitialized replica that fills one gossip delay later (without the app too)
      POST /contexts/sync/:id  pulls the newest replica from connected peers at once
      POST /namespaces/:ns/join  takes the bundle from a connected running member: none is the 504 text
      GET /peers         connected running nodes;  GET /network/status  `localPeerId`
      sync_status        waitingForPeers with lastError "No peers to sync with" when the node has no peers
    Switches:
      connected=False (or disconnect(a, b) / connect(a, b))  not connected: peers 0, joins 504, nothing gossips
      stop(name) / start(name)   a node down, then back (same port; it catches up from its peers on start)
      an app not installed on the joiner: it joins and converges, and its execute answers InternalError
                         "bytecode blob … not found in blobstore"
      settle()           wait for the gossip on its way (before changing gossip_delay mid-test)
      node.reads_lag = seconds   replicated writes move the hash at once, reads see them that much later
                         (or when node.release_reads() is called)
      node.join_outcome = "key_pending"   the join records the membership and answers 503 (key on its way);
                         "not_endorsed": 503 with nothing recorded; "no_peer": 504
    """

    def __init__(self, gossip_delay: float = 0.1, connected: bool = True, join_wait: float = 2.0):
        self.gossip_delay = float(gossip_delay)
        self.join_wait = float(join_wait)
        self.connected_by_default = connected
        self.nodes: Dict[str, NodeDouble] = {}
        self.lock = threading.RLock()                 # invitations and revisions; never held while gossip applies
        self.invitations: Dict[str, Dict[str, Any]] = {}
        self._links: Set[frozenset] = set()
        self._cut: Set[frozenset] = set()
        self._revision = 0
        self._timers: List[threading.Timer] = []      # gossip on its way, cancelled when the network ends

    def add(self, name: str, **options) -> NodeDouble:
        """A new named node, started (options are NodeDouble's)."""
        if name in self.nodes:
            raise ValueError("duplicate node name " + name)
        node = NodeDouble(name=name, **options)
        node.network = self
        node._invitations = self.invitations
        self.nodes[name] = node
        return node.start()

    def __getitem__(self, name: str) -> NodeDouble:
        return self.nodes[name]

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc_info) -> None:
        with self.lock:
            for timer in self._timers:
                timer.cancel()
        for node in self.nodes.values():
            node.stop()

    # -- connectivity ----------------------------------------------------------------------------------------

    def connect(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        self._cut.discard(pair)
        self._links.add(pair)

    def disconnect(self, a: str, b: str) -> None:
        pair = frozenset((a, b))
        self._links.discard(pair)
        self._cut.add(pair)

    def linked(self, a: NodeDouble, b: NodeDouble) -> bool:
        pair = frozenset((a.name, b.name))
        return a is not b and pair not in self._cut and (self.connected_by_default or pair in self._links)

    def peers_of(self, node: NodeDouble) -> List[NodeDouble]:
        """The running nodes this one is connected to (none while it is down itself)."""
        if not node.running:
            return []
        return [other for other in self.nodes.values() if other.running and self.linked(node, other)]

    def peer_count(self, node: NodeDouble) -> int:
        return len(self.peers_of(node))

    def stop(self, name: str) -> None:
        self.nodes[name].stop()

    def start(self, name: str) -> None:
        """Back up on its port, then catch up (the periodic sync a restarted node runs)."""
        node = self.nodes[name].start()
        with node._lock:
            namespaces, contexts = [g["id"] for g in node._namespaces()], list(node._contexts)
        for namespace_id in namespaces:
            node._take_governance(self.fetch_governance(node, namespace_id))
        for context_id in contexts:
            self.pull_context(node, context_id)

    # -- replication -----------------------------------------------------------------------------------------

    def later(self, action: Callable[[], Any]) -> None:
        timer = threading.Timer(self.gossip_delay, action)
        timer.daemon = True
        with self.lock:
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the gossip on its way has landed. A delivery carries the source's state when it fires, so a
        test that changes the delay must settle first, or an earlier, shorter timer may carry a later write."""
        deadline = time.monotonic() + timeout
        with self.lock:
            pending = list(self._timers)
        for timer in pending:
            timer.join(max(0.0, deadline - time.monotonic()))

    def fetch_governance(self, node: NodeDouble, namespace_id: str) -> Dict[tuple, Tuple[Any, Optional[str], int]]:
        """The newest facts of a namespace among this node's peers (empty when no peer holds it)."""
        facts: Dict[tuple, Tuple[Any, Optional[str], int]] = {}
        for peer in self.peers_of(node):
            for key, fact in peer.governance(namespace_id).items():
                if key not in facts or fact[2] > facts[key][2]:
                    facts[key] = fact
        return facts

    def pull_context(self, node: NodeDouble, context_id: str) -> bool:
        """Take the newest state a peer holds of the context (what a sync does); True when it changed."""
        states = [s for s in (peer.context_state(context_id) for peer in self.peers_of(node)) if s is not None]
        return bool(states) and node._take_context_state(context_id, max(states, key=lambda s: s["seq"]))

    def _next_revision(self) -> int:
        with self.lock:
            self._revision += 1
            return self._revision

    def spread(self, node: NodeDouble, marks: Tuple[Dict[tuple, Any], Dict[str, int]]) -> None:
        """After a request on `node`: gossip what it changed (governance facts, context state) to its peers."""
        facts_before, contexts_before = marks
        facts_after, contexts_after = node._replicated_marks()
        changed = {}
        for key in set(facts_before) | set(facts_after):
            before, after = facts_before.get(key), facts_after.get(key)
            if (before[0] if before else GONE) != (after[0] if after else GONE):
                changed[key] = (after[0] if after else GONE, (after or before)[1])
        if changed:
            revision = self._next_revision()
            delta = {key: (value, namespace, revision) for key, (value, namespace) in changed.items()}
            with node._lock:
                node._gov_rev.update({key: revision for key in delta})
            self.later(lambda: self._deliver_governance(node, delta))
        for context_id, seq in contexts_after.items():
            if seq >= 0 and contexts_before.get(context_id, -1) != seq:
                self.later(lambda c=context_id: self._deliver_state(node, c))

    def _deliver_governance(self, source: NodeDouble, delta: Dict[tuple, Tuple[Any, Optional[str], int]]) -> None:
        for peer in self.peers_of(source):
            peer._take_governance(delta)

    def _deliver_state(self, source: NodeDouble, context_id: str) -> None:
        state = source.context_state(context_id) if source.running else None
        if state is not None:
            for peer in self.peers_of(source):
                peer._take_context_state(context_id, state)


GONE = object()   # a governance fact that was deleted (a group, a member, a field, a registration)


def peer_id_for(seed: str) -> str:
    """A libp2p-looking peer id (base58, "12D3KooW…"), fixed per seed."""
    alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
    number = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
    digits = []
    while number:
        number, rest = divmod(number, 58)
        digits.append(alphabet[rest])
    return "12D3KooW" + "".join(digits)[:44]


def spec_kwargs(spec: Dict[str, Any], renames: Dict[str, str]) -> Dict[str, Any]:
    return {renames.get(key, key): value for key, value in spec.items()}


def rpc_error(error_type: str, data: Any) -> Dict[str, Any]:
    """JSON-RPC errors are `{"type", "data"}`, never `{code, message}` (§4.2)."""
    return {"error": {"type": error_type, "data": data}}


# ---------------------------------------------------------------------------------------------------------------
# Sample data (`--sample` and sample_double())
# ---------------------------------------------------------------------------------------------------------------

MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"
SAMPLE_SIGNER = "did:key:z6MknF3p5L5FDHJQ7FREUapuX4Wmp4MtF6WrHYaXS2B3eZQd"
SAMPLE_ICON = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SAMPLE_GUIDE = """# KV Store

A replicated key-value store: every member of a context sees the same entries.

## Procedures

### Store a value
1. Call `set` with a `key` and a `value`.
2. Read it back with `get`.

### List everything
Call `entries` for the whole map, or `len` for the count.

### Remove a value
Call `remove` with the `key`; it returns the value it held.

## Notes

`get` answers null for a key that holds no value; `get_result` answers an error instead.
"""

COUNTER_MANIFEST = {
    "schema_version": "wasm-abi/1",
    "types": {},
    "methods": [
        {"name": "increment", "doc": "Adds `by` to the counter.",
         "params": [{"name": "by", "type": {"kind": "u32"}, "doc": "How much to add."}],
         "returns": {"kind": "u64"}, "returns_doc": "The counter after the addition.", "intent": "mutating"},
        {"name": "init", "params": [], "returns": {"kind": "unit"}},
        {"name": "value", "doc": "Reads the counter.", "params": [], "returns": {"kind": "u64"},
         "returns_doc": "The current count.", "intent": "read_only"},
    ],
    "events": [],
}


def kv_store_manifest() -> Dict[str, Any]:
    with open(MANIFEST_DIR / "kv-store.json", encoding="utf-8") as handle:
        return json.load(handle)


def kv_store_spec(version: str = "1.0.0") -> Dict[str, Any]:
    return {"package": "com.calimero.kv-store", "version": version, "signer_id": SAMPLE_SIGNER,
            "metadata": {"name": "KV Store", "description": "A replicated key-value store.",
                         "author": "Calimero", "guide": SAMPLE_GUIDE, "icon": SAMPLE_ICON},
            "abi": kv_store_manifest()}


def counter_spec() -> Dict[str, Any]:
    return {"package": "com.example.counter", "version": "0.1.0", "signer_id": SAMPLE_SIGNER,
            "metadata": {"name": "Counter", "description": "A shared counter."}, "abi": COUNTER_MANIFEST,
            "behaviour": "counter"}


def sample_double(**kw) -> NodeDouble:
    """The kv-store app (with a guide) in one namespace with one context aliased `demo`, plus a small
    counter app without a guide. Keyword arguments go to NodeDouble (auth=…, port=…, exec_delay=…)."""
    double = NodeDouble(apps=[kv_store_spec(), counter_spec()], **kw)
    kv_id = double._app_key("com.calimero.kv-store")
    namespace_id = double.add_namespace(kv_id, name="demo-team")
    context_id = double.add_context(kv_id, group_id=namespace_id, name="demo")
    double.add_alias("demo", context_id)
    return double


DEMO_AUTH = {"users": {"admin": "dev-password"}}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="A fake merod for mero-mcp tests and demos.")
    parser.add_argument("--sample", action="store_true", help="load the sample apps, namespace and context")
    parser.add_argument("--port", type=int, default=0, help="port to bind on 127.0.0.1 (default: a free one)")
    parser.add_argument("--auth", action="store_true", help="embedded auth with admin / dev-password")
    args = parser.parse_args(argv)
    options: Dict[str, Any] = {"port": args.port}
    if args.auth:
        options["auth"] = DEMO_AUTH
    double = sample_double(**options) if args.sample else NodeDouble(**options)
    stopping = threading.Event()          # handlers first: a SIGTERM right after READY must stop it quietly
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    double.start()
    print("READY {}".format(double.url), flush=True)
    while not stopping.wait(0.2):
        pass
    double.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
