"""The runtime every tool of mero-mcp runs in: constants and errors, our sibling modules, the per-call `Request`,
the tool record and the pipeline its arguments and results go through.

Imported by mero_apps, mero_tools and mero_mcp; imports none of them (imports go only downward).
"""
import json
import os
import sys
import threading
from collections import namedtuple


# ── 1. Constants and errors ─────────────────────────────────────────────────────────────────────────────────

__version__ = "0.1.0"
SERVER_INFO = {"name": "mero-mcp", "version": __version__}

# Handshake era (initialize), newest first; batches exist only in 2025-03-26 (mcp-protocol.md §3).
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
BATCH_VERSION = "2025-03-26"
# Modern era: stateless, the version rides in every request's _meta (mcp-protocol.md §10).
MODERN_VERSIONS = ("2026-07-28",)
SUPPORTED_VERSIONS = MODERN_VERSIONS + HANDSHAKE_VERSIONS
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"

# What a host shows before any tool: Claude Code loads only tool names and these at start, and cuts them at 2,048
# characters, so the critical part comes first. One line per topic; a mode adds its own line at the end (Server).
INSTRUCTION_LINES = (
    # reference-behaviour.md's flow, with the one thing that stands in for a handle (issue 42: read literally,
    # "pass the app_handle on every app tool call" contradicted a later line)
    "Calimero apps describe themselves. Do not read app source. To use an app: list_applications, then "
    "describe_app to plan or select_app to act, then pass the returned app_handle on every app tool call, or "
    "_context (the context to act in) instead of one.",
    "call runs any method of any installed app by name (args keyed by parameter name), and call_many runs up to "
    "32 calls at once: they reach every method even when no tool for it is listed, as for an app installed during "
    "this session or a host that caps or defers tools. describe_app lists an app's methods.",
    "A handle's tool runs in the context the handle names; call takes app and context.",
    "Name an app by its id, package, last package segment or display name, a context by its id or an alias (aliases are "
    "per node), and a namespace or group by its id or name.",
    "App tools are named <app>_<method> (<app>_<service>_<method> for a multi-service app); each description "
    "ends in the method's signature: [view] reads, [mut] writes, ? marks an optional parameter.",
    "Contexts live in namespaces (create_namespace, then create_context); other nodes join with "
    "invite_to_namespace and join_namespace, then join_context. When a tool cannot reach a node, list_nodes and "
    "node_status say why and what to do.",
)
INSTRUCTIONS = "\n".join(INSTRUCTION_LINES)
# Both eras: the handshake era hears list changes on the session, 2026-07-28 on subscriptions/listen.
CAPABILITIES = {"tools": {"listChanged": True}, "resources": {"listChanged": True}}
TOOLS_CHANGED = "notifications/tools/list_changed"
RESOURCES_CHANGED = "notifications/resources/list_changed"
# The subscriptions/listen filter fields we honour (no prompts; a guide uri names one version, so no updates).
LISTEN_FILTERS = {"toolsListChanged": TOOLS_CHANGED, "resourcesListChanged": RESOURCES_CHANGED}
LIST_TTL_MS = 30000          # tools/resources lists: matches the catalog poll
GUIDE_TTL_MS = 86400000      # a guide uri names one app version, so it may be cached for a day
CALL_MANY_LIMIT = 32
MAX_LINE_BYTES = 16 * 1024 * 1024   # one message is held whole while parsed: this bounds what a line can cost
MAX_BLOB_BYTES = MAX_LINE_BYTES // 4 * 3 - 1024   # base64 takes 4 characters per 3 bytes; 1 KiB for the framing
EOF_GRACE_SECONDS = 0.8      # "exit within a second when stdin closes", even with a call in flight

TEXT_BOUND = 60000          # characters of text in one answer: well under Claude Code's 25,000-token reject

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700, -32600, -32601, -32602, -32603)
RESOURCE_NOT_FOUND = -32002            # handshake era; the modern era uses INVALID_PARAMS
UNSUPPORTED_VERSION = -32022

class StderrLog:
    """`[mero-mcp]` lines on stderr, those below CALIMERO_MCP_LOG_LEVEL (mero_node_errors.log_threshold, read at the
    first line: main has applied the flags by then) left out. node.py logs through `logging` with the same prefix
    and threshold, set up on its first line."""

    threshold = None

    def write(self, level, message, args):
        if self.threshold is None:
            try:
                self.threshold = own_module("mero_node_errors").log_threshold(os.environ)[0]
            except (ImportError, MissingLibrary):
                self.threshold = 20
        if level < self.threshold:
            return
        try:
            sys.stderr.write("[mero-mcp] %s\n" % without_secrets(message % args if args else message))
            sys.stderr.flush()
        except (OSError, AttributeError, ValueError):   # the host closed our stderr: logs are a courtesy
            pass

    def debug(self, message, *args):
        self.write(10, message, args)

    def info(self, message, *args):
        self.write(20, message, args)

    def warning(self, message, *args):
        self.write(30, message, args)

    def error(self, message, *args):
        self.write(40, message, args)


log = StderrLog()


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


class MissingLibrary(ToolError):
    """node.py or abi.py, or a package they need, cannot be imported: a tool's isError, not an internal error."""


class Refusal(ToolError):
    """A refused call: guide blocks, then the retry text, and nothing ran (reference §3.0)."""


class Cancelled(Exception):
    """The client cancelled the request: what has not reached the node yet does not go."""


# ── 2. Our modules: node.py and abi.py loaded lazily from beside this file (or the zip it runs from) ──────────

_loaded = {}
_loading = threading.Lock()


def heavy(name):
    """node.py (with requests) or abi.py (with jsonschema), imported on first use, by one thread at a time.

    Answering `initialize` must pay for neither. And two threads importing those intertwined packages at the
    same moment can trip importlib's deadlock detection, so the imports take turns."""
    module = _loaded.get(name)
    if module is None:
        with _loading:
            module = _loaded.get(name)
            if module is None:
                try:
                    module = own_module(name)
                    module.preload()
                except ImportError as error:     # every tool that needs it says which package, and how to fix
                    raise MissingLibrary(import_failure(name, error)) from None
                _loaded[name] = module
    return module


