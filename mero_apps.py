"""The app model of mero-mcp: installed apps and their ABIs, the catalog behind tools/list, handles, admission
(the reads before every execute), generated tools and guides.

Imports only mero_runtime (and node.py and abi.py, lazily); mero_tools and mero_mcp import it.
"""
import json
import os
import threading
import time
from collections import namedtuple
from functools import cached_property, partial

from mero_runtime import (advertised, b64url, compact_text, current_request, cut_text, fit_count, FIXED_TOOLS,
    GENERATED_SYNONYMS, heavy, log, MissingLibrary, node_line_size, node_module, own_module, Refusal,
    refuse_oversized, refuse_unless_view, room_left, together, Tool, tool_definition, ToolError, unb64url,
    unknown_arguments_text, with_node_argument)

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"


LISTED_CONTEXTS = 20


def some_contexts(ids, label):
    """Context ids for a message: a node may hold thousands, so the first 20 and where the rest are."""
    if len(ids) <= LISTED_CONTEXTS:
        return ", ".join(ids)
    return '%s and %d more (list_contexts with application "%s" lists them)' % (
        ", ".join(ids[:LISTED_CONTEXTS]), len(ids) - LISTED_CONTEXTS, label)


NAME_SHOWN = 80          # a context's name in the line saying where a call ran: the node's text, so cut


def what_ran(apps, context_id, method, named, returns_nothing=False):
    """The block after every app result saying where it ran: the method, the context id, and the alias the call
    named it by (`named`: the call's context arguments), else the context's name; and, for a method that returns
    nothing (whose answer is null), that it returns nothing. The context was read by this call's admission: its
    name comes from the call's memo."""
    alias = next((value.strip() for value in named if isinstance(value, str) and value.strip()
                  and value.strip() != context_id), None)
    if alias:
        label = ' (alias %s)' % quoted_text(alias)
    else:
        name = context_name(apps, context_id)      # a member wrote it: quoted, it can pose as no line of ours
        label = ' (named %s)' % quoted_text(cut_text(name, NAME_SHOWN)) if name else ""
    return {"type": "text", "text": "%s ran in context %s%s%s" % (
        method, context_id, label, "; it returns nothing." if returns_nothing else ".")}


def quoted_text(text):
    return json.dumps(text, ensure_ascii=False)


def context_name(apps, context_id):
    try:
        context = apps.context_by_id(context_id)
    except node_module().NodeError:      # admission read it already; a failure now costs only the name
        return None
    name = context.get("name") if isinstance(context, dict) else None
    return name if isinstance(name, str) and name.strip() else None


# unit_null: the value is the null of a unit method; emitted: the Emitted it heard, or None
Ran = namedtuple("Ran", "context_id unit_null value emitted")


def is_hex_id(value):
    """Core hex-encodes every 32-byte id (node-api.md §0): 64 lowercase hex characters."""
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")


RETRY_TEXT = "Call select_app for %s and retry with the returned app_handle."
GENERIC_RETRY = "Call select_app for the application and retry with the returned app_handle."
OTHER_APP_HANDLE = "This app_handle is for %s, not %s. %s"
OTHER_SERVICE_HANDLE = "This app_handle is for service %s of %s, not service %s. %s"
NO_CONTEXT_HANDLE = ("This app_handle names no context. Call select_app for %s with a context and retry "
                     "with the returned app_handle.")
INIT_REFUSAL = ("init runs once, when create_context creates the context; pass its arguments as "
                "create_context's args. It cannot be called on a context.")
TOOLS_NOTE = ("These are the server-side tool names. An MCP client may expose them under a prefix of its own "
              "(commonly mcp__<server>__<tool>), so if a name does not resolve, look for the prefixed form.")
SERVICE_NOTE = ("Not discoverable: a node exposes no service list for an application, and this one has no context "
                "to read a service name from. Take it from the app's bundle or its docs when create_context asks "
                "for one.")
GUIDE_SHOWN_NOTE = "This app's guide was shown earlier this session; read %s if it is not in your context."


class AppRecord(namedtuple("AppRecord", "id package version signer_id name description guide metadata "
                                        "services blob raw")):
    """One installed application as the node lists it (decoded once). Its guide's uri and hash are worked out
    on first use and kept: admission compares hashes on every call, and a catalog record lives until it changes."""

    @property
    def key(self):
        return self.package or self.id

    @property
    def build(self):
        """What identifies the build this record names: an ABI read for one build is never used for another."""
        return (self.id, self.blob, self.version)

    @property
    def label(self):
        """The display name as titles, resource names and list rows carry it (one line), else the package."""
        return one_line(self.name) or self.key

    @property
    def sole_service(self):
        return self.services[0] if len(self.services) == 1 else None

    @cached_property
    def guide_uri(self):
        if not self.guide or not self.version:
            return None
        quoted = node_module().quoted        # a uri segment, quoted as node paths are
        return "calimero://apps/%s/%s/guide" % (quoted(self.id), quoted(self.version))

    @cached_property
    def guide_hash(self):
        import hashlib
        return hashlib.sha256((self.guide or "").encode("utf-8")).hexdigest()[:16]


NAME_LIMIT = 64


def one_line(text, limit=NAME_LIMIT):
    """App-authored text fit for a title or a list row: line breaks and other whitespace runs become one space,
    control and format characters (escape sequences, bidi overrides) go, and it is cut at `limit` characters."""
    if not text:
        return text
    import unicodedata
    kept = " ".join("".join(c for c in text if c.isspace() or unicodedata.category(c) not in ("Cc", "Cf")).split())
    return kept if len(kept) <= limit else kept[:limit - 1] + "\u2026"


def app_record(raw):
    metadata = raw.get("metadata")           # node.py decoded it from the bundle's bytes
    fields = metadata if isinstance(metadata, dict) else {}
    guide = fields.get("guide") if isinstance(fields.get("guide"), str) and fields.get("guide").strip() else None
    if isinstance(metadata, dict):
        metadata = {k: v for k, v in metadata.items() if k != "guide"}
    name = fields.get("name") if isinstance(fields.get("name"), str) and fields.get("name") else None
    description = fields.get("description") if isinstance(fields.get("description"), str) else None
    services = raw.get("services") if isinstance(raw.get("services"), dict) else {}
    blob = raw.get("blob") if isinstance(raw.get("blob"), dict) else {}
    return AppRecord(str(raw.get("id", "")), raw.get("package") or None, raw.get("version") or None,
                     raw.get("signer_id") or None, name, description, guide, metadata,
                     tuple(sorted(services)), blob.get("bytecode"), raw)


def alias_elsewhere(entry, value):
    """The context id `value` is an alias for on another node; None when it is none there, or that node will not
    say (a refusal is being written: a down node only leaves its part out)."""
    try:
        return entry.apps.lookup_alias(value)
    except node_module().NodeError:
        return None


def context_not_here(apps, value):
    """Why an app call's context cannot run on this node when another node holds it in a namespace this one has not
    joined: joining brings the app too, so installing it alone would not do (a model's play). None otherwise."""
    if not isinstance(value, str):
        return None
    if not node_module().is_hex64(value):
        said = apps.named_so(value) if apps.context_id(value) is None else ""
        return ('Context "%s" is not on node "%s".%s' % (value, apps.entry.name, said)) if said else None
    for other in apps.server.nodes.entries.values():
        namespace = None if other is apps.entry else namespace_not_joined(apps.entry, other, value)
        if namespace is not None:
            return ('Context %s is node "%s"\'s; node "%s" has not joined namespace %s, which holds it: %s.'
                    % (value, other.name, apps.entry.name, namespace, join_namespace_first(apps.entry, other)))
    return None


