#!/usr/bin/env python3
"""mero-mcp: a Model Context Protocol server (stdio) for a Calimero node and every app installed on it.

This is the entry: the wire (one JSON message a line), the scheduler, the session and its method handlers, and
`main`. Nothing imports it. The tools run in mero_runtime, the app model is mero_apps, the fixed tools are
mero_tools and mero_governance; the node is reached through node.py and ABIs are mapped by abi.py, both imported lazily so that the
`initialize` answer costs little more than starting the interpreter.
"""
# Only what answering `initialize` needs is imported here; the rest (hashing, base64, regular expressions,
# thread pools, tracebacks, and node.py's requests and abi.py's jsonschema) loads where it is first used,
# because agents start this server for every session (README: start-up cost).
import sys

# Before anything an older Python lacks (functools.cached_property is 3.8+, our siblings are 3.9+): one line and
# exit 1, not a traceback. So everything above this guard runs, and this whole file parses, on Python 3.6 (RHEL 8's
# platform python3): no f-string `=`, walrus or positional-only parameter anywhere (test_packaging checks it).
if sys.version_info < (3, 9):
    sys.stderr.write("mero-mcp needs Python 3.9 or newer, and %s is Python %s. Point the host at a newer Python: "
                     "its absolute path as the command, with /path/to/mero_mcp.py as the argument.\n"
                     % (sys.executable or "python", sys.version.split()[0]))
    sys.exit(1)

import json
import os
import queue
import signal
import threading
import time
from collections import namedtuple

# The rest of the server: without it (a copy of this file alone, or modules of two releases) one line, exit 1.
try:
    from mero_runtime import (_settings_said_by_check, advertised, as_configured, as_failure, BATCH_VERSION, bound,
        bounded, CAPABILITIES, check_fixed_arguments, CONTEXT_OPTIONS, cut_text, EOF_GRACE_SECONDS, error_result,
        failure_text, FIXED_TOOLS, GUIDE_TTL_MS, HANDSHAKE_VERSIONS, heavy, ID_ARGUMENTS, import_failure,
        in_toolsets, INSTRUCTIONS, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, KINDS, LIST_TTL_MS,
        LISTEN_FILTERS, log, MAX_LINE_BYTES, META_CAPABILITIES, META_SERVER_INFO, META_VERSION, METHOD_NOT_FOUND,
        MissingLibrary, MODERN_VERSIONS, module_problems, MULTI_NODE_INSTRUCTION,
        node_module, one_id_form, OUR_MODULES, own_module, PARSE_ERROR, READ_ONLY_INSTRUCTION, read_only_mode,
        read_only_refusal, refuse_unknown_arguments, refuse_unsendable, render_result, Request, resolved_ids,
        RESOURCE_NOT_FOUND, Reply, RESOURCES_CHANGED, RpcError, server_config, SERVER_INFO, SUBSCRIPTION_ID,
        SUPPORTED_VERSIONS, TEXT_BOUND, tool_definition, ToolError, TOOLS_CHANGED, toolsets_problem,
        UNSUPPORTED_VERSION, with_node_argument, without_null_optionals, without_secrets)
    from mero_apps import Apps, GUIDE_TEMPLATE, load_handle_key, read_handle
    from mero_tools import BlobPages
    __import__("mero_governance")    # its @tool declarations join the fixed tools
except ImportError as error:
    sys.stderr.write("mero-mcp cannot start: %s (beside %s). mero-mcp's modules travel together (mero_mcp.py, "
                     "the mero_*.py beside it, node.py and abi.py): copy them all, from one release, into one "
                     "folder, or install the checkout with pip.\n" % (error, os.path.abspath(__file__)))
    sys.exit(1)

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"


# ── 1. Wire: one JSON message per line, under one lock ────────────────────────────────────────────────────────────

class Channel:
    """Owns the real stdout. Everything written there goes through send()."""

    def __init__(self, stream):
        self.stream = stream
        self.lock = threading.Lock()

    def send(self, message):
        line = encode_message(message)
        with self.lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except OSError:              # the client closed our stdout: nothing we say can reach it any more
                quiet_exit(0)


def encode_message(message):
    """Compact UTF-8 JSON plus newline; json escapes newlines inside strings, so one message is one line."""
    if holds_long_list(message):
        try:
            parts = []
            append_parts(message, parts)
            return b"".join(parts) + b"\n"
        except (ValueError, UnicodeEncodeError):     # NaN, a lone surrogate: the general path below says them
            pass
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:           # NaN/Infinity are not JSON (1e400 parses as inf): echo them as null
        message = finite(message)
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:   # a lone surrogate echoed back from input: ASCII JSON escapes it as \udXXX
        return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


# A list longer than this near an answer's root (tools/list's tools) is encoded an item at a time, which holds about
# half the memory one json.dumps of the whole list does (a session's peak RSS). Same bytes.
LONG_LIST = 100
LONG_LIST_DEPTH = 2             # the levels of objects looked into: the message, its result


def holds_long_list(value, depth=0):
    if isinstance(value, list):
        return len(value) > LONG_LIST
    return isinstance(value, dict) and depth < LONG_LIST_DEPTH and any(holds_long_list(item, depth + 1)
                                                                       for item in value.values())


def append_parts(value, parts, depth=0):
    """The compact UTF-8 JSON of `value` appended to `parts`: the objects of the first levels member by member, a
    long list item by item, anything else whole."""
    if isinstance(value, dict) and depth < LONG_LIST_DEPTH and all(isinstance(key, str) for key in value):
        for index, (key, item) in enumerate(value.items()):
            parts.append((b"," if index else b"{") + compact_json(key) + b":")
            append_parts(item, parts, depth + 1)
        parts.append(b"}" if value else b"{}")
    elif isinstance(value, list) and len(value) > LONG_LIST:
        for index, item in enumerate(value):
            parts.append((b"," if index else b"[") + compact_json(item))
        parts.append(b"]")
    else:
        parts.append(compact_json(value))


def compact_json(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def finite(value):
    """A copy of a JSON value with every non-finite float replaced by None."""
    if isinstance(value, float):
        return value if value - value == 0 else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def read_lines(stream):
    """Yield raw lines; an oversized line is yielded as None (after skipping the rest of it)."""
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while True:
                rest = stream.readline(MAX_LINE_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
            continue
        yield line


UTF8_BOM = b"\xef\xbb\xbf"


def without_leading_bom(lines):
    """The lines with a UTF-8 byte-order mark before the first message dropped (some hosts write one first)."""
    first = True
    for line in lines:
        if first and line is not None and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM):]
        first = first and line is not None and not line.strip(JSON_WHITESPACE)
        yield line