def own_module(name):
    """node.py or abi.py as found beside this file (never another folder's), not yet asked for its package: abi.py
    imports jsonschema only to validate, and listing tools must not pay for it."""
    if name not in _found_beside:
        if file_version(own_file(name)) is None:
            raise MissingLibrary(import_failure(name, ImportError(name=name)))
        _found_beside.add(name)
    return __import__(name)


_found_beside = set()

PACKAGE_OF = {"node": "requests", "abi": "jsonschema"}
# Every module of ours, the entry first and each above what it imports (setup.cfg's py_modules, the pyz, the mcpb).
OUR_MODULES = ("mero_mcp", "mero_governance", "mero_tools", "mero_apps", "mero_runtime", "node", "mero_node_events", "mero_node_http",
               "mero_node_config", "mero_node_errors", "abi")
TOGETHER = ("mero-mcp's modules travel together (mero_mcp.py, the mero_*.py beside it, node.py and abi.py): copy them "
            "all, from one release, into one folder, or install the checkout with pip.")


def import_failure(name, error):
    """Why `name` cannot be loaded: a runtime package is missing (node.py words that), or one of our own files."""
    if error.name not in OUR_MODULES:
        try:
            return __import__("node").missing_package(PACKAGE_OF[name], error)
        except ImportError as missing:
            error = missing
    missing = [text for text, _ in module_problems() if text.startswith(MISSING_MARK)]
    if missing:
        return "%s. %s" % (missing[0], TOGETHER)
    return "%s.py cannot be imported (%s). %s" % (error.name, error, TOGETHER)


MISSING_MARK = "Missing beside mero_mcp.py: "


def module_problems():
    """[(problem, fix)]: a module of ours missing beside this file, or from another release (an older node.py
    beside a newer mero_mcp.py). Read as text, not imported, so --check and the start-up log name every file, and
    cost neither requests nor jsonschema."""
    missing, problems = [], []
    for name in OUR_MODULES:
        path = own_file(name)
        version = file_version(path)
        if version is None:
            missing.append(name + ".py")
        elif version != __version__:
            problems.append(("%s is from mero-mcp %s, this mero_runtime.py from %s: one may call what the other lacks"
                             % (path, version or "a release older than 0.1.0", __version__), TOGETHER))
    if missing:
        problems.insert(0, ("%s%s (in %s)" % (MISSING_MARK, listed(missing), os.path.dirname(own_file(""))),
                            TOGETHER))
    return problems


def listed(names):
    """a, b and c"""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1])))


def own_file(name):
    """Where our module `name` must be: beside this file (a checkout, a copy, or site-packages after pip)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")


def file_version(path):
    """The `__version__ = "..."` a module file of ours states near its top; "" when it states none, None when the file
    cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as source:
            return stated_version(zip(range(VERSION_WITHIN), source))   # read at every start: the head only
    except OSError:
        pass
    try:                                 # a member of the zip this file runs from (the pyz run as is): its loader reads it
        text = __loader__.get_data(path).decode("utf-8", "replace")
    except (OSError, AttributeError):
        return None
    return stated_version(enumerate(text.splitlines()[:VERSION_WITHIN]))


def stated_version(numbered_lines):
    for _, line in numbered_lines:
        if line.startswith("__version__ = "):
            return line.split("=", 1)[1].strip().strip("\"'")
    return ""


VERSION_WITHIN = 100     # lines: where node.py and abi.py state their __version__


def node_module():
    return heavy("node")


def without_secrets(text):
    """`text` without any secret this process has sent to the node or the registry (node.py keeps them, once
    loaded: before that nothing was sent)."""
    node = sys.modules.get("node")
    return node.redacted(text) if node is not None and hasattr(node, "redacted") else text


# ── 3. The per-call request: its binding to a thread, its read memo, its helper threads ───────────────────────────

class Request:
    """What one request owns and no other sees: its protocol version, its cancel ticket, its read memo. The thread
    that runs a tool call binds it (`bound`), and call_many binds it on each pool thread, so what a call reads
    or decides never reaches another call (DEVELOPERS.md: what runs beside what)."""

    __slots__ = ("server", "request_id", "meta", "version", "ticket", "reads", "named", "entry")

    def __init__(self, server, request_id, meta, version, ticket):
        self.server, self.request_id, self.meta, self.version = server, request_id, meta, version
        self.ticket = ticket                 # set once the client cancels the request
        self.reads = None                    # a Reads while a scope of this call shares its node reads
        self.named = {}                      # argument -> the Carrier a namespace or group name resolved to
        self.entry = None                    # the NodeEntry a tool call resolved (run_tool): the node it runs on

    @property
    def node(self):
        """The node this call runs on: the only node a handler talks to."""
        return self.entry.node

    @property
    def apps(self):
        """That node's app model (its records, ABIs, contexts, handles)."""
        return self.entry.apps

    @property
    def modern(self):
        return self.version in MODERN_VERSIONS

    @property
    def progress_token(self):
        return self.meta.get("progressToken")

    @property
    def traceparent(self):
        value = self.meta.get("traceparent")
        return value if isinstance(value, str) else None

    def reading(self):
        """A scope within which each node read of this call is made once (a nested scope shares the outer one)."""
        return Reading(self)


class Reading:
    def __init__(self, request):
        self.request, self.outer = request, None

    def __enter__(self):
        self.outer = self.request.reads
        if self.outer is None:
            self.request.reads = Reads()
        return self.request.reads

    def __exit__(self, *exc_info):
        self.request.reads = self.outer


_bound = threading.local()


def current_request():
    """The request this thread runs now, or None (the catalog's threads, --check)."""
    return getattr(_bound, "request", None)


