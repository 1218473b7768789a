"""The governance tools of mero-mcp, in tools.md order: namespaces, invitations and joins, group members, groups
and their upgrades. Registered among the fixed tools by toolset (mero_runtime.tool), whatever the import order.

Imports mero_tools (its helpers) and below; only mero_mcp imports it.
"""
import time
from functools import partial

from mero_runtime import (compact_text, CURSOR, DESTRUCTIVE, log, node_error_text, node_module, paged, READ_ONLY,
    together, tool, ToolError)
from mero_apps import carriers_text, LISTED_CONTEXTS
from mero_tools import (GROUP_ID, GroupVersions, NAMESPACE_ID, NOT_CONNECTED, STRING, group_app_version, is_epoch,
    namespace_row, progress, text_property, utc_text, version_key)

# Every module of ours states the release it belongs to (mero_runtime.module_problems).
__version__ = "0.1.0"


VISIBILITIES = ("open", "restricted")


@tool("create_namespace", "Create a namespace for an app's contexts; other nodes can join it.",
      {"application": STRING,
       "name": STRING},
      required=("application",), toolset="governance")
def create_namespace(args, call):
    apps = call.apps
    app = apps.resolve(args["application"])
    name = args.get("name")
    namesakes = namesakes_of(apps, name, call, namespaces_only=True)
    created = call.node.create_namespace(app.id, name=name)
    return with_namesakes(created, name, namesakes)


def namesakes_of(apps, name, call, namespaces_only=False, done="Nothing was created."):
    """The namespaces (and groups) already named `name`, as given; a name that reads as an id is refused: an
    argument of that form is taken as an id, so the new one could never be named. A create's rules, and a
    rename's (`done` says what was not)."""
    if name is None:
        return []
    if not name.strip():
        raise ToolError("name must not be blank: leave it out for no name. %s" % done)
    if node_module().is_hex64(name):
        raise ToolError('name "%s" reads as a 64-hex id, and a name of that form is taken as an id everywhere, so '
                        "it could never be named. Choose another name. %s" % (name, done))
    with call.reading():
        namespaces = apps.namespace_carriers()
        carriers = namespaces if namespaces_only else namespaces + apps.groups_of(namespaces)
    return [c for c in carriers if c.name == name]


def with_namesakes(created, name, namesakes):
    """What a create made, with the name it was given (when one was), and a note when another carries it too."""
    if name is not None:
        created = dict(created, name=name)
    if not namesakes:
        return created
    return dict(created, note='The name "%s" is also carried by %s: a name names one thing only while it is '
                              "unique, so pass ids to tell them apart." % (name, carriers_text(namesakes)))


@tool("delete_namespace", "Delete a namespace; delete its contexts first (they outlive it, uncallable).",
      {"namespace": NAMESPACE_ID}, required=("namespace",), annotations=DESTRUCTIVE, toolset="governance")
def delete_namespace(args, call):
    acted_on = call.apps.carrier_of(args["namespace"], call, "namespace")
    answer = call.node.delete_namespace(args["namespace"])
    return dict(answer, namespaceId=args["namespace"], name=acted_on.name)


@tool("invite_to_namespace", "Invite another node to a namespace (for its join_namespace).",
      {"namespace": NAMESPACE_ID}, required=("namespace",), toolset="governance")
def invite_to_namespace(args, call):
    entry, namespace = call.entry, args["namespace"]
    # Printed as join_namespace's arguments besides namespace, whichever form the node answered in.
    signed, group_name = node_module().signed_invitation(entry.node.invite_to_namespace(namespace))
    invitation = dict({"invitation": signed}, **({"groupName": group_name} if group_name is not None else {}))
    try:
        target = entry.node.group(namespace)["targetApplicationId"]
        app = next((a for a in entry.apps.installed() if a.id == target), None)
    except node_module().NodeError:
        app = None                          # the invitation exists: the note names the app in general words
    runs = ("install_application %s@%s if it lacks it" % (app.package, app.version) if app
            else "install the namespace's app if it lacks it")
    note = ("Hand over the JSON below whole and unchanged (join_namespace's arguments besides namespace) and "
            "namespace id %s. %s The other node then runs: %s; join_namespace with both; join_context for each "
            "context (list_contexts there shows them)." % (namespace, invitation_terms(invitation), runs))
    if call.server.nodes.multi:   # the hand-over keeps the bearer invitation out of the conversation
        note += (' For a node of this session, join_namespace with node (the joiner) and from "%s" does this '
                 "itself: no invitation changes hands." % entry.name)
    # Compact: the signed object's byte arrays take a line per byte when indented.
    return {"content": [{"type": "text", "text": note},
                        {"type": "text", "text": compact_text(invitation)}],
            "structuredContent": invitation}


# The borsh order of core's GroupMemberRole: an invitation carries the role as its index.
INVITED_ROLES = ("Admin", "Member", "ReadOnly", "ReadOnlyTee", "RelayTee")