def namespace_elsewhere(entry, name):
    """The id of the namespace named exactly `name` on another node; None when none or several are, or that node
    will not say (a refusal is being written: a down node only leaves its part out)."""
    try:
        ids = [row["namespaceId"] for row in entry.node.namespaces() if row.get("name") == name]
    except node_module().NodeError:
        return None
    return ids[0] if len(ids) == 1 else None


def namespace_not_joined(joiner, member, context_id):
    """The namespace holding a context the member node has, when the joiner has not joined that namespace (core
    then answers a join only "not found"); None when it has, or the nodes will not say."""
    try:
        group = next((row.get("groupId") for row in member.node.contexts() if row["id"] == context_id), None)
        if not group:
            return None
        namespace = member.node.group(group).get("namespaceId") or group
        if any(row["namespaceId"] == namespace for row in joiner.node.namespaces()):
            return None
    except node_module().NodeError:
        return None
    return namespace


def join_namespace_first(joiner, member):
    """What a join of a context in a namespace the joiner is not in needs first (a clause: no capital, no stop)."""
    return ('call join_namespace with node "%s" and from "%s" first (it brings the app), then join_context'
            % (joiner.name, member.name))


def last_segment(package):
    return package.rsplit(".", 1)[-1] if package else ""


def match_apps(apps, name):
    """Resolution tiers (reference §3.5): exact id; exact package; trailing segment or display name."""
    for tier in (lambda a: a.id == name, lambda a: a.package == name,
                 lambda a: name.lower() in {last_segment(a.package).lower(), (a.name or "").lower()} - {""}):
        found = [a for a in apps if tier(a)]
        if found:
            return found
    return []


def resolve_as_given(apps, name):
    """What a destructive tool acts on: the app `name` names exactly as given (its id, package, trailing segment or
    display name; no trimming, case as given). One it names only trimmed or in another case is refused naming it,
    so nothing is removed on a near miss."""
    if not isinstance(name, str) or not name.strip():
        raise ToolError("Name an application: its id, package name, trailing segment or display name.")
    exact = [a for a in apps if name in {a.id, a.package, last_segment(a.package), a.name} - {None, ""}]
    if not exact:
        folded = name.strip().lower()
        near = [a for a in apps if folded in {(n or "").lower() for n in (a.id, a.package, a.name,
                                                                          last_segment(a.package))} - {""}]
        if near:
            raise ToolError('Application "%s" is not named exactly so; %s. Nothing was done: pass the name as it is '
                            "spelled, or the id." % (name, ", ".join("%s (id %s)" % (a.key, a.id) for a in near)))
    return resolve_among(exact or apps, name)


def resolve_among(apps, name):
    found = match_apps(apps, name)
    if not found:
        installed = ", ".join(a.key for a in apps) or "(none)"
        raise ToolError('Application "%s" not found. Installed: %s' % (name, installed))
    packages = sorted({a.key for a in found})
    if len(packages) > 1:
        raise ToolError('Application "%s" is ambiguous: %s. Pass the full package name or the application id.'
                        % (name, ", ".join(packages)))
    if len(found) > 1:
        signers = ", ".join("%s (signer %s)" % (a.id, a.signer_id or "unknown") for a in found)
        raise ToolError('Application "%s" is published by several signers: %s. Pass the application id.'
                        % (name, signers))
    return found[0]


# A namespace or a subgroup that carries a name: `namespace` is the namespace a subgroup sits in (None for one).
Carrier = namedtuple("Carrier", "kind id name namespace")
GROUP_KINDS = {"namespace": "namespace", "group": "namespace or group", "namespaces": "namespaces",
               "groups": "namespaces and groups"}


def named_as(carriers, name):
    """The carriers of `name`: those spelling it exactly, else those spelling it in another case (no trimming:
    " team" is not "team")."""
    exact = [c for c in carriers if c.name == name]
    return exact or [c for c in carriers if isinstance(c.name, str) and c.name.lower() == name.lower()]


def carriers_text(carriers):
    """`namespace <id> ("team"), subgroup <id> ("team", in namespace <id>)`."""
    return ", ".join('%s %s ("%s"%s)' % (c.kind, c.id, c.name, ", in namespace %s" % c.namespace if c.namespace
                                          else "") for c in carriers)


# ---- handles: HMAC-signed, so an agent cannot forge or edit one (reference §3.7) ----

def load_handle_key(state_dir):
    """32 random bytes kept in the state dir (0600) so handles survive a restart; per-process if that fails."""
    path = os.path.join(state_dir, "handle.key")
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        key = read_handle_key(path)
        if key is None:
            tmp = "%s.%d.tmp" % (path, os.getpid())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(32))
            try:
                os.link(tmp, path)       # only where there is none: a server starting beside us may have won
            except FileExistsError:
                if read_handle_key(path) is None:
                    os.replace(tmp, path)
            except OSError:              # a filesystem without hard links
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            key = read_handle_key(path)
            if key is None:
                raise OSError("handle.key is malformed")
        node_module().keep_private(path)
        return key
    except OSError as error:
        log.warning("cannot keep a handle key in %s, so handles will not survive a restart: %s", state_dir, error)
        return os.urandom(32)


def read_handle_key(path):
    """The key in handle.key, or None when there is none or it is not 32 bytes."""
    try:
        with open(path, "rb") as existing:
            key = existing.read(33)
    except FileNotFoundError:
        return None
    return key if len(key) == 32 else None


# node: the name of the node it was made on (multi-node mode); url: that node's address (every handle this release
# makes). A handle runs on that node only (NodeEntries.resolve).
Handle = namedtuple("Handle", "app package version guide context service node url")


def sign_handle(key, handle):
    import hashlib
    import hmac
    fields = {"a": handle.app, "p": handle.package, "v": handle.version, "g": handle.guide, "c": handle.context,
              "s": handle.service}
    if handle.node is not None:
        fields["n"] = handle.node                 # inside the signed payload: a handle cannot be moved to a node
    if handle.url is not None:
        fields["u"] = handle.url
    payload = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    return b64url(payload) + "." + b64url(hmac.new(key, payload, hashlib.sha256).digest())


def read_handle(key, text):
    """The handle's payload, or None for anything we did not sign unchanged."""
    import hashlib
    import hmac
    if not isinstance(text, str) or text.count(".") != 1:
        return None
    body, mac = text.split(".")
    try:
        payload, given = unb64url(body), unb64url(mac)
        if not hmac.compare_digest(given, hmac.new(key, payload, hashlib.sha256).digest()):
            return None
        fields = json.loads(payload)
        return Handle(fields["a"], fields["p"], fields["v"], fields["g"], fields["c"], fields["s"], fields.get("n"),
                      fields.get("u"))
    except (ValueError, KeyError, TypeError):
        return None


def handle_for(app, service, context_id, node=None, url=None):
    return Handle(app.id, app.key, app.version or "", app.guide_hash, context_id, service, node, url)


# ---- the catalog: an immutable snapshot swapped in whole ----

POLL_SECONDS = 30.0
FIRST_LOAD_WAIT = 5.0        # tools/list waits this long for the first catalog read, then answers anyway
# Each app's catalog reads (its record, then its ABIs) go out beside the other apps': a remote node's round trips
# are paid once for up to this many apps, not once per wave; on loopback 16 at once cost no more than 4.
CATALOG_READERS = 16

Unit = namedtuple("Unit", "app service manifest")
Binding = namedtuple("Binding", "unit method has_output wraps")   # wraps: handshake output rides as {result}
# definitions: the tools/list entries of the generated tools, rendered once per era (wrap False, True).
# guides: {uri: AppRecord} of every installed app with a guide, in the catalog or not (what resources/* serve).
# untooled: (unit, method name, why) of the methods besides init that get no tool (logged when the catalog changes).
Snapshot = namedtuple("Snapshot", "units definitions index bindings fingerprint guides untooled")
EMPTY_SNAPSHOT = Snapshot((), {False: [], True: []}, {}, {}, "", {}, ())