class bound:
    """Bind a request to this thread for the `with` block (the previous binding comes back after)."""

    def __init__(self, request):
        self.request, self.previous = request, None

    def __enter__(self):
        self.previous, _bound.request = current_request(), self.request
        return self.request

    def __exit__(self, *exc_info):
        _bound.request = self.previous


# Enough for each of call_many's items to overlap its usual three requests; more wait, or run on the asking thread.
HELPER_THREADS = 2 * CALL_MANY_LIMIT + 8
_helper_pool = []
_helper_pool_lock = threading.Lock()


def together(*thunks):
    """Run the thunks at once and return their results in order: the first on this thread, the others on helper
    threads that run as part of this thread's request (its read memo, cancel ticket and traceparent: the node
    scope). A thunk no helper has started by the time this thread is free runs here, so a busy pool serialises
    but never deadlocks. The first exception, in thunk order, is raised once every thunk has ended."""
    if len(thunks) < 2:
        return [thunk() for thunk in thunks]
    request, scope = current_request(), node_module().current_scope()
    futures = [helper_pool().submit(as_part_of, request, scope, thunk) for thunk in thunks[1:]]
    outcomes = [settled(thunks[0])]
    for future, thunk in zip(futures, thunks[1:]):
        outcomes.append(settled(thunk) if future.cancel() else settled(future.result))
    for _, error in outcomes:
        if error is not None:
            raise error
    return [value for value, _ in outcomes]


def as_part_of(request, scope, thunk):
    """Run `thunk` on this helper thread inside `request`: bound to it, in its node scope (`scope`, the calling
    thread's: its traceparent and cancel ticket)."""
    with bound(request), node_module().scope(scope):
        return thunk()


def settled(thunk):
    try:
        return thunk(), None
    except Exception as error:
        return None, error


def helper_pool():
    with _helper_pool_lock:
        if not _helper_pool:
            from concurrent.futures import ThreadPoolExecutor
            _helper_pool.append(ThreadPoolExecutor(max_workers=HELPER_THREADS, thread_name_prefix="helper"))
        return _helper_pool[0]


# ── 4. Tool runtime: the tool record, settings, arguments, results ────────────────────────────────────────────────

# kind: what runs around the handler (KINDS); synonyms: argument names taken without being advertised;
# id_arguments: {argument: "namespace" | "group"}, the names run_tool turns into ids before the handler runs;
# nodes: what it needs of the nodes (NODE_NEEDS). One record says it all: run_tool and tools/list read these.
Tool = namedtuple("Tool", "name title description input_schema output_schema annotations meta toolset kind synonyms "
                          "id_arguments handler nodes", defaults=("one",))
# - one: runs on one node, the call's (multi mode: it takes `node`), and its answer says which (said_where);
# - none: talks to no one node (list_nodes): takes no `node`, and its rows name each node;
# - each: compares several nodes (wait_for_sync): offered in multi-node mode only, and its rows name each node.
NODE_NEEDS = ("one", "none", "each")
# What a handler returns when it adds to the answer beyond its value: the nodes its work ran on (call_many's items,
# which may each name another node than the call's own).
Reply = namedtuple("Reply", "value ran_on")
# What the tool runtime does around each kind of tool's handler, in one place:
# - checked: its arguments are read here (null optionals dropped, nested keys and the schema checked, names
#   resolved to ids); the others check theirs after admission, and per item (reference §3.12, §3.13).
# - bounded: its answer is cut to TEXT_BOUND; an app's data comes back whole or refused (refuse_oversized).
# - whole_call_reads: one memo of node reads spans the whole call (a fixed tool reads fresh after it writes).
# - always_offered: offered in read-only mode whatever its annotations (it runs [view] methods only there).
ToolKind = namedtuple("ToolKind", "checked bounded whole_call_reads always_offered")
KINDS = {
    "fixed": ToolKind(checked=True, bounded=True, whole_call_reads=False, always_offered=False),
    "app-call": ToolKind(checked=False, bounded=False, whole_call_reads=True, always_offered=True),
    "generated": ToolKind(checked=False, bounded=False, whole_call_reads=True, always_offered=False),
}

TOOLSETS = ("core", "blobs", "governance")
NO_ARGS = {"type": "object", "additionalProperties": False}      # mcp-protocol.md's form for no arguments
READ_ONLY = {"readOnlyHint": True}
# A write that destroys nothing: said explicitly, since MCP's default for a tool that is not read-only is
# destructiveHint true, which would blur the line tools.md draws.
WRITES = {"readOnlyHint": False, "destructiveHint": False}
DESTRUCTIVE = {"readOnlyHint": False, "destructiveHint": True}
DESTRUCTIVE_IDEMPOTENT = dict(DESTRUCTIVE, idempotentHint=True)
# The key that marks a property taking a namespace or a group (NAMESPACE_ID, GROUP_ID): tool() takes it out of what
# tools/list shows and records the argument, which run_tool resolves from a name to the id before the handler runs.
NAMES = "names"


def tool(name, description, properties=None, required=(), annotations=None, toolset="core", kind="fixed",
         synonyms=(), nodes="one"):
    """Declare a fixed tool; the decorated function is its handler. Its title is its name in words (hosts show
    titles in their tool pickers), as the generated tools' titles are."""
    schema, named = NO_ARGS, {}
    if properties:
        properties, named = unmarked(properties)
        schema = {"type": "object", "properties": properties}
        if required:
            schema["required"] = list(required)
    title = name.replace("_", " ").capitalize()
    annotations = annotations or WRITES

    def register(handler):
        assert nodes in NODE_NEEDS, nodes
        made = Tool(name, title, description, schema, None, annotations, None, toolset, kind, tuple(synonyms),
                    named, handler, nodes)
        # tools.md's order by toolset, declaration order within one, whichever module declares it first
        rank = LISTED_ORDER.index(toolset)
        place = sum(1 for listed in FIXED_TOOLS if LISTED_ORDER.index(listed.toolset) <= rank)
        FIXED_TOOLS.insert(place, made)
        return handler
    return register


