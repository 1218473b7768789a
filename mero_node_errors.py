"""The errors every node module raises (`NodeError` and its kinds), and the secrets no text of ours may show:
every token, password and URL userinfo this process sends is recorded here and taken out of every text.

The lowest of node.py's siblings: it imports none of ours."""
from __future__ import annotations

import base64
import functools
import json
import os
import re
import threading
from typing import Optional

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"

# hashlib, socket and concurrent.futures are imported where used: the server reads the node directory before it
# answers initialize, and what that needs should load alone (requests brings the rest with the first request).

LOG_LEVEL_VARIABLE = "CALIMERO_MCP_LOG_LEVEL"
LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}      # logging's numbers, without importing it


def log_threshold(env) -> tuple:
    """(the level CALIMERO_MCP_LOG_LEVEL (or --log-level) sets, what is wrong with its value or None): info unless
    set; a value that is no level is said once on stderr, and info is used."""
    raw = (env.get(LOG_LEVEL_VARIABLE) or "").strip()
    if not raw or raw.lower() in LOG_LEVELS:
        return LOG_LEVELS[raw.lower() or "info"], None
    return LOG_LEVELS["info"], "%s=%s is none of %s, so info is used" % (
        LOG_LEVEL_VARIABLE, json.dumps(raw[:40]), ", ".join(LOG_LEVELS))


class _Log:
    """The "mero-mcp" logger, set up on first use: `logging` costs more to import than the rest of what the node
    directory needs, and the server answers initialize before the node side logs a line."""

    def __getattr__(self, name):
        return getattr(_logger(), name)


log = _Log()
_logger_lock = threading.Lock()
_logger_ready = []


def _logger():
    import logging
    logger = logging.getLogger("mero-mcp")
    if not _logger_ready:
        with _logger_lock:
            if not _logger_ready:
                if not logger.handlers:      # the server's own stderr lines and these share one format
                    stderr = logging.StreamHandler()
                    stderr.setFormatter(logging.Formatter("[mero-mcp] %(message)s"))
                    logger.addHandler(stderr)
                    logger.setLevel(log_threshold(os.environ)[0])
                logger.addFilter(_redacting)   # every line passes `redacted`: the secrets this process has sent
                _logger_ready.append(True)
    return logger


def _redacting(record):
    record.msg, record.args = redacted(record.getMessage()), ()
    return True


# ── NodeError and its kinds ───────────────────────────────────────────────────────────────────────