def unit_fingerprint(unit):
    return "%s:%s:%s:%s:%s" % (unit.app.id, unit.app.blob, unit.app.version, unit.service or "", unit.app.guide_hash)


def build_snapshot(units, reserved, config, apps=(), multi=False):
    """Every generated tool of every unit, named and described once per catalog change; the definitions are those
    `config` advertises (the index keeps every tool, so one left out is refused by name). The guides are those of
    `apps` (the installed list: apps left out by the budget or without a readable ABI have guides too)."""
    import abi
    units = sorted(units, key=lambda u: (u.app.key, u.app.id, u.service or ""))
    schemas, untooled = {}, []              # each input schema made once: it decides eligibility, then is the tool's
    for unit in units:
        for method in unit.manifest.methods:
            schema = abi.input_schema(unit.manifest, method)
            reason = abi.untooled_reason(unit.manifest, method, schema)
            if reason is None:
                schemas[(unit_key(unit), method.name)] = schema
            elif method.name != "init":
                untooled.append((unit, method.name, reason))
    tool_units = [abi.ToolUnit(unit_key(u), u.app.package, u.app.id, u.service, len(u.app.services) > 1,
                               tuple(sorted(m.name for m in u.manifest.methods if (unit_key(u), m.name) in schemas)))
                  for u in units]
    names = abi.tool_names(tool_units, reserved)
    tools, bindings = [], {}
    for unit in units:
        for method in sorted(unit.manifest.methods, key=lambda m: m.name):
            name = names.get((unit_key(unit), method.name))
            if name is None:
                continue
            made = with_node_argument(generated_tool(name, unit, method, schemas[(unit_key(unit), method.name)]), multi)
            tools.append(made)
            bindings[name] = Binding(unit, method, made.output_schema(False) is not None,
                                     made.output_schema(True) != made.output_schema(False))
    definitions = {wrap: [tool_definition(t, wrap) for t in tools if advertised(t, config)] for wrap in (False, True)}
    guides = {}
    for app in sorted([u.app for u in units] + list(apps), key=lambda a: (a.key, a.id)):
        if app.guide_uri:
            guides.setdefault(app.guide_uri, app)
    fingerprint = "\n".join([unit_fingerprint(u) for u in units] + ["%s:%s" % (uri, app.guide_hash)
                                                                     for uri, app in guides.items()])
    return Snapshot(tuple(units), definitions, {t.name: t for t in tools}, bindings, fingerprint, guides,
                    tuple(untooled))


def warn_uncallable_methods(snapshot):
    for unit, name, reason in snapshot.untooled:
        log.warning("no tool for %s %s %s: %s; use call", unit.app.key, unit.app.version, name, reason)


_missing_told = set()


def warn_catalog_failure(template, error):
    """Log why a catalog read failed; a missing library only once per process (the poll retries every 30 s, and
    a package does not install itself in between: every tool call still says it)."""
    if isinstance(error, MissingLibrary):
        if error.text in _missing_told:
            return
        _missing_told.add(error.text)
    log.warning(template, error)


def unit_key(unit):
    return "%s/%s" % (unit.app.id, unit.service or "")


def generated_tool(name, unit, method, input_schema):
    import abi
    manifest, app = unit.manifest, unit.app
    plain = abi.output_schema(manifest, method, False, admit_null=True)
    outputs = {False: plain, True: abi.handshake_output(plain)}     # one schema for both eras (memory)
    return Tool(name, abi.tool_title(method.name, app.label), abi.tool_description(manifest, method),
                input_schema, outputs.get, abi.tool_annotations(method),
                abi.tool_meta(app.key, app.version, app.signer_id, method), "app", "generated", GENERATED_SYNONYMS,
                {}, partial(invoke_generated, name))