FIXED_TOOLS = []                # filled by @tool, in LISTED_ORDER
LISTED_ORDER = TOOLSETS + ("app",)
NODE_ARGUMENT = {"type": "string"}           # no enum (names change) and no description: the instructions say it
MULTI_NODE_INSTRUCTION = ("Several nodes: every tool but list_nodes takes node (a name from list_nodes; an app tool "
                          "whose method has its own node parameter passes that to the app: use call then); a call "
                          "runs on its node, else where its app_handle was made, else on the default node, %s. "
                          "Between these nodes, join_namespace on the joiner with from (a member node) needs no "
                          "invitation.")


def with_node_argument(t, multi):
    """Multi-node mode: a `node` on every tool that talks to a node (and on each call_many item; a generated tool's
    unless its method declares a `node` of its own); join_namespace takes `from` instead of an invitation. Single
    mode: the tool as declared, byte for byte. join_context takes `from` too: a context named on a member node."""
    if not multi or t.nodes == "none" or "node" in (t.input_schema.get("properties") or {}):
        return t
    schema = dict(t.input_schema)
    properties = dict(schema.get("properties") or {}, node=NODE_ARGUMENT)
    if t.name == "call_many":
        calls = properties["calls"]
        items = dict(calls["items"], properties=dict(calls["items"]["properties"], node=NODE_ARGUMENT))
        properties["calls"] = dict(calls, items=items)
    if t.name == "join_namespace":
        properties["from"] = FROM_ARGUMENT
        schema["required"] = ["namespace"]
    if t.name == "join_context":
        properties["from"] = FROM_CONTEXT
    schema.update(type="object", properties=properties)
    return t._replace(input_schema=schema)


def unmarked(properties):
    """The properties as advertised (NAMES taken out), and {argument: kind} of those that carried it."""
    named = {key: value[NAMES] for key, value in properties.items() if NAMES in value}
    shown = {key: {k: v for k, v in value.items() if k != NAMES} if key in named else value
             for key, value in properties.items()}
    return shown, named


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


# ---- settings: toolsets, read-only mode, the result bound ----

def enabled_toolsets(env):
    """CALIMERO_MCP_TOOLSETS: comma-separated; unset or `all` means every toolset; core is always on."""
    names = toolset_names(env)
    if not names or names == {"all"}:
        return set(TOOLSETS)
    problem = toolsets_problem(env)
    if problem and not _settings_said_by_check:
        say_once("%s; known: %s" % (problem[0], ", ".join(TOOLSETS)))
    if "all" in names:
        return set(TOOLSETS)
    return (names & set(TOOLSETS)) | {"core"}


def toolset_names(env):
    raw = (env.get("CALIMERO_MCP_TOOLSETS") or "").strip()
    return {part.strip() for part in raw.split(",") if part.strip()}


def toolsets_problem(env):
    """(problem, fix) for CALIMERO_MCP_TOOLSETS names that are no toolset, or None: said on stderr at start, and
    by --check (non-fatal: the names are left out)."""
    unknown = sorted(toolset_names(env) - set(TOOLSETS) - {"all"})
    if not unknown:
        return None
    slips = [hint for hint, slipped in (
        ("names are lower case", lambda name: name.lower() in TOOLSETS + ("all",)),
        ("separate them with commas", lambda name: len(name.replace(";", " ").split()) > 1),
    ) if any(slipped(name) for name in unknown)]
    return ("CALIMERO_MCP_TOOLSETS names unknown toolsets %s%s" % (", ".join(unknown),
                                                                  " (%s)" % "; ".join(slips) if slips else ""),
            "Name toolsets among %s (core is always on; all, or leaving it unset, gives every one)."
            % ", ".join(TOOLSETS))


READ_ONLY_VARIABLE = "CALIMERO_MCP_READ_ONLY"
READ_ONLY_VALUES = ("1", "true", "yes", "on")
READ_ONLY_OFF = ("0", "false", "no", "off")        # the only values that leave it off: a typo must not give admin
READ_ONLY_UNSET = ("To allow changes, drop --read-only and unset %s in this server's entry of the host "
                   "configuration (its args and env), then restart the server." % READ_ONLY_VARIABLE)
READ_ONLY_INSTRUCTION = ("This server runs read-only (%s): it offers only tools that cannot change the node, and "
                         "call and call_many run [view] methods only. %s" % (READ_ONLY_VARIABLE, READ_ONLY_UNSET))

Config = namedtuple("Config", "toolsets read_only result_bound")
ReadOnlyMode = namedtuple("ReadOnlyMode", "read_only line problem fix")   # what --check prints
RESULT_BOUND_VARIABLE = "CALIMERO_MCP_MAX_RESULT_CHARS"


def server_config(env):
    """The tool filter's settings and the result bound, read once at start; a bad value is said on stderr (once a
    process: --check builds servers to count tools, and prints the problems it knows among its own)."""
    mode = read_only_mode(env)
    if mode.problem and not _settings_said_by_check:
        say_once(mode.problem)
    bound, problem = result_bound(env)
    if problem:
        say_once(problem)
    return Config(enabled_toolsets(env), mode.read_only, bound)


_said = set()
_settings_said_by_check = []        # non-empty while --check runs: it lists these settings' problems itself


def say_once(line):
    if line not in _said:
        _said.add(line)
        log.warning("%s", line)


def result_bound(env):
    """(the characters an app's result may take, None for no bound; what is wrong with the value or None):
    CALIMERO_MCP_MAX_RESULT_CHARS, TEXT_BOUND unless set, 0 for none."""
    raw = (env.get(RESULT_BOUND_VARIABLE) or "").strip()
    if not raw:
        return TEXT_BOUND, None
    if raw.isdigit():
        return (int(raw) or None), None
    return TEXT_BOUND, ("%s=%s is not a number of characters (0 for no bound); using %d"
                        % (RESULT_BOUND_VARIABLE, json.dumps(raw[:40]), TEXT_BOUND))