def invitation_terms(invitation):
    """The signed body's expiry as a UTC date and its role by name (the node gives epoch seconds and an index)."""
    signed = invitation["invitation"].get("invitation")
    signed = signed if isinstance(signed, dict) else {}
    expiry, role = signed.get("expiration_timestamp"), signed.get("invited_role")
    terms = []
    if is_epoch(expiry) and expiry > 0:
        terms.append("It expires %s" % utc_text(expiry))
    if type(role) is int and 0 <= role < len(INVITED_ROLES):
        terms.append("makes the joiner %s" % INVITED_ROLES[role])
    return (" and ".join(terms) + ".") if terms else ""


@tool("join_namespace", "Join a namespace with invite_to_namespace's invitation (signed: pass it unchanged).",
      {"namespace": STRING,
       # Opaque on purpose: declared properties would let validation reshape a signed object (tools.md caution).
       "invitation": {"type": "object", "description": "From invite_to_namespace, unchanged."},
       "groupName": text_property("Local name.")},
      required=("namespace", "invitation"), toolset="governance")
def join_namespace(args, call):
    if args.get("from") is not None:
        if args.get("invitation") is not None:
            raise ToolError("Pass invitation or from, not both: with from the server mints the invitation itself.")
        return handed_over_join(call, call.server.nodes.named(args["from"]), args["namespace"], args.get("groupName"))
    if args.get("invitation") is None:
        raise ToolError("join_namespace needs the invitation from invite_to_namespace, or from: a node that is a "
                        "member of the namespace (list_nodes names them), which the server asks for one.")
    # The parsed dict keeps the sender's key order: the invitation goes out as it was signed.
    return member_named(call.node.join_namespace(args["namespace"], args["invitation"], args.get("groupName")))


HANDOVER_SECONDS = 600        # the invitation minted for a hand-over lives ten minutes: it is spent at once


def handed_over_join(call, giver, namespace, group_name):
    """join_namespace with from (issue 33 item 9): the namespace's app brought to the joiner first (brought_app),
    then an invitation minted on `giver` and spent on this node at once. The bearer invitation never leaves this
    function, and its signature and salt are secrets from the moment they are read (`secret`): no result, error or
    log line carries them, even a joiner's refusal that quotes the invitation."""
    here = call.entry
    if giver is here:
        raise ToolError('from names node "%s", the node the join runs on: name the member node to invite from.'
                        % giver.name)
    if giver.read_only:
        raise ToolError('node "%s" is read-only, so it mints no invitation; nothing was sent.' % giver.name)
    if not node_module().is_hex64(namespace):          # a name: the joiner knows none yet, the member node does
        try:
            namespace = giver.apps.resolve_group(namespace, "namespace", "namespace").id
        except ToolError as error:
            raise ToolError('On node "%s" (from): %s' % (giver.name, error.text)) from None
    if any(row["namespaceId"] == namespace for row in here.node.namespaces()):
        return {"namespaceId": namespace, "alreadyMember": True,
                "note": 'Node "%s" is already a member of namespace %s: nothing was minted. Next: %s'
                        % (here.name, namespace, contexts_to_join(giver, here, namespace))}
    info = giver.node.group(namespace)
    brought = None
    if not any(app.id == info["targetApplicationId"] for app in here.apps.installed()):
        brought = brought_app(giver, here, namespace, info)
    invitation = giver.node.invite_to_namespace(namespace, expires_in=HANDOVER_SECONDS, secret=True)
    try:
        joined = here.node.join_namespace(namespace, invitation, group_name)
    except node_module().NodeError as error:
        raise ToolError(join_failure(error, giver, here, brought)) from None
    answer = {"namespaceId": namespace, "joined": member_named(joined), "invitedBy": giver.name}
    if brought is not None:
        answer["installed"] = brought
    answer["next"] = contexts_to_join(giver, here, namespace)
    return answer


def member_named(joined):
    """A join's answer with the member's account under the name a members listing gives it (`identity`), and its
    namespace key as `publicKey`: one value, one name, in every answer."""
    renamed = {"memberAccount": "identity", "memberIdentity": "publicKey"}
    return {renamed.get(key, key): value for key, value in joined.items()} if isinstance(joined, dict) else joined


