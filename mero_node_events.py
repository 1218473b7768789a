"""The node's event stream (node-api §0.9): one `EventStream` per node, its SSE parser, the rings of what each
watched context emitted.

Imports the node modules below node.py; node.py imports it (`Node.events()`)."""
from __future__ import annotations

import collections
import hashlib
import json
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from mero_node_errors import log, NodeError, redacted, UnexpectedAnswer
from mero_node_config import display_url, setting
from mero_node_http import (_base_of, _headers, _new_session, _prepared, _requests, arriving, current_scope,
                            decode_json, fetch, Late, late, network_error, opened, too_large, TooLarge)

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"

# ── Events: the node's SSE stream, one per Node (node-api §0.9) ───────────────────────────────────────────────
# One reader thread per node parses, filters and appends; subscriptions go out on a second short-lived thread;
# both use the stream's own requests.Session, so the stream never holds a connection the calls need. The node
# keeps no history: what is known starts when a context was first watched, and every outage is one Gap entry.
# Whatever the node or a peer sends, memory stays bounded (frames to EVENT_FRAME_LIMIT, echoes as digests, answers
# through the capped `fetch`) and neither thread ends: a failure is logged once and the thread goes on.

EVENTS_VARIABLE = "CALIMERO_MCP_EVENTS"
EVENT_CONTEXTS = 32                      # contexts subscribed at once; the least recently used goes out
EVENT_ENTRIES = 100                      # entries kept per context
EVENT_PAYLOAD = 2048                     # characters of a payload's JSON kept; the rest is cut, its size said
EVENT_FRAME_LIMIT = 8 << 20              # a frame larger than this is skipped as a gap, never held whole
EVENT_KIND_LIMIT = 100                   # core's own bound on an event's kind
EVENT_ECHOES = 16                        # recent StateMutations remembered per context (digests), to keep an echo once
SSE_READ_TIMEOUT = 45.0                  # the node sends a keep-alive every 15 s: three missed is a stall
SSE_STEADY_SECONDS = 5.0                 # a stream up this long, or carrying an event, has proved itself
SSE_ID_LIMIT = 200                       # an id or session id longer is not core's ("<u64>-<u64>"): not sent back
SUBSCRIPTION_ANSWER_LIMIT = 1 << 20      # bytes of a subscription's answer read at most (32 ids take ~3 KB)
EVENT_PROGRESS_SECONDS = 10.0            # how often a wait says it still waits, when the caller asked
SSE_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
EVENTS_OFF = ("off", "0", "false", "no")


def events_off(env: Mapping[str, str]) -> bool:
    return (setting(env, EVENTS_VARIABLE) or "").lower() in EVENTS_OFF


def resumable(event_id: str) -> bool:
    """Whether an id (or session id) can go back to the node in a header (Last-Event-ID) or name a session: core's
    are "<u64>-<u64>"; one with a character no header carries (not Latin-1, a control) or of any length is not."""
    return 0 < len(event_id) <= SSE_ID_LIMIT and event_id == event_id.strip() \
        and all(" " <= ch <= "~" for ch in event_id)


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


def _digest(items) -> Optional[bytes]:
    """A 16-byte digest of JSON values, one at a time (a frame's text is never made twice); None if one is not
    JSON."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        for item in items:
            digest.update(json.dumps(item, sort_keys=True).encode("utf-8") + b"\n")
    except (TypeError, ValueError, RecursionError):
        return None
    return digest.digest()


class _Watched:
    """One context's known events: a ring of entries, numbered from 1 in arrival order."""

    def __init__(self):
        self.entries = collections.deque(maxlen=EVENT_ENTRIES)
        self.count = 0                             # entries ever written (the last one's n)
        self.since = _now_text()
        self.subscribed = False
        self.refused = False                       # the node dropped it from a subscription: not ours to observe
        self.echoes = collections.deque(maxlen=EVENT_ECHOES)     # 16-byte digests: a frame's size never stays
        self.mutations = 0                         # StateMutation frames seen (an echo included)
        self.hash = None                           # the state hash the last poll read
        self.framed = False                        # a StateMutation came since that poll
        self.polled = None                         # a root a poll said Changed: its late frame is the same write

    def add(self, entry: Dict[str, Any]) -> None:
        self.count += 1
        self.entries.append(dict({"n": self.count, "at": _now_text()}, **entry))