def parse_line(raw):
    if raw is None:
        raise RpcError(PARSE_ERROR, "Parse error: message longer than %d bytes" % MAX_LINE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RpcError(PARSE_ERROR, "Parse error: not UTF-8 (%s)" % error.reason) from None
    try:
        message = json.loads(text, parse_constant=not_json)
    except RecursionError:                   # past ~990 levels: the frame's own fields are read without it
        fields, keys, balanced = top_level_fields(text)
        if not balanced:
            raise RpcError(PARSE_ERROR, "Parse error: not JSON (unbalanced brackets, nested too deeply to read)") \
                from None
        raise TooDeep(fields, keys, None) from None
    except ValueError as error:
        raise RpcError(PARSE_ERROR, "Parse error: %s" % error) from None
    # Each level opens with a bracket in the text: a text with few of them needs no walk (most frames).
    if text.count("{") + text.count("[") > MAX_NESTING and nested_past(message, MAX_NESTING):
        raise TooDeep.of(message)
    return message


JSON_WHITESPACE = b" \t\r\n"     # RFC 8259's; a line of nothing else carries no message
MAX_NESTING = 100            # levels of JSON in one message: well under the recursion limit of everything after
TOO_DEEP = "nested more than %d levels deep (the message's own levels included), more than this server reads" % (
    MAX_NESTING)


class TooDeep(RpcError):
    """A well-formed message nested past MAX_NESTING, known by its top-level scalars (`fields`) and keys: answered
    as handle_message would answer it, with its own id (a tools/call gets an isError result naming the limit), so
    its client does not wait for an answer that never comes."""

    def __init__(self, fields, keys, modern):
        super().__init__(INVALID_REQUEST, "Invalid request: " + TOO_DEEP)
        self.fields, self.keys, self.modern = fields, keys, modern

    @classmethod
    def of(cls, message):
        if not isinstance(message, dict):
            return cls({}, None, None)       # a batch: its items are not answered one by one
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(META_VERSION) if isinstance(meta, dict) else None
        fields = {key: value for key, value in message.items() if not isinstance(value, (dict, list))}
        return cls(fields, set(message), None if version is None else version in MODERN_VERSIONS)

    def reply(self, server):
        fields, keys = self.fields, self.keys
        request_id = fields.get("id")
        shown_id = request_id if is_valid_id(request_id) else None
        if keys is None or fields.get("jsonrpc") != "2.0":
            return error_response(shown_id, self)
        if "method" not in keys:
            if "id" in keys and ("result" in keys or "error" in keys):
                return None                  # a response to a request of ours; we send none
            return error_response(shown_id, self)
        if "id" not in keys:
            return None                      # a notification: never answered
        if shown_id is None or fields.get("method") != "tools/call":
            return error_response(shown_id, self)
        result = error_result("Error: The arguments are %s. Pass them flatter (at most %d levels in all)."
                              % (TOO_DEEP, MAX_NESTING))
        modern = self.modern or (self.modern is None and server.version is None)
        return response(request_id, modern_result("tools/call", result) if modern else result)


def nested_past(value, limit):
    """Whether `value` holds containers more than `limit` levels deep; level by level, without recursion."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
            inner.extend(child for child in children if isinstance(child, (dict, list)))
        level = inner
    return False


def top_level_fields(text):
    """(top-level scalars, top-level keys or None when it is no object, whether its brackets balance) of a text too
    deep for json.loads: read token by token, without recursion."""
    import re
    fields, keys, key, after_colon, depth, balanced = {}, set(), None, False, 0, True
    tokens = re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]|[^\s"\[\]{}:,]+', text)
    for index, match in enumerate(tokens):
        token = match.group()
        if index == 0 and token != "{":
            keys = None
        if token in ("[", "{"):
            after_colon = after_colon and depth != 1
            depth += 1
        elif token in ("]", "}"):
            depth -= 1
            balanced = balanced and (depth > 0 or match.end() == len(text.rstrip()))
        elif depth != 1:
            continue
        elif token == ":":
            after_colon = key is not None
        elif token == ",":
            key, after_colon = None, False
        elif after_colon:
            try:
                fields.setdefault(key, json.loads(token))
            except ValueError:
                pass
            key, after_colon = None, False
        elif token.startswith('"') and keys is not None:
            try:
                key = json.loads(token)
                keys.add(key)
            except ValueError:
                key = None
    return fields, keys, balanced and depth == 0


def not_json(constant):
    raise ValueError("%s is not JSON" % constant)     # Python's json accepts NaN and Infinity; RFC 8259 does not


def is_valid_id(value):
    # MCP ids are strings or integers, never null; bool is an int to Python but not to JSON.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def is_request(message):
    """A message handle_message would dispatch (as opposed to a notification, a response or an invalid one)."""
    return (isinstance(message, dict) and message.get("jsonrpc") == "2.0" and "method" in message
            and "id" in message and is_valid_id(message["id"]))


def notification(method, params=None):
    message = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


def response(request_id, result):
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id, error):
    return {"jsonrpc": "2.0", "id": request_id, "error": sealed_error(error.to_json())}


ERROR_QUOTE = 2000           # characters of one string an error quotes (a tool name, a uri)


def sealed_error(error):
    """The last guard on every JSON-RPC error: our secrets out, each string it quotes cut to ERROR_QUOTE, and its
    data left out if even then it would pass TEXT_BOUND; whatever a handler put in it."""
    def short(value):
        if isinstance(value, str):
            return cut_text(without_secrets(value), ERROR_QUOTE)
        if isinstance(value, dict):
            return {key: short(item) for key, item in value.items()}
        return [short(item) for item in value] if isinstance(value, list) else value
    sealed = dict(error, message=short(error.get("message")))
    if "data" in sealed:
        sealed["data"] = short(sealed["data"])
        if len(json.dumps(sealed["data"])) > TEXT_BOUND // 2:
            del sealed["data"]
    return sealed


# ── 2. Scheduler: the stdin thread, the main loop, cancellation ───────────────────────────────────────────────────

CANCEL_POLL_SECONDS = 0.05           # how soon the loop sees that a batch item it waits on was cancelled
REQUEST_THREADS = 16                 # batch items run one at a time; cancelled ones may still be finishing
_request_pool = []
EOF = object()


def request_pool():
    """The threads batch items run on (made once, on first use): the loop hands each over and waits."""
    if not _request_pool:
        from concurrent.futures import ThreadPoolExecutor
        _request_pool.append(ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="request"))
    return _request_pool[0]


def quiet_exit(code=0):
    """Leave at once: no traceback, no waiting on worker threads (the client is gone or asked us to stop)."""
    try:
        sys.stderr.flush()
    finally:
        os._exit(code)


class Scheduler:
    """Who runs what, when. The stdin thread reads lines, answers a ping and applies a cancel at once, and queues
    the rest, each request with its ticket (its cancel flag, made as it arrives). One loop at a time takes the
    queue in order and runs each request on its own thread; a cancel of that request hands the loop on to a new
    thread, which goes on with the next line, while the cancelled request finishes where it is, unanswered."""

    def __init__(self, server):
        self.server = server
        self.inbox = queue.Queue()
        self.lock = threading.Lock()         # tickets, running and loop change together
        self.tickets = {}                    # request id -> threading.Event, for requests not yet answered
        self.running = None                  # the ticket of the request the loop runs on its own thread now
        self.loop = 0                        # which loop takes the queue: a cancel of `running` starts the next
        self.finished = threading.Event()
        self.failures = []
        server.scheduler = self

    def serve(self, stdin):
        threading.Thread(target=self.read, args=(stdin,), name="stdin", daemon=True).start()
        if not self.main_loop(0):
            self.finished.wait()             # a later loop reads on; it ends at EOF
            if self.failures:
                raise self.failures[0]

    # ---- the stdin thread ----
    def read(self, stream):
        """stdin on its own thread, so a cancel is seen and a ping answered while a call runs; EOF ends the process."""
        try:
            for raw in without_leading_bom(read_lines(stream)):
                received = self.receive(raw)
                if received is not None:
                    self.inbox.put(received)
        finally:
            self.inbox.put(EOF)              # even if this thread fails: the loop must not wait forever
            # The client is gone: answers still queued get a moment to drain, a call waiting on the node does not.
            threading.Timer(EOF_GRACE_SECONDS, self.exit_after_eof).start()

    def exit_after_eof(self):
        self.server.channel.lock.acquire(timeout=1.0)     # never cut a frame in half
        quiet_exit(0)

    def receive(self, raw):
        """Parse one line; a cancellation or a ping is dealt with at once (never behind a slow call); anything
        else is returned for the loop, each request with its ticket, made now so that a cancellation arriving
        while it waits its turn still reaches it."""
        if raw is not None and not raw.strip(JSON_WHITESPACE):
            return None                      # an empty line carries no message: nothing to answer
        try:
            message = parse_line(raw)
        except RpcError as error:
            return error, None               # answered in order by the loop
        if isinstance(message, list):
            return message, [self.ticket(item) for item in message]
        if self.handled_at_once(message):
            return None
        return message, self.ticket(message)

    def ticket(self, message):
        """A request's cancel flag, registered under its id (a later request reusing the id gets its own).
        initialize gets none: it is never cancelled (cancellation.mdx), or the session would never open."""
        if not is_request(message) or message.get("method") == "initialize":
            return None
        event = threading.Event()
        with self.lock:
            self.tickets[message["id"]] = event
        return event

    def release(self, message, ticket):
        if ticket is not None:
            with self.lock:
                if self.tickets.get(message["id"]) is ticket:
                    del self.tickets[message["id"]]

    def handled_at_once(self, message):
        method = message.get("method") if isinstance(message, dict) and message.get("jsonrpc") == "2.0" else None
        if method == "notifications/cancelled" and "id" not in message:
            self.server.handle_notification(message)
            return True
        if method == "ping" and "id" in message:
            reply = self.server.handle_message(message)     # cheap and stateless, whatever its params say
            if reply is not None:
                self.server.channel.send(reply)
            return True
        return False

    def cancel(self, request_id):
        """Set the request's ticket; if the loop is running it, hand the loop on to a new thread."""
        with self.lock:
            event = self.tickets.get(request_id)
            if event is None:
                return
            event.set()
            if event is self.running:
                self.running, self.loop = None, self.loop + 1
                threading.Thread(target=self.loop_thread, args=(self.loop,), name="loop-%d" % self.loop,
                                 daemon=True).start()

    # ---- the loop ----
    def loop_thread(self, loop):
        try:
            if not self.main_loop(loop):
                return                       # handed on in its turn
        except BaseException as error:       # a bug of ours ends the process as it would on the main thread
            self.failures.append(error)
        self.finished.set()

    def main_loop(self, loop) -> bool:
        """Handle the queue's lines until EOF (True) or until a cancel handed the loop on (False)."""
        while True:
            received = self.inbox.get()
            if received is EOF:
                try:
                    self.server.listens.end_all()
                except OSError:              # the client closed our stdout too
                    pass
                return True
            self.handle_line(*received)
            if self.loop != loop:
                return False

    def handle_line(self, message, tickets):
        """Answer one received line (a message, a batch or a parse error); sends what is due."""
        server = self.server
        if isinstance(message, RpcError):
            reply = message.reply(server) if isinstance(message, TooDeep) else error_response(None, message)
            if reply is not None:
                server.channel.send(reply)
            return
        if isinstance(message, list):
            if self.refused_batch(message, tickets):
                return
            reply = [r for r in (self.until_cancelled(item, ticket) for item, ticket in zip(message, tickets))
                     if r is not None]
        else:
            reply = self.on_this_thread(message, tickets)
        if reply:                            # None, or a batch whose items all went unanswered
            server.channel.send(reply)
        server.catalog.start()               # after the first answer of either era: off the answer path

    def refused_batch(self, batch, tickets):
        """An empty batch, or one in a session that did not negotiate batches, answered with one error."""
        if self.server.version == BATCH_VERSION and batch:
            return False
        for item, ticket in zip(batch, tickets):
            self.release(item, ticket)
        reason = "Empty batch" if not batch else (
            "Batches are only served when protocol version %s was negotiated" % BATCH_VERSION)
        self.server.channel.send(error_response(None, RpcError(INVALID_REQUEST, reason)))
        return True

    def answer(self, message, in_batch, ticket):
        try:
            return self.server.handle_message(message, in_batch, ticket)
        finally:
            self.release(message, ticket)

    def on_this_thread(self, message, ticket):
        """The request on the loop's own thread; a cancel of it hands the loop on instead (`cancel`), and this
        thread's answer is then dropped: the request was cancelled."""
        if ticket is None:
            return self.answer(message, False, None)
        with self.lock:
            self.running = ticket
        reply = None
        try:
            reply = self.answer(message, False, ticket)
        finally:
            with self.lock:
                if self.running is ticket:
                    self.running = None
                else:                        # cancelled and handed over: another loop answers from now on
                    reply = None
        return reply

    def until_cancelled(self, message, ticket):
        """A batch item on a request thread while the loop waits for it, or for its cancellation: a cancelled
        item lets the next one start at once. Its node call may finish in the background; its answer is dropped
        there (handle_message answers nothing once the ticket is set)."""
        if ticket is None:                   # a notification, a stray frame: nothing to cancel
            return self.answer(message, True, None)
        from concurrent.futures import TimeoutError as FutureTimeout
        future = request_pool().submit(self.answer, message, True, ticket)
        while True:
            try:
                return future.result(timeout=CANCEL_POLL_SECONDS)
            except FutureTimeout:
                if ticket.is_set():
                    return None


def serve(stdin, stdout):
    Scheduler(Server(Channel(stdout))).serve(stdin)


# ── 3. Session: the node directory, eras, dispatch, the method handlers ───────────────────────────────────────────

class NodeEntry:
    """One node of the directory (DESIGN.md: each call addresses one node): its `node.Node` (its own HTTP session,
    credentials and token cache) and its app model (records, ABIs, handles' admission), each made on first use.
    Nothing of one entry serves another; a call reaches its entry through `Request.entry`."""

    def __init__(self, server, named=None, default=True):
        self.server = server
        self.named = named                   # node.NamedNode; None: the one node discovery finds (single mode)
        self.default = default               # the default node takes the environment's token (node.auth_plan)
        self._node = None
        self._apps = None
        self.lock = threading.Lock()

    @property
    def name(self):
        return self.named.name if self.named is not None else None

    @property
    def node(self):
        with self.lock:
            if self._node is None:
                self._node = node_module().Node(self.server.env, named=self.named, default=self.default)
            return self._node

    @property
    def read_only(self):
        """A " (ro)" CALIMERO_NODES entry: writes aimed at it are refused before anything is sent."""
        return self.named is not None and self.named.read_only

    @property
    def url(self):
        return self.named.url if self.named is not None else None

    @property
    def apps(self):
        with self.lock:
            if self._apps is None:
                self._apps = Apps(self)
            return self._apps

    def adopt(self, node):
        """Use a Node already connected (--check's count of tools)."""
        with self.lock:
            self._node = node


class NodeEntries:
    """The node directory as the server holds it (node.node_directory): an entry per named node in multi-node mode,
    else the one entry; every entry is cheap until used (its Node and app model are lazy). A tool call resolves its
    entry here (run_tool; each call_many item) and nowhere else: its `node`, else its handle's node, else the
    default (kubernetes-mcp-server's target provider)."""

    def __init__(self, server):
        self.server = server
        self.directory = node_directory_of(server.env)
        self.multi = self.directory is not None and self.directory.multi
        default = self.directory.default if self.directory is not None else None
        if self.multi:
            self.entries = {n.name: NodeEntry(server, n, default=n == default) for n in self.directory.nodes}
            self.default = self.entries[default.name]
        else:
            self.default = NodeEntry(server, default)      # a lone CALIMERO_NODES entry, else discovery's node
            self.entries = {}
        self._handle_key = None
        self.key_lock = threading.Lock()          # call_many's items may all ask for the key first at once

    def named(self, name):
        entry = self.entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise ToolError('There is no node "%s". The nodes are: %s. list_nodes shows them.'
                            % (name, self.known_names()))
        return entry

    def known_names(self):
        return ", ".join(name + (" (default)" if entry is self.default else "") for name, entry in self.entries.items())

    def resolve(self, arguments, fallback=None, takes_node=True):
        """(the entry a call runs on, its arguments without `node`). A `node` that contradicts the node the call's
        app_handle was made on is refused: a handle's admission holds on its own node only. `fallback`: the entry
        when neither names one (a call_many item: call_many's own; else the default)."""
        fallback = fallback or self.default
        handle = self.handle_of(arguments.get("app_handle"))
        if not self.multi:
            self.refuse_handle_elsewhere(fallback, handle)
            return fallback, arguments
        arguments = dict(arguments)
        asked = arguments.pop("node", None) if takes_node else None
        bound_to = handle.node if handle is not None else None
        if handle is not None and bound_to is None:
            raise ToolError("This app_handle names no node (it was made with one node, or by an older release): "
                            "select_app with node makes one for the node it should run on. Nothing was sent.")
        if asked is not None:
            entry = self.named(asked)
            if bound_to is not None and bound_to != entry.name:
                raise ToolError('node "%s" contradicts the app_handle, which was made on node "%s": drop node (the '
                                'handle runs there), or select_app with node "%s" for a handle of that node.'
                                % (entry.name, bound_to, entry.name))
        else:
            entry = self.named(bound_to) if bound_to is not None else fallback
        self.refuse_handle_elsewhere(entry, handle)
        return entry, arguments

    def handle_of(self, text):
        return read_handle(self.handle_key, text) if isinstance(text, str) else None

    def refuse_handle_elsewhere(self, entry, handle):
        """A handle runs only on the node it was made on: its address, when it names one, must be this entry's
        (a restart may have pointed the same name, or the one node, elsewhere). Learning the one node's address
        may take discovery; nothing is sent to an app before this."""
        if handle is None or handle.url is None:
            return
        url = entry.url or entry.node.connected_url()
        if url != handle.url:
            made_on = ('node "%s" (%s)' % (handle.node, handle.url)) if handle.node else handle.url
            raise ToolError("This app_handle was made on %s, not on %s: a handle runs only on the node it was made "
                            "on. select_app%s makes one for this node. Nothing was sent."
                            % (made_on, ('node "%s" (%s)' % (entry.name, url)) if entry.name else url,
                               ' with node "%s"' % entry.name if entry.name else ""))

    @property
    def handle_key(self):
        """The server's one handle key, loaded on first use: were each node's its own, a state dir that cannot keep
        one would give each node a random key, and a handle made on one node could not say which node it names."""
        if self._handle_key is None:
            with self.key_lock:                   # one load: threads making it together shared one tmp file
                if self._handle_key is None:
                    state = node_module().state_dir(self.server.env)
                    self._handle_key = load_handle_key(node_module().ensure_dir(state))
        return self._handle_key

    def said_where(self, result, entry, ran_on=()):
        """Multi-node mode: every result names the node it ran on (a last text block); single mode: unchanged.
        `ran_on`: the nodes call_many's items ran on, said when they are not just the call's own."""
        if not self.multi or entry is None or not isinstance(result, dict):
            return result
        content = list(result.get("content") or [])
        if any(name != entry.name for name in ran_on):
            said = 'Ran on nodes %s (each row names its node).' % ", ".join('"%s"' % name for name in ran_on)
        else:
            said = 'Ran on node "%s".' % entry.name
        content.append({"type": "text", "text": said})
        return dict(result, content=content)


def node_directory_of(env):
    """The node directory (mero_node_config.node_directory), or None when it cannot be had: discovery then decides,
    and says what is wrong, on the first call (start-up already refused a bad CALIMERO_NODES entry)."""
    try:      # the configuration alone, read before initialize is answered: node.py waits for the first request
        return own_module("mero_node_config").node_directory(env)
    except Exception:
        return None


def on_node(entry, text, error=None):
    """An error in multi-node mode names the node and its URL, and a node out of reach that the others keep
    working (its fix, node.py's, names what started or named it)."""
    if entry is None:
        return text
    # node.py's single-node advice would send the user to the wrong variable: this node is one of several.
    text = text.replace(SINGLE_NODE_FIX, MULTI_NODE_FIX)
    if isinstance(error, own_module("mero_node_errors").Unreachable) and OTHERS_WORK not in text:
        text = "%s %s" % (text, OTHERS_WORK)
    return 'Node "%s" (%s): %s' % (entry.name, entry.url, text)


SINGLE_NODE_FIX = "or point CALIMERO_NODE_URL at a running node."
OTHERS_WORK = "The other nodes still work: list_nodes says which are up."
MULTI_NODE_FIX = "or correct its URL (CALIMERO_NODES). " + OTHERS_WORK


def refuse_write_to_read_only_node(entry, t):
    """A " (ro)" node takes no write: a fixed tool that writes is refused before anything is sent (call,
    call_many and generated tools run [view] methods only there: refuse_unless_view)."""
    if entry is not None and entry.read_only and t.kind == "fixed" and t.annotations.get("readOnlyHint") is not True:
        raise ToolError('%s is refused: node "%s" is read-only (" (ro)" in CALIMERO_NODES); nothing was sent. Its '
                        'reads work, and the other nodes take writes (pass node).' % (t.name, entry.name))


class Server:
    """One stdio connection: what it negotiated, and the handlers for each method."""

    def __init__(self, channel, env=None):
        self.channel = channel
        self.env = os.environ if env is None else env
        self.version = None                  # negotiated handshake version, None until initialize
        self.scheduler = None                # serve's: whoever runs requests also applies cancels
        self.listens = Listens(channel)      # 2026-07-28 subscriptions/listen streams
        self.config = server_config(self.env)
        self.nodes = NodeEntries(self)       # each node's Node and app model, made on first use
        multi = self.nodes.multi
        # A tool read-only mode leaves out is still found by name, to be refused saying why.
        self.fixed_tools = {t.name: with_node_argument(as_configured(t, self.config), multi) for t in FIXED_TOOLS
                            if in_toolsets(t, self.config) and (multi or t.nodes != "each")}
        self.instructions = INSTRUCTIONS + "\n" + READ_ONLY_INSTRUCTION if self.config.read_only else INSTRUCTIONS
        if multi:
            self.instructions += "\n" + MULTI_NODE_INSTRUCTION % self.nodes.default.name
        # Rendered once: fixed tools declare no output schema, so one rendering serves both eras.
        self.fixed_definitions = [tool_definition(t, wrap=False) for t in self.fixed_tools.values()
                                  if advertised(t, self.config)]
        self.blob_pages = BlobPages()        # the one blob being read page by page (get_blob)

    @property
    def catalog(self):
        """The default node's catalog: the one that polls and feeds tools/list and resources."""
        return self.nodes.default.apps.catalog

    def handle_message(self, message, in_batch=False, ticket=None):
        """The response for one message, or None (notifications, stray responses and cancelled requests get
        none). `ticket` is the request's cancel flag from receive(); a request cancelled before it starts never
        runs."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            request_id = message.get("id") if isinstance(message, dict) else None
            return error_response(request_id if is_valid_id(request_id) else None,
                                  RpcError(INVALID_REQUEST, "Not a JSON-RPC 2.0 message"))
        if "method" not in message:
            if "id" in message and ("result" in message or "error" in message):
                return None              # a response to a request of ours; we send none
            request_id = message.get("id")
            return error_response(request_id if is_valid_id(request_id) else None,
                                  RpcError(INVALID_REQUEST, "A request needs a method"))
        if "id" not in message:
            self.handle_notification(message)
            return None
        request_id = message["id"]
        if not is_valid_id(request_id):
            return error_response(None, RpcError(INVALID_REQUEST, "A request id must be a string or an integer"))
        ticket = threading.Event() if ticket is None else ticket
        if log.threshold == 10:
            return self.timed(message, in_batch, ticket)
        return self.answer(message, in_batch, ticket)

    def timed(self, message, in_batch, ticket):
        """--log-level debug: each request's method (a tool call's tool), id, outcome and time, on stderr."""
        started = time.monotonic()
        answer = self.answer(message, in_batch, ticket)
        params = message.get("params")
        tool = params.get("name") if message["method"] == "tools/call" and isinstance(params, dict) else None
        outcome = "no answer" if answer is None else "error %s" % answer["error"]["code"] if "error" in answer \
            else "tool error" if isinstance(answer["result"], dict) and answer["result"].get("isError") else "ok"
        log.debug("%s%s (id %s): %s in %.0f ms", str(message["method"])[:100],     # a client's names, cut short
                  " %s" % tool[:100] if isinstance(tool, str) else "", json.dumps(message["id"])[:100], outcome,
                  (time.monotonic() - started) * 1000)
        return answer

    def answer(self, message, in_batch, ticket):
        request_id = message["id"]
        try:
            if ticket.is_set():
                return None              # cancelled while it waited its turn: it never runs
            result = self.dispatch(message, in_batch, ticket)
            if ticket.is_set() or result is LISTENING:
                return None              # cancelled: no response (cancellation.mdx); a listen answers when it ends
            return response(request_id, result)
        except RpcError as error:
            return error_response(request_id, error)
        except Exception:                # a bug of ours: the client gets a short message, stderr the traceback
            import traceback
            log.error("internal error in %s:\n%s", message.get("method"), traceback.format_exc())
            return error_response(request_id, RpcError(INTERNAL_ERROR, "Internal error"))

    def handle_notification(self, message):
        method, params = message.get("method"), message.get("params")
        if method == "notifications/cancelled" and isinstance(params, dict):
            self.cancel(params.get("requestId"))
        # Anything else (notifications/initialized, unknown ones, bad params) needs nothing from us, and
        # notifications are never answered.

    def cancel(self, request_id):
        if not is_valid_id(request_id):
            return
        if self.scheduler is not None:
            self.scheduler.cancel(request_id)
        self.listens.close(request_id)       # a listen ends when its client cancels it, unanswered

    def dispatch(self, message, in_batch, ticket):
        method, params = message["method"], message.get("params", {})
        if not isinstance(method, str):
            raise RpcError(INVALID_REQUEST, "method must be a string")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        call = Request(self, message["id"], meta, self.request_version(meta, method), ticket)
        handler = (MODERN_METHODS if call.modern else HANDSHAKE_METHODS).get(method)
        if handler is None:
            raise RpcError(METHOD_NOT_FOUND, "Method not found: %s" % method)
        if method == "initialize" and in_batch:
            raise RpcError(INVALID_REQUEST, "initialize must not be part of a batch")
        result = handler(self, params, call)
        if call.modern and result is not LISTENING:
            result = modern_result(method, result)
        return result

    def request_version(self, meta, method):
        """The protocol version a request is answered in: the modern version its _meta names, else the session's
        (None before initialize); raises -32022 for a version we do not serve."""
        version = meta.get(META_VERSION)
        if version is None:
            return MODERN_VERSIONS[0] if method == "server/discover" else self.version
        if version in MODERN_VERSIONS:
            if META_CAPABILITIES not in meta:       # a rule of the version: checked once it is one we serve
                raise RpcError(INVALID_PARAMS, "params._meta is missing %s, which every %s request carries"
                               % (META_CAPABILITIES, version))
            return version
        # Echo a string (or number) as sent; a nested value could be too deep to encode again.
        requested = version if isinstance(version, (str, int)) else None
        message = "Unsupported protocol version"
        if version in HANDSHAKE_VERSIONS:          # served, but only on a session opened with initialize
            message += ": %s is negotiated with initialize, not per request" % version
        # Only the versions a per-request call can use: a handshake version is served after initialize alone.
        raise RpcError(UNSUPPORTED_VERSION, message,
                       {"supported": [v for v in MODERN_VERSIONS if v != version], "requested": requested})

    def wraps_output(self, call):
        """Handshake-era clients need object output schemas, so non-object returns ride as {result}."""
        return not call.modern

    # ---- tools ----
    def tool_definitions(self, call):
        return self.fixed_definitions + self.catalog.generated_definitions(self.wraps_output(call))

    def find_tool(self, name):
        return self.fixed_tools.get(name) or self.catalog.generated_tool(name)

    def run_tool(self, t, arguments, call):
        """Run a tool; every failure that is not a bug of ours becomes an isError result."""
        try:
            arguments = without_null_optionals(t, arguments)
            refuse_unknown_arguments(t, arguments)
            refuse_unsendable(t, arguments)
            problems = check_fixed_arguments(t, arguments)
            if problems:
                raise ToolError("Invalid arguments for %s:\n%s" % (t.name, heavy("abi").render_problems(problems)))
            arguments = one_id_form(arguments, keys=self.id_keys(t))
            call.entry, arguments = self.nodes.resolve(arguments, takes_node=self.routes_node(t))
            refuse_write_to_read_only_node(call.entry, t)
            with bound(call), call.node.scope(call.traceparent, call.ticket):
                arguments = resolved_ids(call.apps, t, arguments, call)
                if KINDS[t.kind].whole_call_reads:
                    with call.reading():
                        value = t.handler(arguments, call)
                else:
                    value = t.handler(arguments, call)
        except Exception as error:
            error = as_failure(error)
            # Only the node's own failures take its name and URL first: an argument refused reads as the node down.
            from_node = self.nodes.multi and isinstance(error, node_module().NodeError)
            result = error_result(on_node(call.entry, failure_text(error), error) if from_node else failure_text(error),
                                  error.blocks if isinstance(error, ToolError) else ())
            return self.said_where(t, result, call.entry)
        value, ran_on = value if isinstance(value, Reply) else (value, ())
        # A method's output is the app's data, returned whole, as its generated tool returns it; on_tools_call's
        # last guard (sealed) bounds every answer.
        return self.said_where(t, render_result(value), call.entry, ran_on)

    def said_where(self, t, result, entry, ran_on=()):
        """The node the call ran on, said last (multi mode), unless the answer's rows name each node."""
        return result if t.nodes != "one" else self.nodes.said_where(result, entry, ran_on)

    def routes_node(self, t):
        """Whether `node` names the node `t` runs on: not for a tool that talks to no one node, nor for a method
        that declares a parameter `node` of its own (the app's data: its tool runs where its handle was made)."""
        if t.nodes == "none":
            return False
        binding = self.catalog.snapshot.bindings.get(t.name) if t.kind == "generated" else None
        return binding is None or "node" not in {param.name for param in binding.method.params}

    def id_keys(self, t):
        """The arguments of `t` that take ids: a generated tool's are its context options the method does not
        declare itself (the others, and every parameter, are the app's data, never touched)."""
        if t.kind != "generated":
            return ID_ARGUMENTS
        binding = self.catalog.snapshot.bindings.get(t.name)
        own = {param.name for param in binding.method.params} if binding is not None else CONTEXT_OPTIONS
        return CONTEXT_OPTIONS - own

    def announce_lists_changed(self, tools=True, resources=True):
        """The catalog changed: tell a handshake-era session, and every listen that asked for that list."""
        methods = [m for m, changed in ((TOOLS_CHANGED, tools), (RESOURCES_CHANGED, resources)) if changed]
        if self.version is not None:
            for method in methods:
                self.notify(method)
        self.listens.announce(methods)

    def notify(self, method, params=None):
        self.channel.send(notification(method, params))