def brought_app(giver, here, namespace, info):
    """The namespace's exact build (package, version and signer: the same application id, node-api §0.8) installed
    on the joiner from its own registry, when that registry publishes it; else a refusal naming what it publishes
    and the other way in, with nothing sent to either node. Never another version."""
    target = info["targetApplicationId"]
    app = next((a for a in giver.apps.installed() if a.id == target), None)
    rows = [row for row in giver.node.namespaces() if row["namespaceId"] == namespace]
    version = group_app_version(giver.node, info, rows[0] if rows else None) or (app.version if app else None)
    lacks = 'Node "%s" lacks the namespace\'s application' % here.name
    if app is None or not app.package or not version:
        raise ToolError('%s (%s), and node "%s" cannot say its package and version. Nothing was sent: install the '
                        'bundle the namespace runs with install_application and node "%s", then join again.'
                        % (lacks, target, giver.name, here.name))
    build = "%s@%s" % (app.package, version)
    lacks += " %s (signer %s)" % (build, app.signer_id or "unknown")
    by_path = ('the same bundle (%s-%s.mpk) on node "%s"\'s machine: install_application with its path and node '
               '"%s", then join again' % (app.package, version, here.name, here.name))
    place = here.node.registry()
    if place.url is None:
        raise ToolError("%s, and its registry is unknown to this server: %s Nothing was sent. Ways in: "
                        'install_application with coords "%s" and node "%s" (its node fetches from its own '
                        "registry), or %s." % (lacks, place.problem, build, here.name, by_path))
    shown = node_module().display_url(place.url)
    try:
        published = [row.get("appVersion") for row in here.node.registry_bundles(app.package)]
    except node_module().NodeError as error:
        raise ToolError("%s, and its registry at %s could not say what it publishes (%s). Nothing was sent; the "
                        "other way in: %s." % (lacks, shown, str(error).rstrip("."), by_path)) from None
    if version not in published:
        has = ("publishes %s only in versions %s" % (app.package, ", ".join(map(str, published))) if published
               else "does not publish %s at all" % app.package)
        raise ToolError("%s, and its registry at %s %s. Nothing was sent: a node joins with the exact build the "
                        "namespace runs, never another version. The other way in: %s." % (lacks, shown, has, by_path))
    try:
        installed = here.node.install_application(app.package, version)["applicationId"]
    except node_module().NotPublished as error:
        raise ToolError("%s: %s Nothing was minted; the other way in: %s." % (lacks, str(error), by_path)) from None
    if installed != target:
        raise ToolError('%s. Its registry\'s %s installed as application %s, another signer\'s build, not the '
                        "namespace's %s. Nothing was minted; uninstall_application %s there, then %s."
                        % (lacks, build, installed, target, installed, by_path))
    if here.default:
        here.apps.catalog.refresh()          # the tool list is the default node's: its new app's tools join it
    return {"applicationId": target, "package": app.package, "version": version, "signerId": app.signer_id,
            "from": "node %s's registry at %s" % (here.name, shown)}


def contexts_to_join(giver, here, namespace):
    """The next step: join_context for each of the namespace's contexts, each by id with its name and the aliases
    it has on the member node (aliases are per node: from resolves them there)."""
    try:
        rows, aliases, joined = together(giver.node.contexts, giver.node.context_aliases, here.node.contexts)
    except node_module().NodeError:
        return 'join_context with node "%s" for each of its contexts (list_contexts with node "%s" shows them).' % (
            here.name, giver.name)
    named, joined = {}, {row.get("id") for row in joined}
    for alias, context_id in sorted(aliases.items()):
        named.setdefault(context_id, []).append(alias)
    rows = [row for row in rows if row.get("groupId") == namespace and row.get("id")]
    shown = [context_said(row, named.get(row["id"], []), giver.name) for row in rows if row["id"] not in joined]
    step = 'join_context with node "%s" and from "%s"' % (here.name, giver.name)
    if rows and not shown:
        return 'Node "%s" has joined %s.' % (here.name, "its one context" if len(rows) == 1
                                             else "all %d of its contexts" % len(rows))
    if not shown:
        return "The namespace has no contexts yet: %s joins one once it is created." % step
    more = " and %d more (list_contexts with node \"%s\")" % (len(shown) - LISTED_JOINS, giver.name) \
        if len(shown) > LISTED_JOINS else ""
    return ("%s for each context, by id, name or its alias on %s (aliases are per node): %s%s."
            % (step, giver.name, "; ".join(shown[:LISTED_JOINS]), more))


LISTED_JOINS = 8


def context_said(row, aliases, node_name):
    """`<id> ("kv-main"; kv, doomed on node1)`: a context by id with its name and its aliases on that node."""
    parts = ['"%s"' % row["name"]] if isinstance(row.get("name"), str) and row["name"] else []
    if aliases:
        parts.append("%s on %s" % (", ".join(aliases[:3]), node_name))
    return "%s (%s)" % (row["id"], "; ".join(parts)) if parts else row["id"]


def join_failure(error, giver, here, brought=None):
    """A join's 504 or 503 in words; never the request (it carried the invitation). An app installed on the way
    is said: it stays installed."""
    return join_failure_text(error, giver, here) + (
        " (%s@%s was installed on node \"%s\" first, and stays.)" % (brought["package"], brought["version"],
                                                                      here.name) if brought else "")


def join_failure_text(error, giver, here):
    if error.status == 504:
        return ('Node "%s" could not reach any member of the namespace (504): it is not connected to "%s". %s'
                % (here.name, giver.name, NOT_CONNECTED))
    if error.status == 503:
        return ('Node "%s" joined but the namespace key is still on its way (503): the membership is recorded and '
                'catches up; join_context there will wait for it.' % here.name)
    if error.status in (400, 409):          # the advice to pass the invitation as returned fits no hand-over
        return ('Node "%s" refused the invitation the server minted on "%s" for this join (never shown): %s. '
                "join_namespace with from mints a fresh one each time." % (here.name, giver.name,
                                                                            str(error).rstrip(".")))
    return 'Node "%s" could not join: %s' % (here.name, node_error_text(error))