class Apps:
    """The installed applications as this server sees them: live resolution, ABIs, contexts, groups, handles and
    guides shown; `catalog` is the snapshot the generated tools and resources are served from."""

    def __init__(self, entry):
        self.entry, self.server = entry, entry.server
        self.manifests = {}                       # (AppRecord.build, service) -> abi.Manifest
        self.validators = {}                      # (AppRecord.build, service, method) -> abi.Validator
        self.services = {}                        # (app id, blob id) -> service names, for lists without them
        self.shown_guides = set()                 # guide uris this session has already shown in full
        # One catalog, the default node's: it feeds tools/list and resources. Another node's app model consults it
        # for nothing but what tools/list carries (tool names and counts): its records, ABIs and validators are
        # read through its own node, keyed by that node's builds (unit_for), and its guides go as text.
        nodes = entry.server.nodes
        self.lists_tools = entry is nodes.default
        self.catalog = Catalog(self) if self.lists_tools else nodes.default.apps.catalog

    @property
    def node(self):
        return self.entry.node

    @property
    def handle_key(self):
        return self.server.nodes.handle_key       # one key for every node: a handle names its node inside

    # ---- the live application list ----
    def memo(self, key, fetch):
        """A node read, made once within the reading scope of the request this thread runs (Request.reading)."""
        request = current_request()
        reads = request.reads if request is not None else None
        return fetch() if reads is None else reads.get((self.entry.name,) + key, fetch)   # one memo, many nodes

    def installed(self):
        return self.memo(("installed",), self.read_installed)

    def read_installed(self):
        records = [app_record(raw) for raw in self.node.applications()]
        return [self.with_services(app) for app in records]

    def with_services(self, app):
        """Some releases list apps without `services`; only the single-app record carries them (node-api.md).
        They cannot change without a new blob, so each app version is asked once."""
        if "services" in app.raw:
            return app
        known = self.services.get((app.id, app.blob))
        if known is not None:
            return app._replace(services=known)
        full = self.app_by_id(app.id)
        if full is None:
            return app
        self.services[(full.id, full.blob)] = full.services
        return full

    def services_listed(self, app):
        """Whether the node gave this app's service list: on its list row, or on its own record, which leaves an
        empty list out (node-api.md §3.2). Not when that record could not be had."""
        return "services" in app.raw or (app.id, app.blob) in self.services

    def app_by_id(self, app_id):
        return self.memo(("app", app_id), lambda: self.read_app(app_id))

    def read_app(self, app_id):
        raw = self.node.application(app_id)
        return app_record(raw) if raw is not None else None

    def resolve(self, name):
        if not isinstance(name, str) or not name.strip():
            raise ToolError("Name an application: its id, package name, trailing segment or display name.")
        return resolve_among(self.installed(), name.strip())

    def manifest(self, app, service=None, raw=None):
        """The parsed ABI of the app's build (of one service), read once; `raw`: the node's answer, when it is
        read already."""
        abi = own_module("abi")          # every app tool reads a manifest: a missing abi.py is said here, by name
        key = (app.build, service)
        cached = self.manifests.get(key)
        if cached is not None:
            return cached
        if raw is None:
            raw = self.node.abi(app.id, service)
        try:
            manifest = abi.parse_manifest(raw, app.key + ("/" + service if service else ""))
        except abi.AbiError as error:
            raise ToolError(str(error))
        self.manifests[key] = manifest
        return manifest

    def unit_for(self, app, service):
        """The app's unit (its build's ABI, of one service) as this node has it: the catalog's unit of that very
        build on the default node, else the ABI read through this node (once per build: `manifest`)."""
        if self.lists_tools:
            for unit in self.catalog.snapshot.units:
                if unit.app.build == app.build and unit.service == service:
                    return unit
        return Unit(app, service, self.manifest(app, service))

    def served_guide_uri(self, app):
        """The guide's uri when resources/read serves this very text: the default node's apps only (another
        node's guide goes as text)."""
        return self.catalog.served_guide_uri(app) if self.lists_tools else None

    def ensure_listed(self, app):
        """A catalog miss reads the list again (the default node's apps: the catalog lists no other node's)."""
        if self.lists_tools:
            self.catalog.ensure_in_catalog(app)

    def tool_names_of(self, app, service, unit=None):
        """The listed tools that run this app's methods here: on the default node, the unit's own; on another
        node, those of the same package and service whose method this node's build has with the same intent
        (run there, each is checked against this node's ABI: binding_on_node)."""
        if self.lists_tools:
            return self.catalog.tool_names_of(app, service)
        unit = unit or self.unit_for(app, service)
        here = {m.name: m.intent for m in unit.manifest.methods}
        snapshot = self.catalog.snapshot
        return sorted((name for name, b in snapshot.bindings.items()
                       if b.unit.app.package == app.package and b.unit.service == service
                       and here.get(b.method.name, "absent") == b.method.intent
                       and advertised(snapshot.index[name], self.server.config)),
                      key=lambda name: snapshot.bindings[name].method.name)

    def validator(self, unit, method):
        key = (unit.app.build, unit.service, method.name)
        found = self.validators.get(key)
        if found is None:
            found = self.validators[key] = heavy("abi").Validator(unit.manifest, method)
        return found

    def contexts_of(self, app):
        return self.node.contexts_of(app.id)

    def context_by_id(self, context_id):
        return self.memo(("context", context_id), lambda: self.node.context(context_id))

    def read_named_context(self, value):
        """What admission reads for a context argument, into the call's memo: its alias's lookup, its record."""
        if isinstance(value, str) and value.strip():
            context_id = self.context_id(value.strip())
            if context_id:
                self.context_by_id(context_id)

    def context_id(self, value):
        """The id a context argument names: an id as given, else what the alias resolves to (None if nothing)."""
        return value if is_hex_id(value) else self.lookup_alias(value)

    def lookup_alias(self, name):
        return self.memo(("alias", name), lambda: self.node.lookup_alias(name))

    def resolve_context(self, value, app, label):
        """A context id or alias that must belong to `app` (reference §3.8 texts); aliases are read live."""
        if not isinstance(value, str) or not value.strip():
            raise ToolError("context must be a context id or alias (a non-empty string).")
        value = value.strip()
        context_id = self.context_id(value)
        context = self.context_by_id(context_id) if context_id else None
        if context is None:
            raise ToolError('Context "%s" not found: it is neither a context id nor an alias on this node.%s %s'
                            % (value, self.named_so(value, app), self.candidates(app, label, value)))
        if context.get("applicationId") != app.id:
            raise ToolError('Context "%s" %s. %s' % (value, self.runs_other(context, app, label),
                                                     self.candidates(app, label, value)))
        return context

    def runs_other(self, context, app, label=None):
        """What a context that does not run `app` runs instead, both named: `runs com.b (application <id>), not
        "com.a"` (its group may have been moved to another application since it was picked)."""
        other_id = context.get("applicationId")
        try:
            other = self.app_by_id(other_id) if is_hex_id(other_id) else None
        except node_module().NodeError:  # the refusal stands without the other app's name
            other = None
        named = "%s (application %s)" % (other.key, other_id) if other is not None and other.package else \
            "application %s" % other_id
        return 'runs %s, not "%s"' % (named, label or app.key)

    def named_so(self, value, app=None):
        """What a context argument that resolved to nothing names after all, said after it: the contexts whose
        name (list_contexts' label, not an alias) it is (a model takes a listed name for a reference), and with
        several nodes, the context it is another node's alias for (aliases are per node). Those nodes are asked
        on this miss only, together with this node's list. Empty when it names nothing."""
        others = [entry for entry in self.server.nodes.entries.values() if entry is not self.entry]
        said = together(partial(self.names_here, value, app),
                        *[partial(alias_elsewhere, entry, value) for entry in others])
        return said[0] + "".join(self.joined_or_not(value, entry, found) for entry, found in zip(others, said[1:])
                                 if found)

    def names_here(self, value, app):
        try:
            rows = self.contexts_of(app) if app is not None else self.node.contexts()
        except node_module().NodeError:
            return ""
        ids = [row["id"] for row in rows if row.get("name") == value and isinstance(row.get("id"), str)]
        if not ids:
            return ""
        return ' Context %s is named "%s": a name is a label, not an alias; pass the id (or create_alias).' % (
            " and ".join(ids[:3]), value)

    def joined_or_not(self, value, other, context_id):
        """`"doomed" is node1's alias for <id>; node "node2" has not joined it (...)`, or has it: pass the id."""
        said = ' "%s" is %s\'s alias for context %s; node "%s" ' % (value, other.name, context_id, self.entry.name)
        try:
            here = self.context_by_id(context_id)
        except node_module().NodeError:
            return said + "may not have it (it did not answer)."
        if here is None:
            namespace = namespace_not_joined(self.entry, other, context_id)
            if namespace is not None:
                return "%shas not joined it, nor namespace %s, which holds it: %s." % (
                    said, namespace, join_namespace_first(self.entry, other))
            return said + ('has not joined it (join_context with node "%s" and from "%s" joins it).'
                           % (self.entry.name, other.name))
        return said + "has it too: pass the id here."

    def candidates(self, app, label, rejected):
        ids = [c["id"] for c in self.contexts_of(app) if c.get("id") and c.get("id") != rejected]
        return 'Contexts for "%s": %s' % (label, some_contexts(ids, label) or "(none)")

    # ---- namespaces and groups ----
    def resolve_group(self, value, argument, kind="group"):
        """The Carrier (its 64-hex id; name and kind when read) a namespace (`kind` "namespace") or group argument
        names: an id as given, without a read; else the one namespace, or with "group" the one namespace or
        subgroup, whose name it is, compared exactly as given, for every tool: a name in another case is refused
        naming the spellings there are (a destructive tool must never act on another's). None or several is a
        ToolError naming the argument, and nothing is done."""
        name = value
        if not name.strip():
            raise ToolError("%s must name a %s: its id or its name." % (argument, GROUP_KINDS[kind]))
        if node_module().is_hex64(name):
            return Carrier(None, name, None, None)
        namespaces = self.namespace_carriers()
        if kind == "group":
            found = named_as(namespaces + self.groups_of(namespaces), name)
        else:
            found = named_as(namespaces, name)
            groups = [] if found else named_as(self.groups_of(namespaces), name)
            if groups:                           # a subgroup's name where a namespace is asked: never the subgroup
                raise ToolError('%s: "%s" is the name of %s, not of a namespace. Pass a namespace id or name; '
                                "list_namespaces lists them." % (argument, name, carriers_text(groups)))
        if found and all(c.name != name for c in found):
            raise ToolError('%s: no %s is named exactly "%s"; %s. Nothing was done; pass the name as it is spelled, '
                            "or the id." % (argument, GROUP_KINDS[kind], name, "named in another case: "
                                            + carriers_text(found)))
        if len(found) == 1:
            return found[0]
        if found:
            raise ToolError('%s: %d %s are named "%s": %s. Nothing was done; pass the id of the one you mean.'
                            % (argument, len(found), GROUP_KINDS[kind + "s"], name, carriers_text(found)))
        where = " (describe_group of a namespace shows its subgroups)" if kind == "group" else ""
        raise ToolError('%s: no %s on this node is named "%s". Nothing was done; list_namespaces lists the '
                        "namespaces with their ids and names%s.%s" % (argument, GROUP_KINDS[kind], name, where,
                                                                     self.namespace_named_elsewhere(name)))

    def namespace_named_elsewhere(self, name):
        """With several nodes, the namespace of that name another node is in, and how this one joins it (names,
        like aliases, are each node's: a model names node1's namespace on node2). Asked on this miss only."""
        others = [entry for entry in self.server.nodes.entries.values() if entry is not self.entry]
        found = together(*[partial(namespace_elsewhere, entry, name) for entry in others]) if others else []
        for entry, namespace_id in zip(others, found):
            if namespace_id is not None:
                return (' "%s" is namespace %s on node "%s"; node "%s" has not joined it (join_namespace with node '
                        '"%s" and from "%s" joins it).' % (name, namespace_id, entry.name, self.entry.name,
                                                           self.entry.name, entry.name))
        return ""

    def namespace_carriers(self):
        return [Carrier("namespace", row["namespaceId"], row.get("name"), None)
                for row in self.memo(("namespaces",), self.node.namespaces)]

    def carrier_of(self, group_id, call, argument):
        """What a destructive answer names: the namespace or group an argument resolved to, read when it was
        given as an id (a group this node cannot list is named by its id alone)."""
        known = call.named.get(argument)
        if known is not None and known.kind is not None:
            return known
        with call.reading():
            namespaces = self.namespace_carriers()
            found = [c for c in namespaces if c.id == group_id] or [
                c for c in self.groups_of(namespaces) if c.id == group_id]
        return found[0] if found else Carrier("group", group_id, None, None)

    def groups_of(self, namespaces):
        """Every subgroup this node can list, below each of `namespaces`."""
        return [Carrier("subgroup", row["groupId"], row.get("name"), ns.id) for ns in namespaces
                for row in self.memo(("groups", ns.id), lambda ns=ns: self.node.groups_in(ns.id))]

    # ---- guides (reference §3.9) ----
    def guide_blocks(self, app):
        if not app.guide:
            return []
        label = {"type": "text", "text": "App guide, provided by the app's author (package %s, signer %s):"
                 % (app.key, app.signer_id or "unknown")}
        uri = self.served_guide_uri(app)
        if len(app.guide) > GUIDE_BOUND:         # the rest of an answer keeps its room
            return [label, {"type": "text", "text": long_guide(app.guide, uri)}]
        if uri is None:
            return [label, {"type": "text", "text": app.guide}]
        self.shown_guides.add(uri)
        return [label, {"type": "resource", "resource": {
            "uri": uri, "mimeType": "text/markdown", "text": app.guide,
            "_meta": {"package": app.key, "appVersion": app.version, "signerId": app.signer_id}}}]



