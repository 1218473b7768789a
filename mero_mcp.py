#!/usr/bin/env python3
"""mero-mcp: a Model Context Protocol server (stdio) for a Calimero node and every app installed on it.

Sections: constants · framing · protocol · tool table · fixed tools · apps · resources · main.
The node is reached through node.py and ABIs are mapped by abi.py; both are imported lazily so that
the `initialize` answer costs little more than starting the interpreter.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
import traceback
from collections import namedtuple

# ── Constants ─────────────────────────────────────────────────────────────────────────────────────

__version__ = "0.1.0"
SERVER_INFO = {"name": "mero-mcp", "version": __version__}

# Handshake era (initialize), newest first; batches exist only in 2025-03-26 (mcp-protocol.md §3).
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
BATCH_VERSION = "2025-03-26"
# Modern era: stateless, the version rides in every request's _meta (mcp-protocol.md §10).
MODERN_VERSIONS = ("2026-07-28",)
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

INSTRUCTIONS = (
    "Calimero apps describe themselves. Do not read app source. To use an app: list_applications, "
    "then describe_app to plan or select_app to act, then pass the returned app_handle on every app tool call."
)
CAPABILITIES = {"tools": {"listChanged": True}, "resources": {"listChanged": True}}
LIST_TTL_MS = 30000          # tools/resources lists: matches the catalog poll
GUIDE_TTL_MS = 86400000      # a guide uri names one app version, so it may be cached for a day
CALL_MANY_LIMIT = 32
MAX_LINE_BYTES = 16 * 1024 * 1024

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
RESOURCE_NOT_FOUND = -32002            # handshake era; the modern era uses INVALID_PARAMS
UNSUPPORTED_VERSION = -32022

log = logging.getLogger("mero-mcp")


class RpcError(Exception):
    """A JSON-RPC error: becomes the `error` member of the response."""

    def __init__(self, code, message, data=None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data

    def to_json(self):
        error = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ToolError(Exception):
    """A tool failure the agent should read: becomes an `isError` result (guide blocks, then the text)."""

    def __init__(self, text, blocks=()):
        super().__init__(text)
        self.text, self.blocks = text, tuple(blocks)


# ── Framing: one JSON message per line on stdout, under one lock ─────────────────────────────────

class Channel:
    """Owns the real stdout. Everything written there goes through send()."""

    def __init__(self, stream):
        self.stream = stream
        self.lock = threading.Lock()

    def send(self, message):
        line = encode_message(message)
        with self.lock:
            self.stream.write(line)
            self.stream.flush()


def encode_message(message):
    """Compact UTF-8 JSON plus newline; json escapes newlines inside strings, so one message is one line."""
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:   # a lone surrogate echoed back from input: escape everything instead
        return json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"


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


# ── Protocol ──────────────────────────────────────────────────────────────────────────────────────

Call = namedtuple("Call", "server request_id meta modern progress_token cancelled")


def is_valid_id(value):
    # MCP ids are strings or integers, never null; bool is an int to Python but not to JSON.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def response(request_id, result):
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id, error):
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_json()}


class Server:
    """One stdio connection: what it negotiated, and the handlers for each method."""

    def __init__(self, channel, env=None):
        self.channel = channel
        self.env = os.environ if env is None else env
        self.version = None                  # negotiated handshake version, None until initialize
        self.initialized = False
        self.cancelled = {}                  # request id -> threading.Event, for in-flight requests
        self.cancel_lock = threading.Lock()
        self.toolsets = enabled_toolsets(self.env)
        self.fixed_tools = [t for t in FIXED_TOOLS if t.toolset in self.toolsets] + list(APP_TOOLS)
        self._node = None
        self._node_lock = threading.Lock()
        self.apps = Apps(self)               # catalog, admission, guides: loaded off the answer path
        self.after_answer = []               # work to run once an answer is on the wire

    # ---- the node, created lazily (node.py imports requests) ----
    @property
    def node(self):
        with self._node_lock:
            if self._node is None:
                import node as node_module
                self._node = node_module.Node(self.env)
            return self._node

    # ---- entry point for one stdin line ----
    def handle_line(self, raw):
        """Answer one stdin line (a message or a batch); returns nothing, sends what is due."""
        try:
            message = parse_line(raw)
        except RpcError as error:
            self.channel.send(error_response(None, error))
            return
        if isinstance(message, list):
            self.handle_batch(message)
            return
        reply = self.handle_message(message)
        if reply is not None:
            self.channel.send(reply)
        self.run_after_answer()

    def handle_batch(self, batch):
        if self.version != BATCH_VERSION or not batch:
            reason = "Empty batch" if not batch else (
                "Batches are only served when protocol version %s was negotiated" % BATCH_VERSION)
            self.channel.send(error_response(None, RpcError(INVALID_REQUEST, reason)))
            return
        replies = [self.handle_message(item, in_batch=True) for item in batch]
        replies = [r for r in replies if r is not None]
        if replies:
            self.channel.send(replies)
        self.run_after_answer()

    def handle_message(self, message, in_batch=False):
        """The response for one message, or None (notifications and stray responses get none)."""
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
        try:
            result = self.dispatch(message, in_batch)
            return response(request_id, result)
        except RpcError as error:
            return error_response(request_id, error)
        except Exception:                # a bug of ours: the client gets a short message, stderr the traceback
            log.error("internal error in %s:\n%s", message.get("method"), traceback.format_exc())
            return error_response(request_id, RpcError(INTERNAL_ERROR, "Internal error"))
        finally:
            with self.cancel_lock:
                self.cancelled.pop(request_id, None)

    def handle_notification(self, message):
        method, params = message.get("method"), message.get("params")
        if method == "notifications/initialized":
            self.initialized = True
        elif method == "notifications/cancelled" and isinstance(params, dict):
            self.cancel(params.get("requestId"))
        # Anything else (unknown notifications, bad params) is ignored: notifications are never answered.

    def cancel(self, request_id):
        if not is_valid_id(request_id):
            return
        with self.cancel_lock:
            event = self.cancelled.get(request_id)
        if event is not None:
            event.set()

    def dispatch(self, message, in_batch):
        method, params = message["method"], message.get("params", {})
        if not isinstance(method, str):
            raise RpcError(INVALID_REQUEST, "method must be a string")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        modern = self.request_era(meta, method)
        handler = (MODERN_METHODS if modern else HANDSHAKE_METHODS).get(method)
        if handler is None:
            raise RpcError(METHOD_NOT_FOUND, "Method not found: %s" % method)
        if method == "initialize" and in_batch:
            raise RpcError(INVALID_REQUEST, "initialize must not be part of a batch")
        event = threading.Event()
        with self.cancel_lock:
            self.cancelled[message["id"]] = event
        call = Call(self, message["id"], meta, modern, meta.get("progressToken"), event)
        result = handler(self, params, call)
        if modern:
            result = modern_result(method, result)
        return result

    def request_era(self, meta, method):
        """True for a modern-era request; raises -32022 for a version we do not serve."""
        version = meta.get(META_VERSION)
        if version is None:
            return method == "server/discover"
        if version in MODERN_VERSIONS:
            return True
        raise RpcError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                       {"supported": list(MODERN_VERSIONS + HANDSHAKE_VERSIONS), "requested": version})

    def wraps_output(self, call):
        """Handshake-era clients need object output schemas, so non-object returns ride as {result}."""
        return not call.modern

    def run_after_answer(self):
        while self.after_answer:
            self.after_answer.pop(0)()

    # ---- tools ----
    def tool_definitions(self, call):
        wrap = self.wraps_output(call)
        return [tool_definition(t, wrap) for t in self.all_tools()]

    def all_tools(self):
        return self.fixed_tools + self.apps.generated_tools()

    def find_tool(self, name):
        for t in self.fixed_tools:
            if t.name == name:
                return t
        return self.apps.generated_tool(name)

    def start_catalog(self):
        self.apps.start()

    def resource_list(self):
        return self.apps.guide_resources()

    def read_resource(self, uri):
        return self.apps.read_guide(uri)

    def run_tool(self, t, arguments, call):
        """Run a tool; every failure that is not a bug of ours becomes an isError result."""
        import node as node_module
        try:
            problems = check_fixed_arguments(t, arguments)
            if problems:
                raise ToolError("Invalid arguments for %s:\n%s" % (t.name, "\n".join(problems)))
            with self.node.traced(traceparent_of(call.meta)):
                value = t.handler(arguments, call)
        except ToolError as error:
            return error_result(error.text, error.blocks)
        except node_module.NodeError as error:
            return error_result(str(error))
        return render_result(value)

    def notify(self, method, params=None):
        message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.channel.send(message)


def parse_line(raw):
    if raw is None:
        raise RpcError(PARSE_ERROR, "Parse error: message longer than %d bytes" % MAX_LINE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RpcError(PARSE_ERROR, "Parse error: not UTF-8 (%s)" % error.reason) from None
    try:
        return json.loads(text)
    except RecursionError:
        raise RpcError(PARSE_ERROR, "Parse error: nested too deeply") from None
    except ValueError as error:
        raise RpcError(PARSE_ERROR, "Parse error: %s" % error) from None


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


# ---- method handlers ----

def on_initialize(server, params, call):
    requested = params.get("protocolVersion")
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
    server.version = version
    server.after_answer.append(server.start_catalog)
    return {"protocolVersion": version, "capabilities": CAPABILITIES,
            "serverInfo": SERVER_INFO, "instructions": INSTRUCTIONS}


def on_discover(server, params, call):
    server.after_answer.append(server.start_catalog)
    return {"supportedVersions": list(MODERN_VERSIONS + HANDSHAKE_VERSIONS), "capabilities": CAPABILITIES,
            "instructions": INSTRUCTIONS, "ttlMs": LIST_TTL_MS, "cacheScope": "private"}


def on_ping(server, params, call):
    return {}


def on_tools_list(server, params, call):
    check_cursor(params)
    return {"tools": server.tool_definitions(call)}


def on_tools_call(server, params, call):
    name, arguments = params.get("name"), params.get("arguments", {})
    if not isinstance(name, str):
        raise RpcError(INVALID_PARAMS, "tools/call needs a tool name (string)")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "tools/call arguments must be an object")
    tool = server.find_tool(name)
    if tool is None:
        raise RpcError(INVALID_PARAMS, "Unknown tool: %s" % name)
    return server.run_tool(tool, arguments, call)


def on_resources_list(server, params, call):
    check_cursor(params)
    return {"resources": server.resource_list()}


def on_resource_templates(server, params, call):
    check_cursor(params)
    return {"resourceTemplates": [GUIDE_TEMPLATE]}


def on_resources_read(server, params, call):
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise RpcError(INVALID_PARAMS, "resources/read needs a uri (string)")
    contents = server.read_resource(uri)
    if contents is None:
        code = INVALID_PARAMS if call.modern else RESOURCE_NOT_FOUND
        raise RpcError(code, "Resource not found: %s" % uri, {"uri": uri})
    return {"contents": contents}


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
MODERN_METHODS = dict(COMMON_METHODS)       # 2026-07-28 removed initialize and ping


# ── The tool table ────────────────────────────────────────────────────────────────────────────────

Tool = namedtuple("Tool", "name title description input_schema output_schema annotations meta toolset handler")
ToolResult = namedtuple("ToolResult", "content structured is_error")

TOOLSETS = ("core", "blobs", "governance")
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
READ_ONLY = {"readOnlyHint": True}
DESTRUCTIVE = {"readOnlyHint": False, "destructiveHint": True}


def enabled_toolsets(env):
    """CALIMERO_MCP_TOOLSETS: comma-separated; unset or `all` means every toolset; core is always on."""
    raw = (env.get("CALIMERO_MCP_TOOLSETS") or "").strip()
    if not raw or raw == "all":
        return set(TOOLSETS)
    names = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = sorted(names - set(TOOLSETS) - {"all"})
    if unknown:
        log.warning("CALIMERO_MCP_TOOLSETS names unknown toolsets %s; known: %s",
                    ", ".join(unknown), ", ".join(TOOLSETS))
    if "all" in names:
        return set(TOOLSETS)
    return (names & set(TOOLSETS)) | {"core"}


def tool(name, description, properties=None, required=(), annotations=None, toolset="core", title=None):
    """Declare a fixed tool; the decorated function is its handler."""
    schema = NO_ARGS if not properties else {"type": "object", "properties": properties,
                                              "required": list(required)}
    if not required and properties:
        del schema["required"]

    def register(handler):
        TOOL_REGISTRY.append(Tool(name, title, description, schema, None, annotations, None, toolset, handler))
        return handler
    return register


TOOL_REGISTRY = []


def tool_definition(t, wrap):
    """The tools/list entry for one tool."""
    definition = {"name": t.name}
    if t.title:
        definition["title"] = t.title
    definition["description"] = t.description
    definition["inputSchema"] = t.input_schema
    output = t.output_schema(wrap) if callable(t.output_schema) else t.output_schema
    if output is not None:
        definition["outputSchema"] = output
    if t.annotations:
        definition["annotations"] = t.annotations
    if t.meta:
        definition["_meta"] = t.meta
    return definition


def traceparent_of(meta):
    value = meta.get("traceparent")
    return value if isinstance(value, str) else None


def error_result(text, blocks=()):
    content = list(blocks) + [{"type": "text", "text": "Error: " + text if not blocks else text}]
    return {"content": content, "isError": True}


def render_result(value):
    """A handler's value as a CallToolResult: strings as text; objects as JSON text plus structuredContent."""
    if isinstance(value, dict) and "content" in value and isinstance(value.get("content"), list):
        return value                      # already a CallToolResult (guide blocks and the like)
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}]}
    result = {"content": [{"type": "text", "text": json.dumps(value, indent=2, ensure_ascii=False)}]}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