@tool("leave_namespace", "Leave a namespace; its only admin can only as its last member, leaving it ungoverned.",
      {"namespace": NAMESPACE_ID}, required=("namespace",), annotations=DESTRUCTIVE, toolset="governance")
def leave_namespace(args, call):
    acted_on = call.apps.carrier_of(args["namespace"], call, "namespace")
    node = call.node
    alone = sole_admin(node, args["namespace"])          # read before: after leaving, its members are not ours to read
    joined = contexts_in(node, args["namespace"])
    node.leave_namespace(args["namespace"])
    said = "Left %s." % named_text(acted_on)
    if alone is not None:
        said += " This node was its only admin%s: no one is left who can invite to it, add members or upgrade it." % (
            " and only member" if alone else "")
    return said + " " + contexts_left(node, joined)


def contexts_in(node, namespace):
    """The contexts this node holds in a namespace and its subgroups, {id: alias or name or None}; {} unreadable."""
    try:
        groups = {namespace} | set(groups_below(node, namespace))
        aliases = {context_id: alias for alias, context_id in sorted(node.context_aliases().items())}
        return {c["id"]: aliases.get(c["id"]) or c.get("name") for c in node.contexts() if c.get("groupId") in groups}
    except node_module().NodeError:
        return {}


def contexts_left(node, joined):
    """What became of the contexts this node had joined there, read after the leave (issue 42)."""
    if not joined:
        return "This node had joined none of its contexts."
    try:
        kept = [cid for cid in (c["id"] for c in node.contexts()) if cid in joined]
    except node_module().NodeError:
        return ("Whether this node still lists its %d contexts could not be read: list_contexts shows them."
                % len(joined))
    if not kept:
        return "Its %d contexts are gone from this node." % len(joined)
    shown = ", ".join("%s%s" % (cid, " (%s)" % joined[cid] if joined[cid] else "") for cid in kept[:10])
    return ("This node still holds %d of its contexts (%s%s): leaving does not delete them, but as a non-member it "
            "takes no part in them; delete_context removes each."
            % (len(kept), shown, ", ..." if len(kept) > 10 else ""))


def sole_admin(node, namespace):
    """Whether this node is the namespace's only admin: None when not (or when the node will not say), else
    whether it is the only member too."""
    try:
        members = node.group_members(namespace)["members"]
        me = (node.identity().get("accountId") or "").lower()
    except node_module().NodeError:
        return None
    admins = [m["identity"].lower() for m in members if m.get("role") == "Admin"]
    return (len(members) == 1) if me and admins == [me] else None


def named_text(carrier):
    """`namespace <id> ("team")`, or the kind and id alone when it has no name or none could be read."""
    if carrier.name is None:
        return "%s %s" % (carrier.kind or "group", carrier.id)
    return carriers_text([carrier])


@tool("list_group_members", "Members of a group, with their roles.",
      {"group": GROUP_ID, "cursor": CURSOR}, required=("group",), annotations=READ_ONLY, toolset="governance")
def list_group_members(args, call):
    listed = call.node.group_members(args["group"])
    nodes = node_accounts(call.server.nodes)
    if nodes:                 # several nodes: a member that is one of them is marked with its name
        listed = dict(listed, members=[dict(m, node=nodes[m["identity"].lower()]) if m["identity"].lower() in nodes
                                       else m for m in listed["members"]])
    return paged("list_group_members", args, listed, "members", "identity")


IDENTITY_SECONDS = 2.0        # each node's account read for the members' names: all at once, a down node left out


def node_accounts(nodes):
    """{account id: node name} of every configured node that will say its account (several nodes only)."""
    def account(entry):
        try:
            return (entry.node.identity(timeout=IDENTITY_SECONDS).get("accountId") or "").lower() or None
        except node_module().NodeError:
            return None                     # a fresh node has none yet; a down one cannot say
    entries = list(nodes.entries.values())
    found = together(*[partial(account, entry) for entry in entries])
    return {found: entry.name for entry, found in zip(entries, found) if found}


@tool("add_group_members", "Add members to a group, each with a role.",
      {"group": GROUP_ID,
       "members": {"type": "array", "minItems": 1,
                   "items": {"type": "object", "required": ["identity", "role"], "properties": {
                       "identity": text_property("Account id."),
                       "role": text_property("Admin, Member or ReadOnly.")}}}},
      required=("group", "members"), toolset="governance")
def add_group_members(args, call):
    members = [{"identity": m["identity"], "role": m["role"]} for m in args["members"]]
    call.node.add_group_members(args["group"], members)
    added = ", ".join("%s (%s)" % (m["identity"], m["role"]) for m in members)
    return "Added %s to group %s." % (added, args["group"])