class AppBudget:
    """CALIMERO_MCP_APPS: which apps get generated tools, for hosts that cap the tool count."""

    def __init__(self, names):
        self.names = names
        self.warned = set()

    def admits(self, app):
        if not self.names:
            return True
        return any(match_apps([app], name) for name in self.names)

    def unmatched(self, apps):
        """The names that match no installed application (a typo would hide its tools)."""
        return [name for name in self.names if not match_apps(apps, name)]

    def warn_unknown(self, apps):
        """Say once per name when a name matches no installed application."""
        for name in self.unmatched(apps):
            if name not in self.warned:
                self.warned.add(name)
                log.warning('CALIMERO_MCP_APPS names "%s", which matches no installed application; installed: %s',
                            name, ", ".join(a.key for a in apps) or "(none)")


def app_budget(env):
    raw = (env.get("CALIMERO_MCP_APPS") or "").strip()
    return AppBudget([part.strip() for part in raw.split(",") if part.strip()])


class Catalog:
    """The generated tools and guide resources, as one immutable snapshot swapped in whole: its first read, the
    poll, refreshes, and what tools/list, resources/* and the tools read from it."""

    def __init__(self, apps):
        self.apps = apps
        self.server = apps.server
        self.snapshot = EMPTY_SNAPSHOT
        self.load_lock = threading.Lock()         # syncs run one at a time: an old read never wins
        self.loads_begun = 0                      # catalog reads started (under load_lock)
        self.first_load = threading.Event()
        self.answered_early = False               # a reader gave up waiting for the first read: announce it
        self.threads = set()                      # names of the background threads started (each once)
        self.threads_lock = threading.Lock()
        self.budget = app_budget(self.server.env)

    @property
    def node(self):
        return self.apps.node

    def start(self):
        self.start_once("catalog", self.first_read)

    def start_once(self, name, target):
        """A daemon thread started at most once, whichever threads ask at the same time."""
        with self.threads_lock:
            if name in self.threads:
                return
            self.threads.add(name)
        threading.Thread(target=target, name=name, daemon=True).start()

    def first_read(self):
        try:
            self.load()
        except Exception as error:          # the node may be down: the fixed tools still work
            warn_catalog_failure("app list unavailable at connect: %s", error)
            self.start_polling()            # and its apps appear (list_changed) once it is up
        finally:
            self.first_load.set()

    def first_read_here(self):
        """The first catalog read on this thread, however long it takes (--check counts what it brings)."""
        with self.threads_lock:
            self.threads.add("catalog")           # no reader starts another
        self.first_read()

    def wait_first_load(self):
        """A reader of the catalog starts it (a modern client may never send discover) and waits a little;
        if the first read takes longer, load() announces its apps when they arrive."""
        self.start()
        if not self.first_load.wait(FIRST_LOAD_WAIT):
            self.answered_early = True

    def load(self, settled=None):
        """Read the installed apps and their ABIs; swap the snapshot and announce a change. Nothing is read when
        `settled()` says, once the reads before have finished, that they answered the caller."""
        with self.load_lock:
            if settled is not None and settled():
                return False
            self.loads_begun += 1
            apps = [app_record(raw) for raw in self.node.applications()]
            units = self.read_units(apps)
            # Every fixed name, enabled or not: a generated name must not change with CALIMERO_MCP_TOOLSETS.
            reserved = {t.name for t in FIXED_TOOLS}
            fresh = build_snapshot(units, reserved, self.server.config, apps, self.server.nodes.multi)
            old, self.snapshot = self.snapshot, fresh
            changed = fresh.fingerprint != old.fingerprint
        announce = changed and (self.first_load.is_set() or self.answered_early)
        self.first_load.set()                # the readers waiting go on; what follows is for the log and later
        if changed:
            warn_uncallable_methods(fresh)
        self.start_polling()
        if announce:
            self.server.announce_lists_changed(tools=fresh.definitions != old.definitions,
                                               resources=guide_entries(fresh) != guide_entries(old))
        return changed

    def refresh(self, settled=None):
        try:
            self.load(settled)
        except Exception as error:
            warn_catalog_failure("app list refresh failed: %s (the current app tools stay)", error)

    def read_units(self, apps):
        """One unit per service (or one for the app); a bad one is skipped. Each app's reads (its record when the
        list lacks services, then its ABIs) go out together with every other app's, on the one session."""
        self.budget.warn_unknown(apps)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=CATALOG_READERS) as pool:
            read = list(pool.map(self.units_of, [app for app in apps if self.budget.admits(app)]))
        return [unit for units in read for unit in units]

    def units_of(self, listed):
        if self.apps.services_listed(listed):
            app, plain = listed, None
        else:
            # Its record (the list leaves services out) and the ABI the node gives without a service name (a plain
            # app's, or a one-service bundle's) are read together: a start waits one round trip less per app.
            app, plain = together(lambda: self.apps.with_services(listed), lambda: self.plain_abi(listed))
        services = app.services or (None,)           # a failed record read fails the load, as the list's would
        raw = plain if len(services) == 1 else None
        units = together(*[partial(self.unit_of, app, service, raw) for service in services])  # several: at once
        return [unit for unit in units if unit is not None]

    def unit_of(self, app, service, raw):
        """One service's unit (or the app's), None when its ABI cannot be had (said in the log)."""
        try:
            return Unit(app, service, self.apps.manifest(app, service, raw))
        except Exception as error:
            log.warning("skipping %s%s: %s", app.key, "/" + service if service else "", error)
            return None

    def plain_abi(self, app):
        """The ABI read without a service name, or None when the node refuses it (a bundle of several services
        needs the name: the caller reads each service's then)."""
        try:
            return self.node.abi(app.id)
        except node_module().NodeError:
            return None

    def start_polling(self):
        self.start_once("catalog-poll", self.poll)

    def poll(self):
        while True:
            time.sleep(POLL_SECONDS)
            self.refresh()

    def generated_definitions(self, wrap):
        self.wait_first_load()
        return self.snapshot.definitions[wrap]

    def generated_tool(self, name):
        self.wait_first_load()
        return self.snapshot.index.get(name)

    def ensure_in_catalog(self, app):
        """A catalog miss (node down at connect, a fresh install) reads the list again once; for an app left out
        of the catalog, a guide the catalog does not serve yet (its uri is handed out only once it does). Misses
        seen together (call_many's items) share one read: one begun since, or one that brought the app."""
        if self.missing_from_catalog(app):
            begun = self.loads_begun
            self.refresh(lambda: self.loads_begun > begun or not self.missing_from_catalog(app))

    def missing_from_catalog(self, app):
        if self.budget.admits(app):
            return not any(u.app.build == app.build for u in self.snapshot.units)
        return app.guide_uri is not None and self.served_guide_uri(app) is None

    def tool_names_of(self, app, service):
        """The unit's tool names, in method-name order."""
        snapshot = self.snapshot                    # one snapshot throughout: a refresh may swap it meanwhile
        bindings, config = snapshot.bindings, self.server.config
        names = [name for name, b in bindings.items() if b.unit.app.id == app.id and b.unit.service == service
                 and advertised(snapshot.index[name], config)]
        return sorted(names, key=lambda name: bindings[name].method.name)

    def tool_count_of(self, app_id):
        """How many generated tools of the app (every service) tools/list carries now (an uninstall as a session's
        first call counts them once the first read is in)."""
        self.wait_first_load()
        snapshot = self.snapshot
        return sum(1 for name, b in snapshot.bindings.items()
                   if b.unit.app.id == app_id and advertised(snapshot.index[name], self.server.config))

    # ---- guides, as the snapshot holds them ----
    def served_guide_uri(self, app):
        """The app's guide uri when resources/read serves this very text, else None: no other uri goes out."""
        served = self.snapshot.guides.get(app.guide_uri) if app.guide_uri else None
        return app.guide_uri if served is not None and served.guide_hash == app.guide_hash else None

    def guide_resources(self):
        self.wait_first_load()
        return guide_entries(self.snapshot)

    def read_guide(self, uri):
        self.wait_first_load()
        app = self.snapshot.guides.get(uri)
        return [{"uri": uri, "mimeType": "text/markdown", "text": app.guide}] if app is not None else None