LISTENING = object()        # a handler's answer for a listen: its response comes only when the stream ends


class Listens:
    """Open subscriptions/listen streams (2026-07-28): request id -> the notification methods it asked for.

    Each stream is acknowledged before anything else is sent on it, and every message on it carries its id
    (basic/patterns/subscriptions). One lock orders that against announcements and cancels from other threads."""

    def __init__(self, channel):
        self.channel = channel
        self.lock = threading.Lock()
        self.streams = {}

    def open(self, request_id, accepted, ticket):
        with self.lock:
            if ticket.is_set():
                return                       # cancelled before it opened
            self.streams[request_id] = {LISTEN_FILTERS[field] for field in accepted}
            self.channel.send(notification("notifications/subscriptions/acknowledged",
                                           {"_meta": {SUBSCRIPTION_ID: request_id}, "notifications": accepted}))

    def close(self, request_id):
        with self.lock:
            self.streams.pop(request_id, None)

    def announce(self, methods):
        with self.lock:
            for request_id, wanted in self.streams.items():
                for method in methods:
                    if method in wanted:
                        self.channel.send(notification(method, {"_meta": {SUBSCRIPTION_ID: request_id}}))

    def end_all(self):
        """The server shuts down: each stream ends gracefully, with its completion result."""
        with self.lock:
            streams, self.streams = self.streams, {}
        for request_id in streams:
            self.channel.send(response(request_id, modern_result(
                "subscriptions/listen", {"_meta": {SUBSCRIPTION_ID: request_id}})))