@tool("remove_group_members", "Remove members from a group.",
      {"group": GROUP_ID, "members": {"type": "array", "minItems": 1, "items": text_property("Account id.")}},
      required=("group", "members"), annotations=DESTRUCTIVE, toolset="governance")
def remove_group_members(args, call):
    node, group = call.node, args["group"]
    acted_on = call.apps.carrier_of(group, call, "group")
    members, repeated = canonical_accounts(args["members"])
    # The node checks no account (node-api §0.6): one that is not a member would be "removed" silently.
    listed = {m["identity"]: m.get("name") for m in node.group_members(group)["members"]}
    strangers = [m for m in members if m not in listed]
    if strangers:
        raise ToolError("Not members of %s: %s. Nothing was removed; list_group_members shows its members."
                        % (named_text(acted_on), ", ".join(strangers)))
    node.remove_group_members(group, members)
    removed = ['%s ("%s")' % (m, listed[m]) if isinstance(listed[m], str) and listed[m] else m for m in members]
    said = "Removed %s from %s." % (", ".join(removed), named_text(acted_on))
    return said + (" Given more than once, removed once: %s." % ", ".join(repeated) if repeated else "")


def canonical_accounts(accounts):
    """Account ids each once (one_id_form made them lower-case hex, as the node lists them); and those given more
    than once."""
    seen, repeated = [], []
    for account in accounts:
        if account in seen:
            if account not in repeated:
                repeated.append(account)
        else:
            seen.append(account)
    return seen, repeated


MEMBER_ROLES = ("Admin", "Member", "ReadOnly")       # the node assigns its TEE roles itself


@tool("set_member_role", "Change a group member's role.",
      {"group": GROUP_ID, "member": text_property("Account id."),
       "role": {"type": "string", "enum": list(MEMBER_ROLES)}},
      required=("group", "member", "role"), toolset="governance")
def set_member_role(args, call):
    call.node.set_member_role(args["group"], args["member"], args["role"])
    return "Member %s of group %s now has role %s." % (args["member"], args["group"], args["role"])


@tool("create_group", "Create a subgroup in a namespace, or under a parent group.",
      {"namespace": NAMESPACE_ID,
       "name": STRING,
       "visibility": {"type": "string", "enum": list(VISIBILITIES),
                      "description": "open: namespace members can join it; restricted: members must be added. "
                                     "Default open, restricted with parent."},
       "parent": dict(GROUP_ID, description="Group to nest under.")},
      required=("namespace",), toolset="governance")
def create_group(args, call):
    node, namespace = call.node, args["namespace"]
    namesakes = namesakes_of(call.apps, args.get("name"), call)
    if args.get("parent") is None:
        visibility = args.get("visibility") or "open"
        group_id = node.create_group(namespace, args.get("name"), visibility)
        return with_namesakes(created_group(group_id, namespace, namespace, visibility), args.get("name"), namesakes)
    if not node.namespace_holds(namespace, args["parent"]):      # core's nested create takes no namespace
        raise ToolError("Group %s is not in namespace %s. Pass the namespace the parent is in, or a parent inside "
                        "namespace %s." % (args["parent"], namespace, namespace))
    return with_namesakes(create_nested_group(node, args), args.get("name"), namesakes)


def created_group(group_id, parent, namespace, visibility):
    """What create_group made, as it now stands: where it sits and who may join it."""
    return {"groupId": group_id, "parentId": parent, "namespaceId": namespace, "visibility": visibility}


def create_nested_group(node, args):
    """Core's nested create takes the parent's application and no visibility: the group is born restricted."""
    parent = args["parent"]
    group_id = node.create_nested_group(parent, args.get("name"))
    visibility = args.get("visibility")
    if visibility is not None and visibility != "restricted":
        try:
            node.set_group_visibility(group_id, visibility)
        except node_module().NodeError as error:
            # Name the group that now exists, so the agent finishes the job instead of creating a second one.
            raise ToolError("Group %s was created under %s but its visibility was not set; retry "
                            "set_group_visibility. %s" % (group_id, parent, error))
    return created_group(group_id, parent, args["namespace"], visibility or "restricted")


@tool("describe_group", "A namespace or group: name, parent, app, visibility, counts, subgroups, metadata, "
      "upgrade.",
      {"group": GROUP_ID, "cursor": CURSOR}, required=("group",), annotations=READ_ONLY, toolset="governance")