# ---- admission: one path for call, call_many and generated tools (reference §3.7, §3.12, §3.14) ----

Admitted = namedtuple("Admitted", "unit context_id")


def refusal_for(apps, app, text=None):
    return Refusal(text or RETRY_TEXT % app.key, apps.guide_blocks(app))


def foreign_handle(apps, handle, app, service=None):
    """A handle made for another app, or another service of this one: say whose it is. The guide comes along only
    while this session has not shown it (select_app, which the text asks for, would show it again)."""
    if handle.app == app.id:
        text = OTHER_SERVICE_HANDLE % (handle.service, app.key, service, RETRY_TEXT % app.key)
    elif handle.package == app.key:          # one package from two signers: only the ids tell them apart
        text = OTHER_APP_HANDLE % ("application " + handle.app, "application " + app.id, RETRY_TEXT % app.id)
    else:
        text = OTHER_APP_HANDLE % (handle.package, app.key, RETRY_TEXT % app.key)
    shown = app.guide_uri is not None and app.guide_uri in apps.shown_guides
    return Refusal(text, () if shown else apps.guide_blocks(app))


def admit_handle(apps, handle, app, service, context_value=None, context_label=None):
    """Check a signed handle against the app as installed now and its live context; the context id. A refusal
    says what changed since the handle was made."""
    current = handle_for(app, handle.service, handle.context, handle.node, handle.url)
    if handle[:4] != current[:4]:
        raise refusal_for(apps, app, moved_on(handle, app) + RETRY_TEXT % app.key)
    if handle.service != service:
        raise foreign_handle(apps, handle, app, service) if handle.service and service else refusal_for(apps, app)
    if handle.context is None:
        raise Refusal(NO_CONTEXT_HANDLE % app.key)
    context = apps.context_by_id(handle.context)
    if context is None:
        raise refusal_for(apps, app, "This app_handle's context %s is no longer on this node. %s"
                          % (handle.context, RETRY_TEXT % app.key))
    if context.get("applicationId") != app.id:
        raise refusal_for(apps, app, "This app_handle's context %s now %s. %s"
                          % (handle.context, apps.runs_other(context, app), RETRY_TEXT % app.key))
    if context_service(context, app) != service:
        raise refusal_for(apps, app, "This app_handle's context %s now runs service %s, not %s. %s"
                          % (handle.context, context_service(context, app), service, RETRY_TEXT % app.key))
    if context_value is not None:
        other = apps.resolve_context(context_value, app, context_label or app.key)
        if other["id"] != handle.context:
            raise Refusal("The app_handle and context name different contexts (%s and %s). Pass one of them. %s"
                          % (handle.context, other["id"], RETRY_TEXT % app.key))
    return handle.context


def moved_on(handle, app):
    """What changed in a handle's app since select_app made it (its version, else its guide)."""
    if handle.version != (app.version or ""):
        return "This app_handle is for version %s of %s; version %s is installed now. " % (
            handle.version or "(none)", app.key, app.version or "(none)")
    if handle.guide != app.guide_hash:
        return "The guide of %s %s has changed since this app_handle was made. " % (app.key, app.version or "")
    return "This app_handle was made for another installation of %s. " % app.key


def context_service(context, app):
    return context.get("serviceName") or app.sole_service


def admit_by_context(apps, app, label, context_value, service=None):
    """No handle: the context names the app's context, and its service decides the unit."""
    context = apps.resolve_context(context_value, app, label)
    own_service = context_service(context, app)
    if service is not None and own_service != service:
        raise refusal_for(apps, app, "Context %s runs service %s, not %s. %s"
                          % (context["id"], own_service, service, RETRY_TEXT % app.key))
    return context["id"], own_service


def find_method(unit, name):
    if not isinstance(name, str) or not name:
        raise ToolError("method must be the name of an ABI method (a string).")
    if name == "init":
        raise Refusal(INIT_REFUSAL)
    for method in unit.manifest.methods:
        if method.name == name:
            return method
    available = ", ".join(m.name for m in unit.manifest.methods) or "(none)"
    raise ToolError('Method "%s" not found on "%s". Available: %s' % (name, unit.app.key, available))


def execute(apps, admitted, method, args, listed=None, emitted=None):
    """Validate against the ABI, then run; nothing reaches the node when the arguments are wrong (an argument
    the method does not declare included: `call`'s args hold the method's arguments only). Only admission's
    callers reach here: the context and its app were read live by this very call, and `method` is from the ABI
    of the build that app record names (`listed`: the method as a generated tool listed it, when that differs)."""
    refuse_unless_view(apps, method, admitted.unit.app, listed)
    wire_args = wire_arguments(apps, admitted.unit, method, args)
    heard = watch_events(apps, admitted, method)
    value = apps.node.execute(admitted.context_id, method.name, wire_args)
    if heard is not None and emitted is not None:
        emitted.append(heard_events(heard))
    return value


# The node writes a call's StateMutation before its answer (node-api §0.9), so it is almost always here by then; on
# the stream's own connection it may trail by a moment. A call that changed nothing raises no frame and pays this.
EMIT_GRACE = 0.05
Heard = namedtuple("Heard", "stream context_id mark")