def modern_result(method, result):
    """2026-07-28 results carry resultType, serverInfo and, for lists and reads, cache hints."""
    result = dict(result)
    result["resultType"] = "complete"
    meta = dict(result.get("_meta") or {})
    meta[META_SERVER_INFO] = SERVER_INFO
    result["_meta"] = meta
    if method in ("tools/list", "resources/list", "resources/templates/list"):
        result.setdefault("ttlMs", LIST_TTL_MS)
        result.setdefault("cacheScope", "private")
    elif method == "resources/read":
        result.setdefault("ttlMs", GUIDE_TTL_MS)
        result.setdefault("cacheScope", "private")
    return result


def on_initialize(server, params, call):
    requested = params.get("protocolVersion")
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
    server.version = version
    return {"protocolVersion": version, "capabilities": CAPABILITIES,
            "serverInfo": SERVER_INFO, "instructions": server.instructions}


def on_discover(server, params, call):
    return {"supportedVersions": list(SUPPORTED_VERSIONS), "capabilities": CAPABILITIES,
            "instructions": server.instructions, "ttlMs": LIST_TTL_MS, "cacheScope": "private"}


def on_ping(server, params, call):
    return {}


def on_tools_list(server, params, call):
    check_cursor(params)
    return {"tools": server.tool_definitions(call)}