def describe_group(args, call):
    entry, group = call.entry, args["group"]
    node = entry.node
    info = node.group(group)
    namespaces = {row["namespaceId"]: row for row in node.namespaces()}
    parent, namespace = group_place(node, group, info.get("namespaceId"), namespaces)
    metadata = info.get("metadata") or {}
    own_row = namespaces.get(group) or (parent or {}).pop("child", None) or {}
    target = info["targetApplicationId"]
    app = next((a for a in entry.apps.installed() if a.id == target), None)
    described = {"groupId": group, "name": metadata.get("name") or own_row.get("name"),
                 "kind": "namespace" if group in namespaces else "subgroup",
                 "namespace": namespace, "parent": parent["groupId"] if parent else None,
                 "application": {"id": target, "package": app.package if app else None,
                                 "version": group_app_version(node, info, namespaces.get(namespace))},
                 "visibility": info.get("subgroupVisibility"), "memberCount": info.get("memberCount"),
                 "contextCount": info.get("contextCount"), "countsNote": OWN_COUNTS}
    if group in namespaces:                  # when and by whom it was founded: only a namespace's row says
        shown = namespace_row(namespaces[group])
        described.update({key: shown[key] for key in ("createdAt", "founder") if key in shown})
    described.update(known_subgroups(node, group, namespaces.get(group)))
    described["metadata"] = metadata.get("data")
    described["upgrade"] = counts_said(node.upgrade_status(group) or info.get("activeUpgrade"))
    moved = described["upgrade"] if isinstance(described["upgrade"], dict) else {}
    if described["application"]["version"] is None and moved.get("status") == "completed":
        described["application"]["version"] = moved.get("toVersion")     # the version it moved to
    with_newer_build(described["application"], GroupVersions(node, {app.id: app.version} if app else {}), group)
    return paged("describe_group", args, described, "subgroups", "groupId")      # subgroups page like a list


def with_newer_build(application, versions, group):
    """The newest installed build of the group's app when the group runs an older one, and what moves it."""
    running, newest = application["version"], versions.newest(application["id"])
    if running and newest and version_key(newest) > version_key(running):
        application["newestInstalled"] = newest
        application["upgrade"] = "upgrade_group %s moves it to %s" % (group, newest)


def listed_name(node, group):
    """The name a group is listed by when its metadata record holds none (a creation name, kept locally)."""
    namespace = node.group(group).get("namespaceId") or group
    rows = [row for row in node.namespaces() if row["namespaceId"] == group] or [
        row for row in node.groups_in(namespace) if row["groupId"] == group]
    return rows[0].get("name") if rows else None


def known_subgroups(node, group, namespace_row):
    """Every subgroup under a namespace this node can list (its groups list, then each level's subgroups route),
    or a subgroup's direct children; a count the node gives beyond what it shows is said."""
    if namespace_row is None:
        return {"subgroups": with_counts(node, node.subgroups(group))}
    rows = node.groups_in(group)
    shown = {"subgroups": with_counts(node, [{key: row[key] for key in ("groupId", "name", "parentId") if key in row}
                                             for row in rows])}
    direct = sum(1 for row in rows if row["parentId"] == group)
    counted = namespace_row.get("subgroupCount")
    if isinstance(counted, int) and counted > direct:
        shown["subgroupsNote"] = ("The namespace counts %d subgroups directly in it; this node can see %d (the rest "
                                  "are restricted groups it is not a member of)." % (counted, direct))
    elif not isinstance(counted, int):
        shown["subgroupsNote"] = ("These are the subgroups this node can see; the node gives no count to compare, "
                                  "so restricted groups it is not a member of may be missing.")
    return shown


def with_counts(node, rows):
    """Subgroup rows with the member and context counts their group info gives (null where this node may not read
    it: a restricted group it is not a member of)."""
    def counted(row):
        try:
            info = node.group(row["groupId"])
        except node_module().NodeError:
            info = {}
        return dict(row, memberCount=info.get("memberCount"), contextCount=info.get("contextCount"))
    return [counted(row) for row in rows]


# What the double serves (node-api.md gives the counts, not their reach): a group counts its own members and contexts.
OWN_COUNTS = ("memberCount and contextCount count this group's own: a namespace's members, a subgroup's only those "
              "added to it or that joined it; the contexts directly in it. Each subgroup's counts are its own.")

NOT_REPORTED = ("The node did not report how many contexts moved (null counts): it marks an upgrade completed "
                "before any context migrates, and each context moves when next called; list_contexts shows which "
                "are behind.")


def counts_said(record):
    """An upgrade record with the counts the node left out said as not reported (node-api §0.7)."""
    if not isinstance(record, dict):
        return record
    missing = [key for key in ("localContextsTotal", "localContextsSwapped", "localContextsFailed")
               if key in record and record[key] is None]
    return dict(record, countsNote=NOT_REPORTED) if missing else record


def group_place(node, group, namespace, namespaces):
    """(parent row with the group's own row as `child`, namespace id): group info names neither parent nor, before
    rc.83, namespace, so the namespaces are walked down (node-api §0.6)."""
    if group in namespaces:
        return None, group
    for candidate in [namespace] if namespace else list(namespaces):
        parent = node.group_parent(candidate, group)
        if parent is not None:
            return parent, candidate
    return None, namespace


@tool("delete_group", "Delete a subgroup (a namespace: delete_namespace); newest nodes delete its subgroups and "
      "contexts too.",
      {"group": GROUP_ID}, required=("group",), annotations=DESTRUCTIVE, toolset="governance")