def watch_events(apps, admitted, method):
    """For a [mut] call to an app whose ABI declares events: its context watched (the stream opened and the
    context subscribed if need be, waiting at most EVENT_FOLLOW_SECONDS: what comes before is lost), and where its
    entries stood as the call was sent (None when it is not subscribed even so). None for a read, an event-less app
    or a stream that only polls: those answer as before."""
    if not admitted.unit.manifest.events:
        return None
    stream = apps.node.events()
    writes = not heavy("abi").is_read_only(method)
    stream.touch(admitted.context_id, opens=writes)
    if not writes:
        return None
    stream.follow(admitted.context_id, node_module().EVENT_FOLLOW_SECONDS)
    if stream.status(admitted.context_id)["stream"] == "polling":
        return None
    return Heard(stream, admitted.context_id, stream.mark(admitted.context_id))


# What a [mut] call heard in its context: `after`, the entry number its events follow (the `events` tool's after);
# `entries` the entries since (None: not heard, the stream was not following the context); `framed`, whether its
# StateMutation came. call_many merges its items' by context (`items`: their indices).
Emitted = namedtuple("Emitted", "context_id after entries framed items")


def heard_events(heard):
    """What came for the call's context while it ran: an Emitted. Never structuredContent."""
    if heard.mark is None:
        return Emitted(heard.context_id, None, None, False, ())
    entries, framed = heard.stream.since_mark(heard.context_id, heard.mark, EMIT_GRACE)
    return Emitted(heard.context_id, heard.mark[0], [{k: v for k, v in e.items() if k != "at"} for e in entries],
                   framed, ())


def merged_by_context(heard):
    """call_many's [(index, Emitted)] as one Emitted per context: items writing together to one context hear each
    other, and their events are listed once, from the earliest item's mark."""
    merged = {}
    for index, emitted in heard:
        known = merged.get(emitted.context_id)
        if known is None or known.entries is None:
            merged[emitted.context_id] = emitted._replace(items=(known.items if known else ()) + (index,))
        elif emitted.entries is None:
            merged[emitted.context_id] = known._replace(items=known.items + (index,))
        else:
            entries = {e["n"]: e for e in known.entries + emitted.entries}
            merged[emitted.context_id] = Emitted(known.context_id, min(known.after, emitted.after),
                                                 [entries[n] for n in sorted(entries)],
                                                 known.framed or emitted.framed, known.items + (index,))
    return list(merged.values())


def events_block(emitted, room):
    """The text block of what a call heard, within `room` characters: the entries that fit, then "N more: events
    after X" (X the entry the rest follow, as the `events` tool's after takes it). The least it takes, its last line
    alone, is events_reserve's; given less room, it takes that much (the caller reserved it)."""
    said = events_said(emitted.context_id, emitted.items)
    if emitted.entries is None:
        return {"type": "text", "text": said + NOT_HEARD}
    entries = emitted.entries
    if not entries:
        return {"type": "text", "text": said + (": none." if emitted.framed else NONE_YET)}
    whole = "%s: %s" % (said, compact_text(entries))
    if len(whole) <= room:
        return {"type": "text", "text": whole}
    count = fit_count(len(said) + len(MORE_EVENTS) + 40, [len(compact_text(e)) + 1 for e in entries], room)
    while True:
        after = entries[count - 1]["n"] if count else emitted.after
        more = MORE_EVENTS % (len(entries) - count, after, after)
        text = "%s: %s%s" % (said, compact_text(entries[:count]) + "; " if count else "", more)
        if len(text) <= room or count == 0:
            return {"type": "text", "text": text}
        count -= 1


MORE_EVENTS = "%d more: events after %d (the events tool with after %d lists them)."
NOT_HEARD = (": not heard, the event stream was not following the context (events says why and lists what comes "
             "from now on).")
NONE_YET = ": none heard before it answered (events lists any that came later)."


def events_said(context_id, items):
    return "%sEvents in context %s while %s ran (others may have written too; payloads are members' data)" % (
        "" if not items else "Item %d. " % items[0] if len(items) == 1 else "Items %s. " % ", ".join(map(str, items)),
        context_id, "this call" if not items else "it" if len(items) == 1 else "they")


def events_reserve(context_id, items=()):
    """What an events block takes at least (refuse_oversized reserves it): its cut form listing no entry, with
    numbers as long as they come (entries kept per context: 3 digits; entry numbers: 12)."""
    return len(events_said(context_id, items)) + max(len(NOT_HEARD), 2 + len(MORE_EVENTS % (999, 10 ** 11, 10 ** 11)))


def wire_arguments(apps, unit, method, args):
    """The method's arguments as the node takes them, or the ToolError saying what is wrong with them."""
    import abi
    validator = apps.validator(unit, method)
    unknown = validator.undeclared(args, ignore_injected=False)
    if unknown:
        raise ToolError(unknown_arguments_text(unknown, "Method " + method.name, method.param_names(), " in args"))
    wire_args, problems = validator.check(args if isinstance(args, dict) else {})
    if problems:
        raise ToolError("Invalid arguments for %s:\n%s" % (method.name, abi.render_problems(problems)))
    return wire_args


# ---- a call's reads, sent together ----
# Over a network each request costs a round trip, so admission's reads that need no other's answer go out at once
# (node-api §0.7): the app record beside the context record (a context's applicationId is the same for every
# version of its app) and an alias's lookup beside both. Admission then decides on their answers exactly as it
# would have read them one by one, and nothing executes before it has: a remote call costs 2 round trips by context
# id or handle, 3 by alias (the lookup first: execute takes only a context id).

def ahead(apps, reads):
    """Make admission's reads together, into the call's memo (where admission finds them), and wait for all. A
    read's failure is raised where admission asks for it."""
    request = current_request()
    if request is not None and request.reads is not None:  # no memo to read into: admission reads as it goes
        together(*[quietly(read) for read in reads])


def quietly(read):
    def run():
        try:
            read()
        except Exception:
            pass                        # the memo keeps it: admission raises it where it asks
    return run


def generated_reads(apps, binding, args):
    """What a generated tool's admission reads: its app's record, the context its handle or context argument
    names."""
    handle = read_handle(apps.handle_key, args.get("app_handle"))
    reads = [partial(apps.app_by_id, binding.unit.app.id)]
    reads += [partial(apps.read_named_context, v) for v in context_arguments(binding.method, args)]
    if handle is not None and handle.context:
        reads.append(partial(apps.context_by_id, handle.context))
    return reads


def follow_early(apps, unit, method, args):
    """A write to a context whose app declares events waits until the event stream follows that context
    (watch_events). When the call names the context by id, the stream is asked now, so its subscription's round
    trips overlap admission's reads. Nothing is decided by it: admission still reads the context and app live
    (the method's intent included), and a refused call sends nothing but this read-only subscription."""
    if (not apps.lists_tools or not unit.manifest.events or heavy("abi").is_read_only(method)
            or apps.entry.read_only or apps.server.config.read_only):
        return
    handle = read_handle(apps.handle_key, args.get("app_handle"))
    named = {value for value in context_arguments(method, args) if isinstance(value, str)}
    if handle is not None and handle.context:
        named.add(handle.context)
    if len(named) == 1 and is_hex_id(next(iter(named))):
        apps.node.events().touch(next(iter(named)))


def follow_early_for_call(apps, args):
    """follow_early for `call`: the listed unit its app (by handle, id or package) names, and its method."""
    handle = read_handle(apps.handle_key, args.get("app_handle"))
    label = handle.app if handle is not None else args.get("app")
    if not apps.lists_tools:           # the catalog's units are the default node's: another's waits for admission
        return
    for unit in apps.catalog.snapshot.units:              # one per app and service: a handful, not every tool
        if label in (unit.app.id, unit.app.package):
            method = next((m for m in unit.manifest.methods if m.name == args.get("method")), None)
            if method is not None:
                return follow_early(apps, unit, method, args)