class NodeError(Exception):
    """A node failure; `str()` is what a person should read. Never carries a token or password.

    `status` is the HTTP status of a `Refused` (None for every other kind); `retryable` says the same
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


# The kinds, named by what a caller decides; every instance keeps `status`, `retryable`, `fix`, `auth_error` and
# `hint`, and its text is the same whichever kind it is:
#
#   NodeError                   (also: configuration, discovery's settings, JSON-RPC and event-stream failures)
#   ├── NotSent                 nothing reached the node: BodyTooDeep, CancelledBeforeSent
#   ├── Unreachable             no node answered: repair the url or start the node, then the same call may work
#   ├── NoAnswer                it went out and no whole answer came back: a change may have been carried out
#   ├── AnswerTooLarge          an answer past the size cap: ask for less, or raise the cap
#   ├── UnexpectedAnswer        a 2xx of the wrong shape or not JSON: not the node's API (NestedTooDeep)
#   └── Refused                 the node answered with a non-2xx status, `status` always set (`refused`)
#       ├── BadRequest          400, 422: it cannot take the request as sent
#       ├── Unauthorized        401: the token or credentials are not accepted: sign in again
#       ├── Forbidden           403: not for this node or token (the auth guard's when `auth_error` is set)
#       ├── NotFound            404: no such thing here
#       └── ServerError         5xx: a failure inside the node (503 and 504 `retryable`)
#           └── NotPublished    an install's 502: the node's registry has no such release

class NotSent(NodeError):
    """A request that never left: nothing of it reached the node (`BodyTooDeep`, `CancelledBeforeSent`)."""


class BodyTooDeep(NotSent):
    """A body nested too deeply to encode (more levels than Python's JSON encoder allows)."""


class CancelledBeforeSent(NotSent):
    """A change the call's client cancelled before it left: it is never sent (the call's scope, `scope`)."""


class UnexpectedAnswer(NodeError):
    """A 2xx answer of the wrong shape or not JSON (a proxy's page, another server, a broken release). A NodeError
    like any other; `check` tells it apart to say the server at the url is not a Calimero node."""


class Unreachable(NodeError):
    """No node answered: the connection was refused, the host is unknown, TLS failed, the url is not valid, or the
    deadline passed before an answer to a read or to a request that never left (`network_error`, `late`); also
    discovery finding no node, and a registry that cannot be reached. Nothing was changed: once the node is up
    (or the url is right) the same call may work."""


class NoAnswer(NodeError):
    """The request went out and no whole answer came back: a change that got none in time or lost its connection
    (`no_answer`: the node may have carried it out, so check before repeating it), or a connection closed
    mid-answer (`cut_off`)."""


class AnswerTooLarge(NodeError):
    """An answer past the size cap (CALIMERO_MCP_MAX_RESPONSE_BYTES), refused unread (`too_large`), or a blob whose
    size says it would be: ask for less, or raise the cap."""


class Refused(NodeError):
    """The node (or the registry, or its auth service) answered with a non-2xx status, always in `status`; its
    own words are the text when it gave any. Built by `refused`, which picks the kind below for the status; a
    status no kind names (405, 409, 413, 429, ...) is a plain Refused."""


class BadRequest(Refused):
    """400 or 422: the node cannot take the request as sent (a malformed id, a field it does not know or misses;
    422 is the rejection of a JSON body of the wrong shape, which a GET or HEAD never gets)."""


class Unauthorized(Refused):
    """401: the node does not accept this session's token or credentials (expired past renewal, unknown, none
    sent, a failed login): sign in again."""


class Forbidden(Refused):
    """403: not for this node or token. With `auth_error` set it is the auth guard's (a revoked token, a
    permission the token lacks); without, the node's own refusal (not a member, not an admin, a blob in use), and
    its text says why. A group read answered 403 is there, but not shown to this node."""


class NotFound(Refused):
    """404: no such thing on this node (an application, a context, a blob, a route an older node lacks)."""


class ServerError(Refused):
    """5xx: a failure inside the node; 503 ("not yet") and 504 (no peer answered) are `retryable`."""


class NotPublished(ServerError):
    """An install's 502 "the configured Http source has no application published at <package>@<version>"
    (node-api §0.5.3): the node's registry has no such release. An answer, not a fault: a retry gets the same."""


_REFUSED = {400: BadRequest, 422: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound}


def refused(message, status: int, retryable=False, fix=None, auth_error=None, hint=None) -> Refused:
    """The Refused of the kind `status` names, with its status kept."""
    kind = _REFUSED.get(status) or (ServerError if 500 <= status < 600 else Refused)
    return kind(message, status, retryable, fix=fix, auth_error=auth_error, hint=hint)


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


def kept_secret(value) -> None:
    """Record a secret that is read, not sent (a minted invitation's `inviter_signature` and `secret_salt`, which
    are the bearer capability): a string as `sent_secret` does; a byte array (a list of ints) in every form a text
    may quote it, the list with any spacing, its hex in either case and its base64."""
    if isinstance(value, str):
        sent_secret(value)
        return
    if not (isinstance(value, list) and len(value) >= MIN_SECRET
            and all(type(b) is int and 0 <= b <= 255 for b in value)):
        return
    raw = bytes(value)
    forms = [r"\[?\s*" + r"\s*,\s*".join(str(b) for b in value) + r"\s*\]?", "(?i:%s)" % raw.hex()]
    forms += sorted({re.escape(form.decode("ascii").rstrip("=")) for form in (base64.b64encode(raw),
                                                                             base64.urlsafe_b64encode(raw))})
    with _sent_lock:
        _sent_secrets.setdefault("bytes:" + raw.hex(), re.compile("|".join(forms)))


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