def read_only_mode(env):
    """CALIMERO_MCP_READ_ONLY fails safe: off only when unset, blank or one of READ_ONLY_OFF (any case); 1, true,
    yes or on turn it on, and so does any other value (`ture`, `enabled`), which is said as read as on."""
    raw = (env.get(READ_ONLY_VARIABLE) or "").strip()
    if not raw or raw.lower() in READ_ONLY_OFF:
        return ReadOnlyMode(False, "read-write (%s=1 would offer only tools that cannot change the node)"
                            % READ_ONLY_VARIABLE, None, None)
    line = ("only tools that cannot change the node are offered; call and call_many run [view] methods only")
    if raw.lower() in READ_ONLY_VALUES:
        return ReadOnlyMode(True, "read-only (%s): %s" % (READ_ONLY_VARIABLE, line), None, None)
    problem = ("%s=%s is none of 1, true, yes, on (on) or 0, false, no, off (off), so it is read as on: read-only "
               "mode is on" % (READ_ONLY_VARIABLE, json.dumps(raw[:40])))
    return ReadOnlyMode(True, "read-only (%s=%s, read as on): %s" % (READ_ONLY_VARIABLE, json.dumps(raw[:40]), line),
                        problem, "Set %s to 1 for read-only mode, or to 0 (or unset it) for read-write."
                        % READ_ONLY_VARIABLE)


def in_toolsets(t, config):
    """The app tools and generated tools belong to no toolset CALIMERO_MCP_TOOLSETS can turn off."""
    return t.toolset == "app" or t.toolset in config.toolsets


def advertised(t, config):
    """Whether tools/list carries tool `t` (fixed or generated) under `config`: its toolset is on and, in read-only
    mode, it cannot change the node. The one filter: tools/list, the refusal of a tool left out, select_app's tool
    names and any tool count go through it. (CALIMERO_MCP_APPS acts earlier: apps it leaves out have no tools.)"""
    if not in_toolsets(t, config):
        return False
    return not config.read_only or t.annotations.get("readOnlyHint") is True or KINDS[t.kind].always_offered


def as_configured(t, config):
    """In read-only mode call and call_many cannot change the node either, and their annotations say so."""
    return t._replace(annotations=READ_ONLY) if config.read_only and KINDS[t.kind].always_offered else t


def read_only_refusal(name):
    return ("%s is not available: this server runs read-only (%s), which offers only tools that cannot change the "
            "node. %s" % (name, READ_ONLY_VARIABLE, READ_ONLY_UNSET))


def refuse_unless_view(apps, method, app, listed=None):
    """Read-only mode runs [view] methods only, whichever tool asks (call, call_many, a generated tool whose app
    was upgraded meanwhile), by the ABI of the build installed now (`app`, read live by this call; `listed`: the
    method as its tool was listed, when that was another build); an intent left unspecified could write, so it
    is refused too."""
    is_view = heavy("abi").is_read_only
    if apps.entry.read_only and not is_view(method):
        raise ToolError('Method %s of %s is not [view] in the build node "%s" runs (version %s, intent %s): that node '
                        'is read-only (" (ro)" in CALIMERO_NODES), so only [view] methods run there; nothing was sent.'
                        % (method.name, app.key, apps.entry.name, app.version or "unknown",
                           method.intent or "unspecified"))
    if apps.server.config.read_only and not is_view(method):
        was = ("; it was [view] when this tool was listed" if listed is not None and is_view(listed) else "")
        raise ToolError("Method %s of %s is not [view] in the installed build (version %s, intent %s%s): this server "
                        "runs read-only (%s), so only [view] methods run. %s"
                        % (method.name, app.key, app.version or "unknown", method.intent or "unspecified", was,
                           READ_ONLY_VARIABLE, READ_ONLY_UNSET))


# ---- arguments: one reader for every fixed tool ----

_fixed_validators = {}
# Accepted without being advertised: a generated tool takes context as _context's synonym (tools.md), and `call`
# takes _context, the name generated tools advertise, as a synonym of its context.
GENERATED_SYNONYMS = ("context", "_context")


def refuse_unknown_arguments(t, arguments):
    """An argument the tool does not take is refused, naming it and what the tool takes: dropped silently, a
    misspelt optional argument would leave the agent believing it was passed."""
    takes = list(t.input_schema.get("properties") or {})
    unknown = [name for name in arguments if name not in takes and name not in t.synonyms]
    if unknown:
        raise ToolError(unknown_arguments_text(unknown, t.name, takes))
    if KINDS[t.kind].checked:                 # call_many refuses per item, as call does
        for name, value in arguments.items():
            if name not in t.synonyms:
                refuse_unknown_keys(t.input_schema["properties"][name], value, name)


def refuse_unknown_keys(schema, value, path, owner=None):
    """A key a fixed tool's nested object does not declare is refused too, naming where (`members.0`). An object
    declaring no properties (an invitation, an app's args) or any (`additionalProperties`) is opaque here."""
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            refuse_unknown_keys(schema["items"], item, "%s.%d" % (path, index), "Each %s item" % path)
    properties = schema.get("properties")
    if not isinstance(value, dict) or not properties or "additionalProperties" in schema:
        return
    unknown = [key for key in value if key not in properties]
    if unknown:
        raise ToolError(unknown_arguments_text(unknown, owner or path, list(properties), " in " + path))
    for key, inner in value.items():
        refuse_unknown_keys(properties[key], inner, "%s.%s" % (path, key))