def delete_group(args, call):
    node, group = call.node, args["group"]
    namespace = next((row for row in node.namespaces() if row["namespaceId"] == group), None)
    if namespace is not None:      # newest nodes refuse it too; older ones would delete the namespace
        raise ToolError("%s is a namespace%s: delete_group deletes subgroups. Delete a namespace with "
                        "delete_namespace." % (group, ' ("%s")' % namespace["name"] if namespace.get("name") else ""))
    acted_on = call.apps.carrier_of(group, call, "group")
    below = groups_below(node, group)
    before = {c["id"]: c.get("groupId") for c in node.contexts()}
    answer = dict(node.delete_group(group), groupId=group, name=acted_on.name)
    # What went is read back, not assumed: a restricted subgroup this node cannot list loses its contexts too.
    try:
        after = {c["id"] for c in node.contexts()} if before else set()
        answer["deletedSubgroups"] = [g for g in below if not group_exists(node, g)]
    except node_module().NodeError as error:
        answer["note"] = ("%s was deleted; which of its subgroups and contexts went with it could not be confirmed "
                          "(%s). list_contexts and describe_group show what is left." % (named_text(acted_on),
                                                                                         unanswered_read(error)))
        return answer
    answer["deletedContexts"] = [c for c in before if c not in after]
    unlisted = sorted({before[c] for c in answer["deletedContexts"]} - set(below) - {group, None})
    if unlisted:
        answer["unlistedGroups"] = unlisted
        answer["note"] = ("The delete also reached groups this node cannot list (restricted ones it is not a member "
                          "of): contexts of %s are gone too." % ", ".join(unlisted))
    return answer


def unanswered_read(error):
    """How a read after a write failed, without the read's own advice (the write is done: nothing to repeat)."""
    status = getattr(error, "status", None)
    return "the node answered HTTP %s to the read after it" % status if status else "the read after it got no answer"


def groups_below(node, group):
    """Every group under `group`, level by level."""
    found, level = [], [group]
    while level:
        level = [row["groupId"] for parent in level for row in node.subgroups(parent) if row["groupId"] not in found]
        found.extend(level)
    return found


def group_exists(node, group):
    """False when the node says it is not there, True when it is (a 403: there, but not shown to this node); any
    other failure is raised, since it confirms nothing."""
    try:
        node.group(group)
    except node_module().NotFound:
        return False
    except node_module().Forbidden:
        pass                            # there, but not shown to this node
    return True


@tool("set_group_visibility", "Make a group open (namespace members can join it) or restricted (members must be "
      "added).",
      {"group": GROUP_ID,
       "visibility": {"type": "string", "enum": list(VISIBILITIES)}},
      required=("group", "visibility"), toolset="governance")
def set_group_visibility(args, call):
    node, group, visibility = call.node, args["group"], args["visibility"]
    before = node.group(group).get("subgroupVisibility")
    node.set_group_visibility(group, visibility)
    said = "namespace members can join it (join_open_group)" if visibility == "open" else "members must be added"
    if before == visibility:
        return "Group %s was already %s: %s." % (group, visibility, said)
    return "Group %s is now %s (was %s): %s." % (group, visibility, before or "unknown", said)