def on_tools_call(server, params, call):
    """tools/call: whatever the tool answers passes `sealed`, the last guard of every answer."""
    name = params.get("name")
    tool = server.find_tool(name) if isinstance(name, str) else None
    return sealed(called_tool(server, params, call, tool), answer_bound(tool, server.config))


def called_tool(server, params, call, tool):
    name, arguments = params.get("name"), params.get("arguments", {})
    if not isinstance(name, str):
        raise RpcError(INVALID_PARAMS, "tools/call needs a tool name (string)")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "tools/call arguments must be an object")
    if tool is None:
        raise RpcError(INVALID_PARAMS, "Unknown tool: %s" % name)
    if not advertised(tool, server.config):          # a tool read-only mode leaves out, called by name anyway
        return error_result("Error: " + read_only_refusal(name))
    return server.run_tool(tool, arguments, call)


def answer_bound(tool, config):
    """TEXT_BOUND, the README's bound; an app call's answer (app data, whole) may take the result bound the user
    set instead (None: unbounded)."""
    if tool is None or KINDS[tool.kind].bounded or config.result_bound is None:
        return TEXT_BOUND if tool is None or KINDS[tool.kind].bounded else None
    return max(TEXT_BOUND, config.result_bound)


def sealed(result, limit):
    """The last guard on every tools/call answer: our secrets out of every string, then within `limit`."""
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        if sys.modules.get("node") is not None:
            whole = json.dumps(result, ensure_ascii=False)      # one pass over the whole (its patterns know JSON's
            if without_secrets(whole) != whole:                # escapes); each string only when one is there
                result = secrets_out(result)
        if result.get("isError"):
            limit = TEXT_BOUND                 # an error is ours, never an app's data: the README's bound
        if limit is not None:
            result = bounded(result, limit)
    return result