def refuse_unsendable(t, arguments):
    """What no request to the node can carry is refused here, naming where, before anything is sent: JSON's \\ud800
    escapes spelling half a character (no UTF-8 URL or body holds it), and a number past a 64-bit float (1e400
    decodes as infinity, which JSON cannot say; the node's own parser refuses it)."""
    stack = [("", arguments)]
    while stack:                             # not recursive: arguments may nest as deep as the decoder allows
        path, value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            where = "%s.%s" % (path, key) if path else str(key)
            for text, said in ((key, where + " (a key)"), (item, where)):
                code = lone_surrogate(text)
                if code is not None:
                    raise ToolError("Invalid arguments for %s:\n- %s: holds a lone surrogate (\\u%04x), half of a "
                                    "character, which no request to the node can carry; send the character itself"
                                    % (t.name, said.encode("utf-8", "backslashreplace").decode("utf-8"), code))
            if isinstance(item, float) and item - item != 0:
                raise ToolError("Invalid arguments for %s:\n- %s: a number too large for a 64-bit float (at most "
                                "about 1.8e308), which the node cannot read" % (t.name, where))
            stack.append((where, item))


def lone_surrogate(text):
    """The code point of the first unpaired surrogate in a string (JSON decoding pairs the valid ones), else None."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            return ord(text[error.start])
    return None


def unknown_arguments_text(unknown, owner, takes, where=""):
    """`Unknown argument app. create_context takes: application, group, ...`"""
    told = "takes: " + ", ".join(takes) if takes else "takes no arguments"
    return "Unknown argument%s %s%s. %s %s." % ("s" if len(unknown) > 1 else "", ", ".join(unknown), where, owner,
                                                 told)


# The arguments (at any tool's top level, in call_many's calls, in members) that take a context, namespace, group,
# account, application or blob id. What an app takes (args), data and texts are never touched.
ID_ARGUMENTS = frozenset(("context", "_context", "contextId", "app", "application", "namespace", "group", "parent",
                          "member", "members", "identity", "blob"))
HOLDS_ID_ARGUMENTS = frozenset(("calls",))


CONTEXT_OPTIONS = frozenset(("_context", "context"))


def one_id_form(value, key=None, keys=ID_ARGUMENTS):
    """The arguments with every 64-hex id lower-case, the one form the node lists ids in: made so once, where
    arguments enter (run_tool, for every kind of tool), so every guard and comparison after it, and the node,
    see one form (an upper-case namespace id must not pass a guard that compares it with the listed one). `keys`:
    the arguments that take ids."""
    if isinstance(value, str):
        return value.lower() if key in keys and node_module().is_hex64(value.strip()) else value
    holds = key in HOLDS_ID_ARGUMENTS and keys is ID_ARGUMENTS      # a generated tool's `calls` is the app's
    if isinstance(value, list) and (key in keys or holds):
        return [one_id_form(item, key, keys) for item in value]
    if isinstance(value, dict) and (key is None or key in keys or holds):
        return {name: one_id_form(item, name, keys) for name, item in value.items()}
    return value


def resolved_ids(apps, t, arguments, call):
    """A fixed tool's arguments with every namespace or group given by name replaced by its 64-hex id, so handlers
    see ids only; one name that names nothing, or several, is refused before anything is done."""
    named = t.id_arguments
    if not named or not any(isinstance(arguments.get(argument), str) for argument in named):
        return arguments
    resolved = dict(arguments)
    with call.reading():                     # two arguments naming groups share one walk of the node's groups
        for argument, kind in named.items():
            if isinstance(arguments.get(argument), str):
                carrier = apps.resolve_group(arguments[argument], argument, kind)
                resolved[argument] = carrier.id
                call.named[argument] = carrier
    return resolved


def without_null_optionals(t, arguments):
    """A fixed tool's optional argument given as null is absent: hosts in strict function-calling mode send null
    for every optional they omit (generated tools and `call` read null so already)."""
    if not KINDS[t.kind].checked:
        return arguments
    required = t.input_schema.get("required") or ()
    optional = [name for name in t.input_schema.get("properties") or {} if name not in required]
    return {key: value for key, value in arguments.items() if value is not None or key not in optional}


def check_fixed_arguments(t, arguments):
    """Validate a fixed tool's arguments against its declared schema. Generated tools, `call` and `call_many`
    validate themselves: after the handle check, and per item (reference §3.12, §3.13)."""
    if not KINDS[t.kind].checked:
        return []
    validator = _fixed_validators.get(t.name)
    if validator is None:
        validator = _fixed_validators[t.name] = heavy("abi").compile_schema(t.input_schema)
    # abi's words (`visibility: expected one of "open", "restricted", got "public"`): a value is shown short, so
    # what was expected survives a long one, and as JSON (null, not None).
    return heavy("abi").schema_problems(validator, arguments)


# ---- results: failures, rendering, the bound ----

def error_result(text, blocks=()):
    return {"content": list(blocks) + [{"type": "text", "text": text}], "isError": True}


def failure_text(error):
    """A failed call (a ToolError or a NodeError) as the agent reads it: a refusal's retry text as it is (reference
    §3.0), anything else after `Error: `; the same for a tool's result and a call_many item."""
    if isinstance(error, Refusal):
        return error.text
    return "Error: " + (error.text if isinstance(error, ToolError) else node_error_text(error))


def node_error_text(error):
    """A node failure for the agent: what failed (with the url), then what to do when node.py knows."""
    text = str(error)
    hint = getattr(error, "hint", None)
    if hint and hint not in text:
        text = "%s. %s" % (text.rstrip(". "), hint)
    return text


def rows_nodes(rows):
    """The distinct nodes call_many's rows ran on, in order of first appearance."""
    names = [row.get("node") for row in rows if isinstance(row, dict) and isinstance(row.get("node"), str)]
    return tuple(dict.fromkeys(names))


def as_failure(error):
    """The error a failed call reports (a ToolError or a NodeError), or the error itself re-raised when it is a bug
    of ours: every kind of tool, and each call_many item, fails through here."""
    if isinstance(error, ImportError) and error.name in PACKAGE_OF:    # a tool's own `import abi`: a file is gone
        return MissingLibrary(import_failure(error.name, error))
    if isinstance(error, ToolError) or isinstance(error, node_module().NodeError):
        return error
    raise error