@tool("set_group_metadata", "Rename a group or set its metadata; what is omitted is kept.",
      {"group": GROUP_ID,
       "name": STRING,
       "data": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Replaces the data."}},
      required=("group",), toolset="governance")
def set_group_metadata(args, call):
    node, group = call.node, args["group"]
    # The node replaces the whole record (node-api §0.7): what is omitted is read back and sent as it was.
    record = node.group_metadata(group) or {}
    previous = record.get("name") or listed_name(node, group)
    name = args["name"] if args.get("name") is not None else previous
    namesakes = []
    if args.get("name") is not None and name != previous:        # a rename follows create's rules
        namesakes = [c for c in namesakes_of(call.apps, name, call, done="Nothing was changed.")
                     if c.id != group]
    data = args["data"] if args.get("data") is not None else (record.get("data") or {})
    node.set_group_metadata(group, name, data)
    answer = {"groupId": group, "name": name, "data": data}
    if previous != name:
        answer["renamedFrom"] = previous
    return with_namesakes(answer, name, namesakes)


@tool("join_open_group", "Join an open group (via its parent); then join_context for its contexts.",
      {"group": GROUP_ID}, required=("group",), toolset="governance")
def join_open_group(args, call):
    return call.node.join_open_group(args["group"])


@tool("upgrade_group", "Move a namespace or group to its app's newest installed version; cascade: subgroups too.",
      {"group": GROUP_ID, "application": text_property("Default: the group's."), "cascade": {"type": "boolean"}},
      required=("group",), annotations=DESTRUCTIVE, toolset="governance")
def upgrade_group(args, call):
    entry, group = call.entry, args["group"]
    node = entry.node
    current = node.group(group)["targetApplicationId"]
    target = current
    if args.get("application") is not None:
        target = refuse_another_package(entry.apps, group, current, entry.apps.resolve(args["application"]))
    started = node.upgrade_group(group, target, args.get("cascade"))
    record = settled_upgrade(node, group, started, call)
    if record.get("status") != "completed":
        return dict(counts_said(record), note=UNFINISHED % UPGRADE_WAIT_SECONDS)
    return upgraded(node, group, record, args.get("cascade"))


UPGRADE_WAIT_SECONDS = 5
UPGRADE_POLL_SECONDS = 0.25
UNFINISHED = "Not completed after %d s: describe_group shows its progress until it is completed."
MOVES_NEXT_CALL = ("The node upgrades a context lazily: each runs the new version from its next call; until then its "
                   "applicationVersion is the version it last ran.")


def settled_upgrade(node, group, started, call):
    """The group's upgrade record (its versions) once the node reports it completed, or as it stands after
    UPGRADE_WAIT_SECONDS (a cancel stops the wait: the upgrade was sent); a progress notification each read, when
    the request asked for them. The upgrade's own answer stands in when the record cannot be read."""
    deadline, reads, record = time.monotonic() + UPGRADE_WAIT_SECONDS, 0, started
    while True:
        reads += 1
        try:
            record = node.upgrade_status(group) or record
        except node_module().NodeError as error:
            log.info("upgrade status of %s unreadable: %s", group, error)
        progress(call, reads, message="upgrade %s" % record.get("status"))
        if record.get("status") == "completed" or time.monotonic() >= deadline or call.ticket.is_set():
            return record
        time.sleep(UPGRADE_POLL_SECONDS)


def upgraded(node, group, record, cascade):
    """A completed upgrade: the version the group moved to and each local context's, those that move only when
    next called marked."""
    version = group_version_now(node, group) or record.get("toVersion")
    groups = {group} | (set(groups_below(node, group)) if cascade else set())
    contexts = [{"id": c["id"], "name": c.get("name"), "applicationVersion": c.get("applicationVersion"),
                 "movesWhenNextCalled": c["applicationVersion"] != version if c.get("applicationVersion") else None}
                for c in node.contexts() if c.get("groupId") in groups]
    answer = {"groupId": group, "status": "completed", "fromVersion": record.get("fromVersion"), "version": version,
              "contexts": contexts[:LISTED_CONTEXTS]}
    if len(contexts) > LISTED_CONTEXTS:
        answer["contextsNote"] = "%d more contexts moved with it: list_contexts shows each one's version." % (
            len(contexts) - LISTED_CONTEXTS)
    if any(c["movesWhenNextCalled"] for c in contexts):
        answer["note"] = MOVES_NEXT_CALL
    if not cascade:
        answer.update(subgroups_not_moved(node, group, version))
    return answer


def subgroups_not_moved(node, group, version):
    """Without cascade: the subgroups below that still run another version, and what moves them (issue 42)."""
    try:
        below = groups_below(node, group)
    except node_module().NodeError:
        return {}
    behind = []
    for subgroup in below:
        running = group_version_now(node, subgroup)
        if running != version:
            behind.append({"groupId": subgroup, "name": group_name(node, subgroup), "version": running})
    if not behind:
        return {}
    return {"subgroupsNotMoved": behind[:LISTED_CONTEXTS],
            "subgroupsNote": "Without cascade these %d subgroups keep their version: upgrade_group %s again with "
                             "cascade: true moves them all, or upgrade_group one by its groupId." % (len(behind), group)}


def group_name(node, group):
    try:
        return (node.group(group).get("metadata") or {}).get("name") or listed_name(node, group)
    except node_module().NodeError:
        return None


def group_version_now(node, group):
    """The version of the blob the group runs, read now; None when the node will not say."""
    try:
        info = node.group(group)
        rows = [row for row in node.namespaces() if row["namespaceId"] == info.get("namespaceId", group)]
    except node_module().NodeError:
        return None
    return group_app_version(node, info, rows[0] if rows else None)


def refuse_another_package(apps, group, current, app):
    """An upgrade moves a group to a newer build of its own app (same package, same signer): another package,
    another signer's build of it, or an older build is refused before anything is sent (the node would move the
    group's contexts onto code their state was never written by, or by someone else)."""
    running = apps.app_by_id(current)
    if running is None or app.id == current:
        return app.id
    if running.package != app.package:
        raise ToolError("Group %s runs %s; %s is another package, and upgrade_group moves a group to a newer "
                        "version of its own app. Nothing was sent; install the new version of %s and upgrade to "
                        "it." % (group, running.package, app.package, running.package))
    if running.signer_id != app.signer_id:
        raise ToolError("Group %s runs %s signed by %s; application %s is %s signed by %s, another publisher's "
                        "build, and upgrade_group moves a group only to a build of its own signer. Nothing was "
                        "sent." % (group, running.package, running.signer_id or "an unknown signer", app.id,
                                   app.package, app.signer_id or "an unknown signer"))
    if running.version and app.version and version_key(app.version) <= version_key(running.version):
        raise ToolError("Group %s runs %s %s; application %s is version %s, not newer. Nothing was sent; "
                        "upgrade_group moves a group to a newer build only." % (group, running.package,
                                                                                running.version, app.id, app.version))
    return app.id