_fixed_validators = {}


def check_fixed_arguments(t, arguments):
    """Validate a fixed tool's arguments against its declared schema (generated tools validate themselves)."""
    if t.toolset is None:
        return []
    validator = _fixed_validators.get(t.name)
    if validator is None:
        from jsonschema import Draft202012Validator
        validator = _fixed_validators[t.name] = Draft202012Validator(t.input_schema)
    problems = []
    for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "arguments"
        problems.append("- %s: %s" % (path, error.message))
    return problems


# ── Fixed tools: core ─────────────────────────────────────────────────────────────────────────────

@tool("node_status", "Health and identity of the node this session is connected to: health, url, nodeName, "
      "discoverySource and authMode. An unreachable node is reported here rather than as an error, so this is "
      "the right first call of a session.", annotations=READ_ONLY)
def node_status(args, call):
    return call.server.node.status()


FIXED_TOOLS = TOOL_REGISTRY
APP_TOOLS = []


# ── Apps: catalog, generated tools (filled by the app-tools section) ──────────────────────────────

class Apps:
    """The installed applications as this server sees them (filled by the app-tools section)."""

    def __init__(self, server):
        self.server = server

    def start(self):
        pass

    def generated_tools(self):
        return []

    def generated_tool(self, name):
        return None

    def guide_resources(self):
        return []

    def read_guide(self, uri):
        return None