def render_result(value):
    """A handler's value as a CallToolResult: strings as text; objects as JSON text plus structuredContent."""
    if isinstance(value, dict) and "content" in value and isinstance(value.get("content"), list):
        return value                      # already a CallToolResult (guide blocks and the like)
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}]}
    result = {"content": [{"type": "text", "text": json_text(value)}]}
    if isinstance(value, dict):
        result["structuredContent"] = value
    return result


def json_text(value):
    return json.dumps(value, indent=2, ensure_ascii=False)


def compact_text(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def plain_text(value):
    """An app's result as `call` shows it: JSON, a string quoted as a generated tool shows it, so no app's text
    can pose as a line of the server (a host may join the blocks of an answer)."""
    return json_text(value)


def refuse_oversized(method, text, bound, where=None, reserve=0):
    """An app's result past the bound is an error carrying its size, what to do, and its first part: whole, it
    is an answer Claude Code rejects (and a context it floods). `where`, the block saying where it ran, counts
    against the answer's limit too, and so does `reserve`, the least the blocks after it take (events cut to their
    last line, the node it ran on): the answer must fit whole, or the last guard would cut the value."""
    if bound is None or (len(text) <= bound and len(text) + (len(where["text"]) if where else 0) + reserve
                         <= max(TEXT_BOUND, bound)):
        return
    head = ("The result of %s is %d characters, more than one answer carries (%d, %s): call a narrower method or "
            "pass arguments that select less. Its first part:\n" % (method, len(text), bound, RESULT_BOUND_VARIABLE))
    raise ToolError(head + text[:max(bound - len(head) - 100, bound // 2)] + "\n... [cut]")


def answer_limit(config):
    """What an app call's whole answer may carry (the last guard's bound, mero_mcp.answer_bound): TEXT_BOUND, or
    the result bound set past it; None for none."""
    return None if config.result_bound is None else max(TEXT_BOUND, config.result_bound)


def room_left(call, blocks, ran_on=()):
    """The characters an app call's answer has left after `blocks` and the line naming the node(s) it ran on (multi
    mode): what its events block may take. With no bound set, events still keep within TEXT_BOUND."""
    return (answer_limit(call.server.config) or TEXT_BOUND) - text_size(blocks) - node_line_size(call, ran_on)


def node_line_size(call, ran_on=()):
    """At least what `NodeEntries.said_where` adds in multi-node mode: 'Ran on node "x".', or every node named."""
    if not call.server.nodes.multi or call.entry is None:
        return 0
    return 60 + sum(len(name) + 4 for name in (tuple(ran_on) or (call.entry.name,)))


# ---- bounded answers: the list tools answer in pages ----

CURSOR = {"type": "string", "description": "nextCursor of the previous page."}
LONG_TEXT = 500             # a row that alone passes the bound keeps this much of each longer string


def paged(tool, args, value, rows_key, id_key):
    """`value`, whose `rows_key` list is complete, as the answer: unchanged when no cursor was passed and it fits
    TEXT_BOUND; else the page the cursor starts (the first without one) holding the rows that fit, with
    nextCursor and a line saying how to go on while rows are left.

    A paged list goes in id order and a cursor is opaque: base64url of [the page's last row id, a digest of the
    tool and its other arguments]. The list is read live for every page and resumes after that id, whether its
    row is still there or not, so a row present for the whole walk is listed once even when rows before it (the
    page's own, say) come or go."""
    query = query_fingerprint(tool, args)
    rows = value[rows_key]
    frame = len(json_text(dict(value, **{rows_key: []})))
    if args.get("cursor") is None:
        if fit_count(frame, [row_cost(row) for row in rows], TEXT_BOUND) == len(rows):
            return value
        rows, start = in_id_order(rows, id_key), 0
    else:
        rows = in_id_order(rows, id_key)
        start = resume_at(tool, args["cursor"], query, rows, id_key)
    rows = rows[start:]
    count = fit_count(frame, [row_cost(row) for row in rows], TEXT_BOUND)
    if count == 0 and rows:                  # one row alone passes the bound: its long strings are cut
        rows = [shortened(rows[0], id_key)] + rows[1:]
        count = 1
    while True:
        page = dict(value, **{rows_key: rows[:count]})
        if count == len(rows):
            return page
        page["nextCursor"] = make_cursor(query, row_key(rows[count - 1], id_key))
        line = ('%s %d-%d of %d. For the rest, call %s again with the same arguments and cursor "%s".'
                % (rows_key.capitalize(), start + 1, start + count, start + len(rows), tool, page["nextCursor"]))
        text = json_text(page)
        if len(text) + len(line) <= TEXT_BOUND or count == 1:
            return {"content": [{"type": "text", "text": text}, {"type": "text", "text": line}],
                    "structuredContent": page}
        count -= 1                           # the cursor and the line took what the estimate left


def row_key(row, id_key):
    """A row's place in id order, as JSON a cursor can carry: a string id as it is, anything else after them. A
    tuple of keys is a compound id (a registry package per signer): its strings joined by NUL, "" for one absent."""
    if isinstance(id_key, tuple):
        parts = [row.get(key) if isinstance(row, dict) else None for key in id_key]
        value = "\0".join(part if isinstance(part, str) else "" for part in parts) if isinstance(parts[0], str) else None
    else:
        value = row.get(id_key) if isinstance(row, dict) else None
    return [0, value] if isinstance(value, str) else [1, json.dumps(value, sort_keys=True)]


def in_id_order(rows, id_key):
    return sorted(rows, key=lambda row: row_key(row, id_key))


def row_cost(row):
    """Characters a row takes inside the rendered list: its own text, indented 4 more, and a separator."""
    text = json_text(row)
    return len(text) + 4 * (text.count("\n") + 1) + 2


def fit_count(frame, costs, budget):
    """How many of the leading rows fit `budget` in a rendering that is `frame` characters without them."""
    total, count = frame + 2, 0
    for cost in costs:
        total += cost
        if total > budget:
            break
        count += 1
    return count


def text_size(blocks):
    """The characters an answer's blocks carry: every string in them (a text, a resource's uri and mime type)."""
    def size(value):
        if isinstance(value, str):
            return len(value)
        if isinstance(value, dict):
            return sum(size(item) for key, item in value.items() if key != "type")
        return sum(size(item) for item in value) if isinstance(value, list) else 0
    return sum(size(block) for block in blocks)


def bounded(result, limit=TEXT_BOUND):
    """Within `limit` (lists page, guides and ABIs fit themselves first): the longest text blocks are cut, saying
    so, and structuredContent, no longer the same, is left out; a block no cut reaches (its text not a string)
    goes."""
    size = text_size(result["content"])
    if size <= limit:
        return result
    marker = "... [cut: this answer is %d characters; one answer carries at most %d]" % (size, limit)
    blocks = cut_texts(list(result["content"]), limit, marker)
    if text_size(blocks) > limit:          # what no cut of a text reaches (a resource's uri): texts alone go
        blocks = cut_texts([block for block in blocks if is_text_block(block)] or [{"type": "text", "text": ""}],
                           limit, marker)
    return {key: value for key, value in dict(result, content=blocks).items() if key != "structuredContent"}


def is_text_block(block):
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


def cut_texts(blocks, limit, marker):
    """The blocks with their longest texts cut, each saying so, until they fit `limit` or no text is left."""
    for index in sorted((i for i, block in enumerate(blocks) if is_text_block(block)),
                        key=lambda i: -len(blocks[i]["text"])):
        excess = text_size(blocks) - limit
        if excess <= 0:
            break
        text = blocks[index]["text"]
        blocks[index] = dict(blocks[index], text=text[:max(0, len(text) - excess - len(marker))] + marker)
    return blocks


def shortened(row, id_key):
    """A row too long for any answer: each string past LONG_TEXT cut and saying so; if even that is too long,
    its id and a note."""
    def cut(value):
        if isinstance(value, str) and len(value) > LONG_TEXT:
            return value[:LONG_TEXT] + "... [cut: %d characters in all, too long for one answer]" % len(value)
        if isinstance(value, dict):
            return {key: cut(item) for key, item in value.items()}
        if isinstance(value, list):
            return [cut(item) for item in value]
        return value
    short = cut(row)
    if row_cost(short) <= TEXT_BOUND // 2:
        return short
    keys = id_key if isinstance(id_key, tuple) else (id_key,)
    return dict({key: row.get(key) for key in keys if key == keys[0] or key in row},
                cut="This row is %d characters, more than one answer carries." % row_cost(row))


def query_fingerprint(tool, args):
    """What a cursor is bound to: the tool and its arguments but the cursor, leaving out those equal to their
    default (a flag's is false), so `verbose: false` continues a walk begun without it."""
    declared = next((t.input_schema.get("properties") or {} for t in FIXED_TOOLS if t.name == tool), {})

    def default(name):
        schema = declared.get(name) or {}
        return schema.get("default", False if schema.get("type") == "boolean" else None)
    return digest([tool, {k: v for k, v in args.items() if k != "cursor" and v != default(k)}])


def digest(value):
    """12 hex characters of a value's sha256: enough to tell queries (or rows) apart, short in a cursor."""
    import hashlib
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()[:12]


CURSOR_LIMIT = 1000         # characters: a nextCursor is well under; a longer one is no cursor of ours
CURSOR_SHOWN = 200          # a refused cursor is quoted up to this much: a 64-hex row id makes one of ~120


def make_cursor(query, last_key):
    return b64url(json.dumps([last_key, query], separators=(",", ":")).encode("utf-8"))


def resume_at(tool, cursor, query, rows, id_key):
    """Where the page a cursor names starts: at the first row after its last row's id (rows are in id order)."""
    last_key = cursor_key(cursor)
    shown = cursor if len(cursor) <= CURSOR_SHOWN else cursor[:CURSOR_SHOWN] + "..."
    if last_key is None:
        raise ToolError('Invalid cursor "%s": it is no nextCursor of %s. Omit cursor for the first page.'
                        % (shown, tool))
    if last_key[1] != query:
        raise ToolError('Invalid cursor "%s": it continues a %s call with other arguments. Pass the arguments of '
                        'the call that returned it, or omit cursor for the first page.' % (shown, tool))
    import bisect
    keys = [row_key(row, id_key) for row in rows]
    return bisect.bisect_right(keys, last_key[0])


def cursor_key(cursor):
    """A cursor's [last row key, query digest], or None when it is no cursor of ours (a forged one included: it
    is read only when short, and flat)."""
    if len(cursor) > CURSOR_LIMIT:
        return None
    try:
        key, made_for = json.loads(unb64url(cursor))
    except (ValueError, TypeError, RecursionError):          # not base64, not JSON, not two items
        return None
    well_formed = (isinstance(key, list) and len(key) == 2 and key[0] in (0, 1) and type(key[0]) is int
                   and isinstance(key[1], str) and isinstance(made_for, str))
    return (key, made_for) if well_formed else None


def b64url(data):
    import base64
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text):
    import base64
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


FROM_ARGUMENT = {"type": "string", "description": "A member node: the server invites from it and brings the app; no "
                 "invitation."}
FROM_CONTEXT = {"type": "string", "description": "Member node naming context."}


def cut_text(text, limit):
    if len(text) <= limit:
        return text
    marker = "... [cut: %d characters in all]" % len(text)
    return text[:max(0, limit - len(marker))] + marker


class Reads:
    """Node reads shared by one call or one call_many batch: the first asker fetches, the others wait for it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.futures = {}

    def get(self, key, fetch):
        with self.lock:
            future, owner = self.futures.get(key), False
            if future is None:
                from concurrent.futures import Future
                future = self.futures[key] = Future()
                owner = True
        if owner:
            try:
                future.set_result(fetch())
            except BaseException as error:
                future.set_exception(error)
        return future.result()