def secrets_out(value):
    if isinstance(value, str):
        return without_secrets(value)
    if isinstance(value, dict):
        return {key: secrets_out(item) for key, item in value.items()}
    return [secrets_out(item) for item in value] if isinstance(value, list) else value


def on_resources_list(server, params, call):
    check_cursor(params)
    return {"resources": server.catalog.guide_resources()}


def on_resource_templates(server, params, call):
    check_cursor(params)
    return {"resourceTemplates": [GUIDE_TEMPLATE]}


def on_resources_read(server, params, call):
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise RpcError(INVALID_PARAMS, "resources/read needs a uri (string)")
    contents = server.catalog.read_guide(uri)
    if contents is None:
        code = INVALID_PARAMS if call.modern else RESOURCE_NOT_FOUND
        raise RpcError(code, "Resource not found: %s" % uri, {"uri": uri})
    return {"contents": contents}


def on_listen(server, params, call):
    server.listens.open(call.request_id, listen_filter(params), call.ticket)
    return LISTENING


def listen_filter(params):
    """The filter fields of a subscriptions/listen we honour: what its acknowledgement carries."""
    wanted = params.get("notifications")
    if not isinstance(wanted, dict):
        raise RpcError(INVALID_PARAMS, "subscriptions/listen needs params.notifications (an object)")
    for field in ("toolsListChanged", "promptsListChanged", "resourcesListChanged"):
        if field in wanted and not isinstance(wanted[field], bool):
            raise RpcError(INVALID_PARAMS, "notifications.%s must be a boolean" % field)
    uris = wanted.get("resourceSubscriptions")
    if uris is not None and not (isinstance(uris, list) and all(isinstance(uri, str) for uri in uris)):
        raise RpcError(INVALID_PARAMS, "notifications.resourceSubscriptions must be an array of strings")
    return {field: True for field in LISTEN_FILTERS if wanted.get(field) is True}