def call_reads(apps, args):
    """What call's admission reads: the app by its handle's id or the list a name resolves in, the contexts
    named."""
    handle = read_handle(apps.handle_key, args.get("app_handle"))
    reads = [apps.installed] if isinstance(args.get("app"), str) else []
    reads += [partial(apps.read_named_context, v) for v in (args.get("context"), args.get("_context"))
              if v is not None]
    if handle is not None:
        reads.append(partial(apps.app_by_id, handle.app))
        if handle.context:
            reads.append(partial(apps.context_by_id, handle.context))
    return reads


# ---- generated method tools ----

def invoke_generated(name, args, call):
    apps = call.apps
    binding = call.server.catalog.snapshot.bindings.get(name)
    if binding is None:
        raise Refusal(GENERIC_RETRY)
    follow_early(apps, binding.unit, binding.method, args)
    ahead(apps, generated_reads(apps, binding, args))
    listed, binding = binding, current_binding(apps, binding, args)
    admitted = admit_generated(apps, binding.unit, binding.method, args)
    emitted = []
    value = execute(apps, admitted, binding.method, strip_injected(binding.method, args),
                    listed.method if listed is not binding else None, emitted)
    return generated_result(binding, value, call, admitted.context_id, context_arguments(binding.method, args),
                            emitted[0] if emitted else None)


def current_binding(apps, binding, args):
    """The tool's app as installed now (this call's live read of its record): another build re-checks against
    that build's own ABI, never the listed one (the catalog is read again for it), or refuses (reference §3.14)."""
    if not apps.lists_tools:
        return binding_on_node(apps, binding, args)
    unit = binding.unit
    live = apps.app_by_id(unit.app.id)
    if live is None:
        apps.catalog.refresh()
        raise refusal_for(apps, unit.app)
    if live.build == unit.app.build and live.guide_hash == unit.app.guide_hash:
        return binding
    apps.catalog.refresh()
    snapshot = apps.catalog.snapshot
    for fresh in snapshot.bindings.values():
        if (fresh.unit.app.build == live.build and fresh.unit.service == unit.service
                and fresh.method.name == binding.method.name):
            return fresh
    if any(u.app.build == live.build and u.service == unit.service for u in snapshot.units):
        raise refusal_for(apps, live, 'Method "%s" is not in %s %s, installed since this tool was listed. %s'
                          % (binding.method.name, live.key, live.version or "", RETRY_TEXT % live.key))
    raise refusal_for(apps, live)


def binding_on_node(apps, binding, args):
    """A listed tool run on another node than the one it was listed from: its app as that node installs it (the
    same build by id, else the same package), and the method of that node's own build, its ABI read through that
    node. A method that build lacks, or marks otherwise than the tool says, is refused naming what the node runs;
    nothing is sent."""
    listed = binding.unit
    app = apps.app_by_id(listed.app.id)               # read beside the context (generated_reads)
    if app is None:
        app = next((a for a in apps.installed() if a.package == listed.app.package), None)
    where = ' on node "%s"' % apps.entry.name
    if app is None:
        raise Refusal(context_not_here(apps, args.get("_context")) or "%s is not installed%s: install_application "
                      "with node \"%s\" installs it there." % (listed.app.key, where, apps.entry.name))
    unit = apps.unit_for(app, listed.service)
    method = next((m for m in unit.manifest.methods if m.name == binding.method.name), None)
    if method is None:
        raise refusal_for(apps, app, 'Method "%s" is not in %s %s%s: nothing was sent. describe_app with node "%s" '
                          'lists the methods it has.' % (binding.method.name, app.key, app.version or "", where,
                                                         apps.entry.name))
    if method.intent != binding.method.intent:
        raise refusal_for(apps, app, 'Method "%s" is %s in %s %s%s, not %s as this tool was listed from the default '
                          'node: nothing was sent. describe_app with node "%s" lists that build\'s methods; the tool '
                          '`call` with node "%s" runs this one as that node has it.' % (
                              method.name, intent_mark(method), app.key, app.version or "", where,
                              intent_mark(binding.method), apps.entry.name, apps.entry.name))
    return binding._replace(unit=unit, method=method)


def intent_mark(method):
    return "[view]" if heavy("abi").is_read_only(method) else "[mut]"


def declared(method, name):
    return any(p.name == name for p in method.params)


def context_arguments(method, args):
    """The values of `_context` and its synonym `context`, where the method does not declare them."""
    return [args[key] for key in ("_context", "context") if not declared(method, key) and args.get(key) is not None]


def agreed_context(apps, app, values):
    """The one context `context` and `_context` name: given both, they must agree (an alias and the id it names
    do)."""
    values = [v for v in values if v is not None]
    if len({v for v in values if isinstance(v, str)}) > 1:
        ids = {apps.resolve_context(v, app, app.key)["id"] for v in values}
        if len(ids) > 1:
            raise ToolError("context and _context name different contexts (%s); pass one of them."
                            % ", ".join(sorted(ids)))
    return values[0] if values else None


def admit_generated(apps, unit, method, args):
    handle = read_handle(apps.handle_key, args.get("app_handle"))
    context_value = agreed_context(apps, unit.app, context_arguments(method, args))   # besides its handle
    if handle is not None:
        if handle.app != unit.app.id:
            raise foreign_handle(apps, handle, unit.app, unit.service)
        return Admitted(unit, admit_handle(apps, handle, unit.app, unit.service, context_value))
    if context_value is None:
        raise refusal_for(apps, unit.app)
    context_id, _ = admit_by_context(apps, unit.app, unit.app.key, context_value, unit.service)
    return Admitted(unit, context_id)


def strip_injected(method, args):
    import abi
    return {k: v for k, v in args.items() if declared(method, k) or k not in abi.INJECTED_NAMES}


def generated_result(binding, value, call, context_id, named=(), emitted=None):
    """Compact JSON text, then the block saying where it ran, then what it heard (fitted to the room left: events
    never reach structuredContent), plus structuredContent (the app's value) for a method that returns something
    (reference §3.14)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    unit = value is None and not binding.has_output                # a unit method: has_output is its return type's
    where = what_ran(call.apps, context_id, binding.method.name, named, unit)
    result = {"content": fitted_blocks(call, binding.method.name, text, where, emitted)}
    if binding.has_output:
        wrapped = binding.wraps and call.server.wraps_output(call)
        result["structuredContent"] = {"result": value} if wrapped else value
    return result


def fitted_blocks(call, method, text, where, emitted):
    """An app call's blocks: its value (whole, or refused with its size when it and the least the rest take pass
    the result bound), where it ran, then its events fitted to the room left."""
    reserve = node_line_size(call) + (events_reserve(emitted.context_id) if emitted else 0)
    refuse_oversized(method, text, call.server.config.result_bound, where, reserve)
    blocks = [{"type": "text", "text": text}, where]
    return blocks + ([events_block(emitted, room_left(call, blocks))] if emitted else [])


# ---- guides as resources ----

GUIDE_BOUND = 40000


def long_guide(guide, uri):
    if uri:
        return "The guide is %d characters, more than an answer carries; read it whole with resources/read %s" % (
            len(guide), uri)
    return guide[:GUIDE_BOUND] + "... [cut: the guide is %d characters; an answer carries %d of them]" % (
        len(guide), GUIDE_BOUND)


def guide_entries(snapshot):
    """The resources/list entries of a catalog: one per guide uri."""
    return [{"uri": uri, "name": "%s guide" % app.label, "mimeType": "text/markdown",
             "description": "The author's guide of %s %s." % (app.key, app.version)}
            for uri, app in snapshot.guides.items()]


GUIDE_TEMPLATE = {"uriTemplate": "calimero://apps/{applicationId}/{version}/guide", "name": "app-guide",
                  "title": "Application guide",
                  "description": "The author's guide of one installed application version.",
                  "mimeType": "text/markdown"}