class EventStream:
    """The node's event stream as the session sees it (node-api §0.9): opened on the first `touch`, then kept
    connected (backoff, Last-Event-ID, re-subscribing a new session, a token refresh) until the process ends."""

    def __init__(self, node):   # a node.Node
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
        self._down_since = None                      # when the current outage began (None: the stream proved up)
        self._gapped = False                         # its Gap is written: an outage is one Gap, however many tries
        self._subscribe_failures = 0                 # subscriptions failed in a row: the retry backs off
        self._said = set()                           # failures logged once
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
                if self._thread is not None and not self._thread.is_alive() and self.state != "polling":
                    self._start()                    # it never ends but to poll; if it did, a touch starts it again
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
            if self._thread is None or not self._thread.is_alive():
                self._start()
            elif self._session_id is not None:
                self._kick()
            return True

    def _start(self):
        """Start the reader thread (called under the lock)."""
        self.state = "connecting"
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

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
            if watched is not None:     # and the time now: how recent an entry's `at` is ("the last few seconds")
                shown["knownSince"], shown["now"] = watched.since, _now_text()
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
                watched.polled = state_hash
                self._cond.notify_all()
            watched.hash, watched.framed = state_hash, False

    # ---- the reader thread ----
    def _run(self):
        attempt = 0
        while True:
            proved = False
            try:
                response = self._connect()
                if response is not None:
                    proved = self._read(response)
            except NodeError as error:
                self.why = str(error)
            except Exception as error:       # whatever the node sent: said once; the next try starts afresh
                self._failed("events", error)
                self._last_id = None
            with self._cond:
                if self.state == "polling":
                    return
                if proved:
                    self._down_since = None         # the outage it ended is over: this break is a new one
                if self._down_since is None and self._session_id is not None:
                    self._down_since, self._gapped = _now_text(), False
                self.state = "reconnecting"
            attempt = 0 if proved else attempt    # grows until a stream proves itself (SSE_STEADY_SECONDS, an event)
            time.sleep(SSE_BACKOFF[min(attempt, len(SSE_BACKOFF) - 1)])
            attempt += 1

    def _failed(self, thread, error):
        """A failure no rule foresaw (an answer or frame of a shape never seen), or a subscription's: one log line
        per kind; the thread goes on."""
        said = (thread, type(error).__name__)
        with self._cond:
            if said in self._said:
                return
            self._said.add(said)
        log.warning("Events: thread %s met %s (%s); it goes on.", thread, said[1], ascii(redacted(str(error)[:200])))

    def _session(self):
        if self._http is None:
            self._http = _new_session()
        return self._http

    def _send(self, method, path, body=None, stream=False, extra=None):
        """One request of the stream, bearer token in its header (never in the URL), renewing an expired token,
        within the calls' deadline: a POST's answer read whole through the capped `fetch`, the GET's head only
        (`opened`; its body is read as it arrives)."""
        node = self._node
        node.connect()
        url = node._base + path
        session, sent, requests = self._session(), [], _requests()
        data = None if body is None else json.dumps(body).encode("utf-8")
        cap = min(node.max_response_bytes, SUBSCRIPTION_ANSWER_LIMIT)

        def send(token):
            if sent:
                sent.pop().close()                  # a refused attempt: its connection goes back
            headers = _headers(token, "application/json" if body is not None else None)
            headers.update(extra or {})
            try:
                prepared = _prepared(requests, session, method, url, None, data, headers)
                sent.append(opened(session, prepared, node._timeout, SSE_READ_TIMEOUT) if stream
                            else fetch(session, prepared, node._timeout, cap))
            except requests.RequestException as error:
                raise network_error(error, url, node._timeout, method) from None
            except Late as error:
                raise late(display_url(url), display_url(node._base), node._timeout, error.sent, method) from None
            except TooLarge as error:
                if error.cap < node.max_response_bytes:     # our own bound, not the one a user can raise
                    raise UnexpectedAnswer("%s %s answered more than %d bytes (a subscription's answer takes a few "
                                           "KB): refused, the rest unread" % (method, path, error.cap)) from None
                raise too_large(display_url(url), display_url(node._base), error, method) from None
            return sent[-1]
        return node._send_authenticated(send)

    def _connect(self):
        extra = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
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
        """Read frames as they arrive until the stream ends or stalls; True when it proved itself: up
        SSE_STEADY_SECONDS after its connect frame, or carrying an event."""
        parser, connected_at, proved = SseParser(), None, False
        self._response = response
        try:
            for chunk in arriving(response):
                for frame in parser.feed(chunk):
                    if frame is SseParser.SKIPPED:
                        self._gap_all("a frame over %d bytes was skipped" % EVENT_FRAME_LIMIT)
                        continue
                    try:
                        took = self._take(frame, response)
                    except Exception as error:      # one frame of a shape never seen: said once, skipped
                        self._failed("events", error)
                        continue
                    connected_at = time.monotonic() if took == "connect" else connected_at
                    proved = proved or (took == "event" and connected_at is not None)
                if parser.last_id and resumable(parser.last_id):
                    self._last_id = parser.last_id
                if not proved and connected_at is not None:
                    proved = time.monotonic() - connected_at >= SSE_STEADY_SECONDS
                if proved and self._down_since is not None:
                    with self._cond:
                        self._down_since = None     # the outage is over: the next break is a new one
        except Exception as error:          # a reset, a stall past SSE_READ_TIMEOUT, a closed response
            self.why = "the stream broke (%s)" % type(error).__name__
        finally:
            self._response = None
            response.close()
        return proved or (connected_at is not None and time.monotonic() - connected_at >= SSE_STEADY_SECONDS)

    def _take(self, frame, response) -> Optional[str]:
        """Act on one frame: "connect", "event" (a context's), or None (anything else, ignored)."""
        try:
            message = json.loads(frame[2])
        except (ValueError, RecursionError):
            return None
        if not isinstance(message, dict):
            return None
        if message.get("type") == "connect":
            session_id = message.get("session_id")
            if isinstance(session_id, int) and not isinstance(session_id, bool):
                session_id = str(session_id)
            if not isinstance(session_id, str) or not resumable(session_id):
                return None                         # not a session we could name back to the node
            self._connected(session_id, message.get("reconnect") is True
                            or response.headers.get("X-SSE-Reconnect") == "true")
            return "connect"
        event = message.get("result")
        if isinstance(event, dict) and isinstance(event.get("contextId"), str):
            self._event(event)
            return "event"
        return None

    def _connected(self, session_id, resumed):
        with self._cond:
            new = session_id != self._session_id or not resumed
            self._session_id, self.state, self.why = session_id, "live", None
            if new:
                self._last_id = None                # an older session's id names no session of this stream
            down = self._down_since if not self._gapped else None
            self._gapped = self._gapped or down is not None
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
        key = _digest([data.get("newRoot")] + events)
        if key is not None and key in watched.echoes:
            return                                  # the author's own delta, echoed back over gossip
        watched.echoes.append(key)
        if not events and data.get("newRoot") is not None and data.get("newRoot") == watched.polled:
            return                                  # a poll saw this root first (the frame raced it): said once
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
                    self._subscribed(asked, self._subscription(session_id, "subscribe", asked))
            except Exception as error:          # a NodeError, or an answer of a shape never seen: retried later
                self._failed("events-subscribe", error)
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
                if self._down_since is None:            # what it sent meanwhile is lost: a Gap
                    self._down_since, self._gapped = _now_text(), False
                self._session_id, self._last_id = None, None
            reading = self._response
            if reading is not None:
                reading.close()
            return None
        if response.status_code != 200:
            raise NodeError("POST /sse/subscription answered HTTP %d" % response.status_code)
        answer = decode_json(response, response.url)      # unreadable, or nested too deep: an UnexpectedAnswer
        result = answer.get("result") if isinstance(answer, dict) else None
        kept = result.get("contexts") if isinstance(result, dict) else None
        if method == "subscribe" and not (isinstance(kept, list) and all(isinstance(c, str) for c in kept)):
            raise UnexpectedAnswer("POST /sse/subscription answered no list of contexts (%s)"
                                   % display_url(_base_of(response.url)))
        return kept

    def _subscribed(self, asked, kept):
        if kept is None:
            return
        kept = {c.lower() for c in kept}
        with self._cond:
            self._subscribe_failures = 0
            for context_id in asked:
                watched = self._watched.get(context_id)
                if watched is not None:
                    watched.subscribed = context_id in kept
                    watched.refused = context_id not in kept       # dropped silently: not ours to observe
            self._cond.notify_all()

    def _retry_later(self, asked, error):
        with self._cond:
            self._pending.update(c for c in asked if c in self._watched)
            self.why = str(error) if isinstance(error, NodeError) else "a subscription failed (%s)" \
                % type(error).__name__
            self._subscribe_failures += 1
            delay = SSE_BACKOFF[min(self._subscribe_failures + 1, len(SSE_BACKOFF) - 1)]    # 2 s, 4 s, … 30 s
        timer = threading.Timer(delay, self._kick_locked)
        timer.daemon = True
        timer.start()

    def _kick_locked(self):
        with self._cond:
            self._kick()