def check_cursor(params):
    # Everything fits one page, so no cursor we hand out exists: any cursor is invalid.
    if params.get("cursor") is not None:
        raise RpcError(INVALID_PARAMS, "Invalid cursor")


COMMON_METHODS = {
    "tools/list": on_tools_list,
    "tools/call": on_tools_call,
    "resources/list": on_resources_list,
    "resources/read": on_resources_read,
    "resources/templates/list": on_resource_templates,
    "server/discover": on_discover,
}
HANDSHAKE_METHODS = dict(COMMON_METHODS, initialize=on_initialize, ping=on_ping)
MODERN_METHODS = dict(COMMON_METHODS, **{"subscriptions/listen": on_listen})   # no initialize, no ping


# ── 4. main ───────────────────────────────────────────────────────────────────────────────────────────────────────

# --check's tool budget (node.check prints it): how many tools tools/list advertises, how many of them are fixed, how
# many fixed tools CALIMERO_MCP_TOOLSETS=core would leave, the ids of the installed apps CALIMERO_MCP_APPS leaves out,
# and the CALIMERO_MCP_APPS names that match no installed app.
ToolCount = namedtuple("ToolCount", "advertised fixed fewest_fixed left_out unmatched")


def count_tools(env, node):
    """--check's ToolCount against a connected `node`, made by the code that answers tools/list (so the two agree)."""
    server = Server(None, env)
    server.nodes.default.adopt(node)
    apps = server.nodes.default.apps
    installed = apps.installed()
    unmatched = apps.catalog.budget.unmatched(installed)
    apps.catalog.budget.warned.update(unmatched)  # --check reports them itself, not as a log line too
    apps.catalog.first_read_here()
    tools = server.tool_definitions(Request(server, None, {}, None, None))
    fewest = Server(None, dict(env, CALIMERO_MCP_TOOLSETS="core")).fixed_definitions
    return ToolCount(len(tools), sum(1 for t in tools if "_meta" not in t), len(fewest),
                     [app.id for app in installed if not apps.catalog.budget.admits(app)], unmatched)


# The flags (issue 44): each is its variable, set before anything reads the environment, so the two are one setting
# and a flag given wins. (flag, variable, value's name or None for a switch, what it sets)
Flag = namedtuple("Flag", "name variable value meaning")
FLAGS = (
    Flag("--node-url", "CALIMERO_NODE_URL", "URL", "the node's address; skips discovery"),
    Flag("--nodes", "CALIMERO_NODES", "LIST", "named nodes: name=url,name=url (ro),... (several nodes)"),
    Flag("--node-name", "CALIMERO_NODE_NAME", "NAME", "the node (or default node) by name"),
    Flag("--toolsets", "CALIMERO_MCP_TOOLSETS", "LIST", "core,blobs,governance (core always on; default all)"),
    Flag("--read-only", "CALIMERO_MCP_READ_ONLY", None, "only tools that cannot change the node"),
    Flag("--log-level", "CALIMERO_MCP_LOG_LEVEL", "LEVEL", "debug, info, warning or error (default info)"),
)
FLAG_NAMED = {flag.name: flag for flag in FLAGS}
ACTIONS = {"--check": "check", "-V": "version", "--version": "version", "-h": "help", "--help": "help"}
# The variables no flag sets, each with what it sets (README, Configuration, says more).
VARIABLES = (
    ("CALIMERO_NODE_HOME", "folder of node homes to scan (default ~/.calimero)"),
    ("CALIMERO_MCP_MULTI_NODE", "off: one node even when several are named"),
    ("CALIMERO_AUTH_TOKEN", "bearer token (with CALIMERO_REFRESH_TOKEN)"),
    ("CALIMERO_USERNAME", "login, with CALIMERO_PASSWORD or CALIMERO_PASSWORD_FILE"),
    ("CALIMERO_CA_BUNDLE", "PEM file of the CAs an https node is verified with"),
    ("CALIMERO_REGISTRY_URL", "the app registry (default: the node's config.toml)"),
    ("CALIMERO_MCP_APPS", "the apps that get tools (default every app)"),
    ("CALIMERO_MCP_STATE_DIR", "handoff file, token cache (default ~/.config/calimero/mcp)"),
    ("CALIMERO_MCP_TIMEOUT", "seconds a node request may take (default 10)"),
    ("CALIMERO_MCP_MAX_RESPONSE_BYTES", "bytes a node answer may hold (default 64 MiB)"),
    ("CALIMERO_MCP_MAX_RESULT_CHARS", "characters an app result may take (default 60000)"),
    ("CALIMERO_MCP_EVENTS", "off: no event stream from the node"),
)
PROJECT_URL = "https://github.com/calimero-network/mero-mcp"


class UsageError(Exception):
    """A command line we do not take: its one line goes to stderr, and the exit status is 2."""