# ── Resources: app guides ─────────────────────────────────────────────────────────────────────────

GUIDE_TEMPLATE = {"uriTemplate": "calimero://apps/{applicationId}/{version}/guide", "name": "app-guide",
                  "title": "Application guide",
                  "description": "The author's guide of one installed application version.",
                  "mimeType": "text/markdown"}


# ── main ──────────────────────────────────────────────────────────────────────────────────────────

USAGE = """usage: mero-mcp [--check | --version | --help]

An MCP server (stdio) for a Calimero node and the applications installed on it.
Register it with your agent as the command `python3 /path/to/mero_mcp.py` (or `mero-mcp`).

  --check     diagnose the setup: which node is found, authentication, health, installed apps
  --version   print the version
  --help      this text

Configuration is by environment variable; see README.md.
"""


def setup_logging():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[mero-mcp] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def quiet_exit(code=0):
    """Leave at once: no traceback, no waiting on worker threads (the client is gone or asked us to stop)."""
    try:
        sys.stderr.flush()
    finally:
        os._exit(code)


def reader(stream, inbox, server):
    """stdin on its own thread, so a cancel is seen while a call runs; EOF ends the process."""
    for raw in read_lines(stream):
        if raw is not None and b"notifications/cancelled" in raw:
            try:
                message = json.loads(raw)
                if isinstance(message, dict) and message.get("method") == "notifications/cancelled":
                    server.handle_notification(message)
                    continue
            except ValueError:
                pass
        inbox.put(raw)
    inbox.put(EOF)


EOF = object()


def serve(stdin, stdout):
    channel = Channel(stdout)
    server = Server(channel)
    inbox = queue.Queue()
    threading.Thread(target=reader, args=(stdin, inbox, server), name="stdin", daemon=True).start()
    while True:
        raw = inbox.get()
        if raw is EOF:
            return
        server.handle_line(raw)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        sys.stdout.write(USAGE)
        return 0
    if "--version" in argv:
        sys.stdout.write("mero-mcp %s\n" % __version__)
        return 0
    setup_logging()
    if "--check" in argv:
        import node as node_module
        return node_module.check(os.environ, sys.stdout)
    if argv:
        sys.stderr.write("mero-mcp: unknown argument %s\n%s" % (argv[0], USAGE))
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: quiet_exit(0))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr              # a stray print can never corrupt the protocol stream
    log.info("ready on stdio; the node connects when a client opens the connection")
    serve(stdin, stdout)
    quiet_exit(0)


if __name__ == "__main__":
    sys.exit(main())