def parse_arguments(argv):
    """(the action: "serve", "check", "version" or "help"; {variable: value} of the flags given). A flag's value
    follows it or its `=`; a switch takes none. Hand-rolled: argparse would add to every start."""
    action, settings, words = "serve", {}, list(argv)
    while words:
        word = words.pop(0)
        if word in ACTIONS:
            action = "help" if "help" in (action, ACTIONS[word]) else ACTIONS[word]
            continue
        name, equals, value = word.partition("=") if word.startswith("--") else (word, "", "")
        flag = FLAG_NAMED.get(name)
        if flag is None:
            shown = word if word and word.strip() == word and word.isprintable() else json.dumps(word)
            raise UsageError("unknown argument %s (mero-mcp --help lists the flags)" % shown[:200])
        if flag.value is None:
            if equals:
                raise UsageError("%s takes no value" % name)
            value = "1"
        elif not equals:
            if not words or words[0] in ACTIONS or words[0].split("=")[0] in FLAG_NAMED:
                raise UsageError("%s needs a value: %s %s" % (name, name, flag.value))
            value = words.pop(0)
        if not value.strip():
            raise UsageError("%s needs a value: %s %s" % (name, name, flag.value))
        settings[flag.variable] = value
    return action, settings


def flag_problem(settings):
    """What is wrong with a flag's value, in one line, or None: a flag the server could only half honour is refused
    at once (its variable is said on stderr at start, or by --check, and the server goes on)."""
    config = own_module("mero_node_config")
    levels = own_module("mero_node_errors").LOG_LEVELS
    checks = {
        "CALIMERO_MCP_LOG_LEVEL": lambda env: None if env["CALIMERO_MCP_LOG_LEVEL"].strip().lower() in levels else
        "%s is no level: %s" % (json.dumps(env["CALIMERO_MCP_LOG_LEVEL"]), ", ".join(levels)),
        "CALIMERO_MCP_TOOLSETS": lambda env: "%s. %s" % toolsets_problem(env) if toolsets_problem(env) else None,
        "CALIMERO_NODES": config.nodes_setting_problem,
        "CALIMERO_NODE_URL": lambda env: config._checked_node_url(env["CALIMERO_NODE_URL"]) and None,
    }
    for flag in FLAGS:
        if flag.variable in settings and flag.variable in checks:
            try:
                problem = checks[flag.variable]({flag.variable: settings[flag.variable]})
            except config.NodeError as error:
                problem = str(error)
            if problem:     # the variable's text, said of the flag given
                return problem.replace(flag.variable, flag.name) if flag.variable in problem else \
                    "%s %s" % (flag.name, problem)
    return None


def apply_flags(settings):
    """The flags' values become their variables, before anything reads one; --check is told which were flags."""
    if not settings:
        return
    os.environ.update(settings)
    try:
        own_module("mero_node_config").SET_BY_FLAG.update(
            {flag.variable: flag.name for flag in FLAGS if flag.variable in settings})
    except (ImportError, MissingLibrary):
        pass


def from_pyz():
    """Whether this runs from mero-mcp.pyz (unpacked or from the zip): its mark lies beside this file."""
    mark = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mero_mcp_pyz.json")
    if os.path.isfile(mark):
        return True
    try:
        __loader__.get_data(mark)
    except (OSError, AttributeError, NameError):
        return False
    return True


def started_as():
    """The command a host registers to start this very server: python3 with the pyz or mero_mcp.py, else the
    installed `mero-mcp` command."""
    started = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    if from_pyz() or started.endswith(".py"):
        return "python3 " + started
    return started if os.path.basename(started) == "mero-mcp" else "mero-mcp"


def usage():
    width = max(len("%s %s" % (flag.name, flag.value or "")) for flag in FLAGS) + 2
    flags = ["  %s%s  %s" % (("%s %s" % (f.name, f.value or "")).ljust(width), f.variable.ljust(23), f.meaning)
             for f in FLAGS]
    variables = ["  %s  %s" % (name.ljust(31), meaning) for name, meaning in VARIABLES]
    return "\n".join([
        "usage: mero-mcp [FLAG ...] [--check | -V | -h]", "",
        "An MCP server (stdio) for a Calimero node and the applications installed on it.",
        "Register it with your agent as the command: %s [FLAG ...]" % started_as(), "",
        "Flags (each sets its variable, and wins over it):",
    ] + flags + [
        "  %s%s" % ("--check".ljust(width + 25), "diagnose the setup: node, sign-in, health, apps, tool count"),
        "  %s%s" % ("-V, --version".ljust(width + 25), "print the version"),
        "  %s%s" % ("-h, --help".ljust(width + 25), "this text"), "",
        "Variables (no flag; a blank one is unset):",
    ] + variables + [
        "", "Logs go to stderr, never stdout. Documentation and bug reports: %s" % PROJECT_URL, ""])


def run_check():
    """`mero-mcp --check`: node.py's doctor, told which of our files are missing or from another release; without
    node.py (or requests) a report of what is missing, in the doctor's form."""
    modules = module_problems()
    try:
        doctor = __import__("node").check          # itself reports missing runtime packages
    except ImportError as error:
        problems = modules if error.name in OUR_MODULES else [(import_failure("node", error), "")] + modules
        sys.stdout.write("mero-mcp --check\nProblems:\n")
        for text, fix in problems:
            sys.stdout.write("  - %s\n" % text + ("    Fix: %s\n" % fix if fix else ""))
        sys.stdout.write("Result:    the server cannot work until the problems above are fixed.\n")
        return 1
    return doctor(os.environ, sys.stdout, mode=read_only_mode(os.environ), count_tools=count_tools,
                  toolsets=toolsets_problem(os.environ), modules=modules)


def nodes_problem(env):
    """A bad CALIMERO_NODES entry stops start-up with the configuration's one line (mero_node_config, read only
    when the variable is set); without that module the start-up log says so."""
    if not (env.get("CALIMERO_NODES") or "").strip():
        return None
    try:
        return own_module("mero_node_config").nodes_setting_problem(env)
    except (ImportError, MissingLibrary, AttributeError):
        return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if sys.stderr is None:               # spawned with stderr closed (2>&-): log lines go nowhere, answers go on
        sys.stderr = open(os.devnull, "w")
    try:
        action, settings = parse_arguments(argv)
        try:
            problem = flag_problem(settings) if settings else None
        except (ImportError, MissingLibrary):    # a module of ours missing: start-up or --check says which
            problem = None
        if problem:
            raise UsageError(problem)
    except UsageError as error:
        sys.stderr.write("mero-mcp: %s\n" % error)
        return 2
    apply_flags(settings)
    if action == "help":
        sys.stdout.write(usage())
        return 0
    if action == "version":
        sys.stdout.write("mero-mcp %s\n" % __version__)
        return 0
    if action == "check":
        _settings_said_by_check.append(True)
        try:
            code = run_check()
            sys.stdout.flush()
            return code
        except BrokenPipeError:          # `--check | head`: the reader has what it wanted
            quiet_exit(1)
    problem = nodes_problem(os.environ)
    if problem:
        sys.stderr.write("mero-mcp: %s\n" % problem)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: quiet_exit(0))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr              # a stray print can never corrupt the protocol stream
    log.info("ready on stdio; the node connects when a client opens the connection")
    level_problem = log_level_problem()
    if level_problem:
        log.warning("%s", level_problem)
    for problem, fix in module_problems():
        log.warning("%s. %s", problem, fix)
    serve(stdin, stdout)
    quiet_exit(0)


def log_level_problem():
    try:
        return own_module("mero_node_errors").log_threshold(os.environ)[1]
    except (ImportError, MissingLibrary):
        return None


if __name__ == "__main__":
    sys.exit(main())
