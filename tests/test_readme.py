"""The README's "Try it by hand" section, run as written: every command and host snippet in it, against the node
double on a free port, with the output the README shows.

Substitutions, and only these: `python3` becomes this interpreter (it has requests and jsonschema), the README's
port 2530 a free one, `/path/to/mero-mcp` this checkout. A command block followed by a `text` block must print
those lines: a line `…` stands for any lines, a `…` within a line for any text there.
"""
from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys

import pytest

from mcp_client import APP_TOOLS, ROOT, McpServer, fixed_names, fixed_snapshot, minimal_env, our_variables

README = ROOT / "README.md"
SECTION = "## Try it by hand"
README_PORT = "2530"
ELLIPSIS = "…"
COMMAND_TIMEOUT = 60


def section_blocks():
    """(language, text) of every fenced block of the section, in order."""
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    body = text[start:end if end != -1 else len(text)]
    return re.findall(r"^```(\w*)\n(.*?)^```", body, re.S | re.M)


def paired(blocks):
    """Each sh/json block with the text block right after it (None when there is none)."""
    steps = []
    for index, (language, text) in enumerate(blocks):
        if language in ("sh", "json"):
            following = blocks[index + 1] if index + 1 < len(blocks) else None
            expected = following[1] if following and following[0] == "text" else None
            steps.append((language, text, expected))
    return steps


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def assert_lines_match(actual, expected):
    """`expected` in order; a line `…` skips any number of lines, a `…` within a line matches any text there."""
    actual = actual.splitlines()
    position, skipping = 0, False
    for wanted in expected.splitlines():
        if wanted == ELLIPSIS:
            skipping = True
            continue
        while True:
            assert position < len(actual), "README line not printed: %r\nprinted:\n%s" % (wanted, "\n".join(actual))
            line = actual[position]
            position += 1
            matched = re.fullmatch(".*".join(map(re.escape, wanted.split(ELLIPSIS))), line) is not None
            if matched:
                break
            assert skipping, "README says %r, printed %r\nprinted:\n%s" % (wanted, line, "\n".join(actual))
        skipping = False
    assert skipping or position == len(actual), "printed more than the README shows: %r" % actual[position:]


class HandSession:
    """What a reader has: a node started by the README's command, commands typed in another terminal."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.env = minimal_env(tmp_path / "home")
        (tmp_path / "home").mkdir(exist_ok=True)          # a reader's home exists: step 5 writes a file there
        self.node = None

    def localise(self, text):
        text = text.replace("/path/to/mero-mcp", str(ROOT)).replace(README_PORT, self.port)
        return re.sub(r"(?<![\w./-])python3(?![\w.-])", shlex.quote(sys.executable), text)

    @property
    def url(self):
        return "http://127.0.0.1:%s" % self.port

    def start_node(self, command):
        self.stop_node()
        self.node = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                                     env=self.env)
        return self.node.stdout.readline()

    def stop_node(self):
        if self.node is not None:
            self.node.terminate()
            self.node.wait(10)
            self.node.stdout.close()
            self.node = None

    def shell(self, command):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=str(ROOT), env=self.env,
                              timeout=COMMAND_TIMEOUT)
        assert done.returncode == 0, "%s\nexit %s\n%s%s" % (command, done.returncode, done.stdout, done.stderr)
        return done.stdout

    def host_session(self, command, env):
        """Start the server as a host would from its config, and use it: the node it reaches is ours."""
        server = McpServer(dict(self.env, **env), command=command)
        try:
            server.initialize()
            status = server.tool_json("node_status")
            assert status["url"] == self.url and status["health"] == {"status": "alive"}, status
            assert server.tool_json("kv_store_len", {"context": "demo"}) >= 0
            read_only = env.get("CALIMERO_MCP_READ_ONLY") == "1"     # what the README says that snippet does
            names = server.tool_names()
            assert status["readOnly"] is read_only and "kv_store_get" in names, status
            assert ("kv_store_set" in names and "create_context" in names) is not read_only, names
        finally:
            server.close()
        server.assert_stdout_pure()


def claude_mcp_add(command):
    """(server command, env) of a `claude mcp add` line, read as current releases read it: `-e`/`--env` takes
    every value up to the next option or `--` (a name written after it is one more variable, which the CLI refuses:
    "Invalid environment variable format"), and the README registers for every folder (`-s user`)."""
    words = shlex.split(command)
    assert words[:3] == ["claude", "mcp", "add"] and "--" in words, command
    options, server = words[3:words.index("--")], words[words.index("--") + 1:]
    env, names, scope, index = {}, [], "local", 0
    while index < len(options):
        word = options[index]
        index += 1
        if word in ("-s", "--scope"):
            scope, index = options[index], index + 1
        elif word in ("-e", "--env"):
            while index < len(options) and not options[index].startswith("-"):
                key, equals, value = options[index].partition("=")
                assert key and equals, "Invalid environment variable format: %s (in %s)" % (options[index], command)
                env[key] = value
                index += 1
        else:
            assert not word.startswith("-"), "an option the README does not use: %s" % word
            names.append(word)
    assert names == ["mero-mcp"] and scope == "user", (names, scope, command)
    assert server, command
    return server, env


def json_host_config(text):
    entry = json.loads(text)["mcpServers"]["mero-mcp"]
    return [entry["command"]] + entry.get("args", []), entry.get("env", {})


def test_the_section_has_the_steps_a_newcomer_needs():
    steps = paired(section_blocks())
    commands = [text for language, text, _ in steps if language == "sh"]
    assert sum("tests/node_double.py --sample" in c for c in commands) == 2
    assert any("--auth" in c for c in commands) and "dev-password" in "".join(commands)
    assert any("--check" in c for c in commands) and any("tools/call" in c for c in commands)
    assert any(c.startswith("claude mcp add") for c in commands) and any(lang == "json" for lang, _, _ in steps)
    assert any('"CALIMERO_MCP_READ_ONLY": "1"' in text for lang, text, _ in steps if lang == "json")


def test_every_step_runs_as_written(tmp_path):
    session = HandSession(tmp_path)
    ran = 0
    try:
        for language, text, expected in paired(section_blocks()):
            local = session.localise(text.strip())
            if language == "json":
                session.host_session(*json_host_config(local))
            elif local.startswith("claude "):
                session.host_session(*claude_mcp_add(local))
            elif "tests/node_double.py" in local:
                printed = session.start_node(local)
                assert_lines_match(printed, session.localise(expected))
            else:
                printed = session.shell(local)
                if expected is not None:
                    assert_lines_match(printed, session.localise(expected))
            ran += 1
    finally:
        session.stop_node()
    assert ran == len(paired(section_blocks())) >= 8


def test_the_claude_code_reader_refuses_the_forms_current_releases_refuse():
    server, env = claude_mcp_add("claude mcp add -s user mero-mcp -e A=1 B=2 --env C=3 -- python3 x.py")
    assert server == ["python3", "x.py"] and env == {"A": "1", "B": "2", "C": "3"}
    for wrong in ("claude mcp add --env A=1 mero-mcp -- python3 x.py",     # the name swallowed by --env
                  "claude mcp add mero-mcp --env A=1 -- python3 x.py",     # registered for this folder only
                  "claude mcp add -s user mero-mcp -- "):
        with pytest.raises(AssertionError):
            claude_mcp_add(wrong)


def counter_lines():
    """The protocol lines of the counter example in "Try it by hand" (its `jsonl` block)."""
    blocks = [text for language, text in section_blocks() if language == "jsonl"]
    assert len(blocks) == 1, blocks
    return [json.loads(line) for line in blocks[0].splitlines() if line.strip()]


def test_the_counter_example_runs_as_written(tmp_path):
    """create_namespace, then create_context in that namespace, then counter_increment: each placeholder <name> is
    the field of that name in an earlier answer, and the total is 5, then 10, as the section says."""
    session = HandSession(tmp_path)
    session.start_node(session.localise("python3 tests/node_double.py --sample --port 2530"))
    server = McpServer(dict(session.env, CALIMERO_NODE_URL=session.url))
    try:
        server.initialize()
        lines, answers = counter_lines(), {}
        assert [line["params"]["name"] for line in lines] == ["create_namespace", "create_context",
                                                              "counter_increment"]
        for line in lines:
            text = json.dumps(line["params"]["arguments"])
            for name, value in answers.items():
                text = text.replace("<%s>" % name, value)
            assert "<" not in text, text
            answer = server.tool_json(line["params"]["name"], json.loads(text))
            if isinstance(answer, dict):
                answers.update({key: value for key, value in answer.items() if isinstance(value, str)})
        assert answer == 5
        assert server.tool_json(lines[-1]["params"]["name"], json.loads(text)) == 10
    finally:
        server.close()
        session.stop_node()
    server.assert_stdout_pure()


# ── Register it with your agent: one block per host, each parsed and then run as the host would ────────────

REGISTER = "## Register it with your agent"
HOSTS = ("Claude Code", "Claude Desktop", "Cursor", "VS Code", "Codex", "Gemini CLI")
README_NODE = "http://localhost:2528"
README_NODES = "node1=http://localhost:2528,node2=http://localhost:2529"      # each host's second block
SECOND_NODE = "http://localhost:2529"
CURSOR_LIMIT = 40
# Counts a new fixed tool leaves true: each toolset's own count is stated once, in "What the agent sees".
CURSOR_COUNT = re.compile(r"Cursor count: `(\w[\w,]*)` and the sample node's two apps \((\d+) tools\) stay within "
                          r"Cursor's 40\.")
CURSOR_MORE = re.compile(r'"CALIMERO_MCP_TOOLSETS": "([\w,]+)"`, past 40 with the sample\'s\s+(\d+)\)')


def section(heading):
    text = README.read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end != -1 else len(text)]


def host_blocks():
    """{host: [(language, text)]} of the section's `### <host>` parts."""
    body = section(REGISTER)
    found = {}
    for part in re.split(r"^### ", body, flags=re.M)[1:]:
        title, _, rest = part.partition("\n")
        found[title.strip()] = re.findall(r"^```(\w*)\n(.*?)^```", rest, re.S | re.M)
    return found


def host_config(host, language, text):
    """(command, env) of one host's snippet, checked for the keys that host requires."""
    if host == "Claude Code":
        assert language == "sh"
        return claude_mcp_add(text.strip())
    if host == "Codex":
        tomllib = pytest.importorskip("tomllib", reason="TOML is read by Python 3.11's tomllib")
        entry = tomllib.loads(text)["mcp_servers"]["mero-mcp"]
    else:
        assert language == "json"
        config = json.loads(text)
        key = "servers" if host == "VS Code" else "mcpServers"
        assert set(config) == {key}, "%s reads %s" % (host, key)
        entry = config[key]["mero-mcp"]
        if host == "VS Code":
            assert entry["type"] == "stdio", entry
    assert isinstance(entry["command"], str) and all(isinstance(arg, str) for arg in entry.get("args", [])), entry
    env = entry.get("env", {})
    assert all(isinstance(value, str) for value in env.values()), env
    if host == "Gemini CLI":        # its $VAR expansion runs on an environment already stripped of secrets
        assert not any("$" in value for value in env.values()), env
    return [entry["command"]] + entry.get("args", []), env


def test_every_host_has_a_block_for_one_node_and_one_for_several_with_the_keys_it_requires():
    blocks = host_blocks()
    assert set(HOSTS) <= set(blocks), sorted(blocks)
    for host in HOSTS:
        assert len(blocks[host]) == 2, (host, blocks[host])
        command, env = host_config(host, *blocks[host][0])
        assert command[-1].endswith("mero_mcp.py") and env.get("CALIMERO_NODE_URL") == README_NODE, (host, env)
        several, several_env = host_config(host, *blocks[host][1])
        assert several == command and several_env.get("CALIMERO_NODES") == README_NODES, (host, several_env)
        assert "CALIMERO_NODE_URL" not in several_env, (host, several_env)


def test_every_readme_block_parses():
    """Every JSON and TOML block anywhere in the README, and every `claude mcp add` line, as hosts read them."""
    text = README.read_text(encoding="utf-8")
    for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if language == "json":
            json.loads(body)
        elif language == "toml":
            pytest.importorskip("tomllib").loads(body)
        elif language == "jsonl":
            [json.loads(line) for line in body.splitlines() if line.strip()]
        for line in body.splitlines():
            if line.startswith("claude mcp add"):
                claude_mcp_add(line.split("  #")[0])


@pytest.fixture(scope="module")
def sample_node(tmp_path_factory):
    session = HandSession(tmp_path_factory.mktemp("sample"))
    session.start_node(session.localise("python3 tests/node_double.py --sample --port 2530"))
    yield session
    session.stop_node()


@pytest.mark.parametrize("host", HOSTS)
def test_every_host_snippet_starts_the_server_as_pasted(host, sample_node):
    """The snippet with /path/to/mero-mcp this checkout, python3 this interpreter and the README's node the sample
    node: the server it starts reaches that node and lists the sample's tools."""
    language, text = host_blocks()[host][0]
    text = sample_node.localise(text).replace(README_NODE, sample_node.url)
    command, env = host_config(host, language, text)
    server = McpServer(dict(sample_node.env, **env), command=command)
    try:
        server.initialize()
        status = server.tool_json("node_status")
        assert status["url"] == sample_node.url and status["health"] == {"status": "alive"}, status
        tools = server.result("tools/list")["tools"]
    finally:
        server.close()
    server.assert_stdout_pure()
    names = [tool["name"] for tool in tools]
    assert "kv_store_get" in names and "counter_increment" in names, names
    if host == "Cursor":
        assert_cursor_count(env, tools)
        assert_cursor_more(sample_node, command, env)


@pytest.mark.parametrize("host", HOSTS)
def test_every_host_snippet_for_several_nodes_starts_the_server_over_two_nodes(host, sample_node):
    """The second block, the README's two nodes two doubles: the server is in multi-node mode over both, node1 the
    default, the sample's tools listed, and a call runs on node2 when asked."""
    from node_double import sample_double
    second = sample_double().start()
    try:
        language, text = host_blocks()[host][1]
        text = sample_node.localise(text).replace(README_NODE, sample_node.url).replace(SECOND_NODE, second.url)
        command, env = host_config(host, language, text)
        server = McpServer(dict(sample_node.env, **env), command=command)
        try:
            server.initialize()
            listed = json.loads(server.call_tool("list_nodes")["content"][0]["text"])
            rows = {row["name"]: (row["url"], row["default"], row["reachable"]) for row in listed["nodes"]}
            status = server.call_tool("node_status", {"node": "node2"})
            tools = server.result("tools/list")["tools"]
        finally:
            server.close()
    finally:
        second.stop()
    server.assert_stdout_pure()
    assert rows == {"node1": (sample_node.url, True, True), "node2": (second.url, False, True)}, rows
    assert json.loads(status["content"][0]["text"])["url"] == second.url, status
    names = [tool["name"] for tool in tools]
    assert "kv_store_get" in names and "wait_for_sync" in names, names
    if host == "Cursor":
        assert len(tools) <= CURSOR_LIMIT, "%d tools: past Cursor's 40" % len(tools)


def configuration_variables():
    """The variables the Configuration table lists, in its order."""
    body = section("## Configuration")
    table = body[:body.index("\n### ")]
    return re.findall(r"^\| `(CALIMERO_[A-Z0-9_]+)` \|", table, re.M)


def test_the_configuration_table_lists_every_variable_the_code_reads():
    listed = configuration_variables()
    assert len(listed) == len(set(listed)), "a variable listed twice: %s" % listed
    assert sorted(listed) == our_variables(), "README lists %s; the code reads %s" % (
        sorted(set(listed) - set(our_variables())), sorted(set(our_variables()) - set(listed)))


def test_the_flags_table_is_the_servers():
    body = section("## Configuration")
    flags = body[body.index("### Flags"):]
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| `(CALIMERO_[A-Z_]+)`", flags, re.M)
    usage = subprocess.run([sys.executable, str(ROOT / "mero_mcp.py"), "--help"], capture_output=True, text=True,
                           timeout=30).stdout
    served = re.findall(r"^  (--[a-z-]+)(?: [A-Z]+)? +(CALIMERO_[A-Z_]+) ", usage, re.M)
    assert rows and rows == served, (rows, served)


def assert_cursor_count(env, tools):
    """The README's Cursor claim is the live tool list's: the toolsets it names, the sample's app tools, and the
    whole list within 40."""
    said = CURSOR_COUNT.search(section(REGISTER))
    assert said, "the Cursor part states no count a test can check"
    toolsets, generated = said.group(1), int(said.group(2))
    live_fixed = sum(1 for tool in tools if "_meta" not in tool)
    assert env.get("CALIMERO_MCP_TOOLSETS") == toolsets, env
    assert generated == len(tools) - live_fixed, "README: %s; live: %d app tools" % (said.group(0), len(tools) - live_fixed)
    assert len(tools) <= CURSOR_LIMIT, "%d tools with %s, past Cursor's 40" % (len(tools), toolsets)


def assert_cursor_more(sample_node, command, env):
    """The toolsets the Cursor part names for the governance tools add up as it says, past Cursor's 40."""
    said = CURSOR_MORE.search(section(REGISTER))
    assert said, "the Cursor part says what the governance toolset adds up to"
    toolsets, generated = said.group(1), int(said.group(2))
    server = McpServer(dict(sample_node.env, **dict(env, CALIMERO_MCP_TOOLSETS=toolsets)), command=command)
    try:
        server.initialize()
        tools = server.result("tools/list")["tools"]
    finally:
        server.close()
    live_fixed = sum(1 for tool in tools if "_meta" not in tool)
    assert generated == len(tools) - live_fixed, said.group(0)
    assert len(tools) > CURSOR_LIMIT, "%d tools with %s: README says past 40" % (len(tools), toolsets)


# ── The rest a newcomer runs first ─────────────────────────────────────────────────────────────────────────

def test_the_first_commands_print_what_their_comments_say():
    text = README.read_text(encoding="utf-8")
    version = re.search(r"^python3 mero_mcp.py --version +# (.+)$", text, re.M)
    assert version, "the README shows --version and what it prints"
    out = subprocess.run([sys.executable, str(ROOT / "mero_mcp.py"), "--version"], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.strip() == version.group(1).strip()
    assert re.search(r"^python3 mero_mcp.py --help ", text, re.M)
    out = subprocess.run([sys.executable, str(ROOT / "mero_mcp.py"), "--help"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and all(option in out.stdout for option in ("--check", "--version", "--help"))


def test_the_changelog_opens_with_this_version():
    import mero_mcp
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    first = re.search(r"^## (\S+)", changelog, re.M)
    assert first and first.group(1) == mero_mcp.__version__, first


def test_make_run_writes_only_the_protocol_to_stdout(tmp_path):
    """`make run` is a server command: make's echo of the recipe went to stdout before the first JSON line."""
    import os
    import shutil
    if shutil.which("make") is None:
        pytest.skip("no make here")
    env = {key: value for key, value in minimal_env(tmp_path / "home").items()
           if key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}           # as a host starts it, not under make
    env["CALIMERO_NODE_URL"] = "http://127.0.0.1:9"
    ping = '{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    done = subprocess.run(["make", "run"], input=ping, capture_output=True, text=True, cwd=str(ROOT), env=env,
                          timeout=300)
    assert done.stdout == '{"jsonrpc":"2.0","id":1,"result":{}}\n', (done.stdout, done.stderr)
    assert os.path.isdir(str(ROOT / ".venv"))


def test_the_matcher_fails_where_it_should():
    assert_lines_match("a\nb\nc", "a\n…\nc")
    assert_lines_match("abc\nx", "ab…\nx")
    assert_lines_match("Tools: 50 (39 fixed)", "Tools: … (… fixed)")
    for printed, wanted in (("a\nb", "a"), ("a", "a\nb"), ("a\nb", "b"), ("abc", "abd…"), ("a (1 b)", "a (… c)"),
                            ("xa", "a…")):
        with pytest.raises(AssertionError):
            assert_lines_match(printed, wanted)


# ── Without a package index: the README's offline commands, with pip pointed at a closed port ────────────────

OFFLINE = "### Without a package index"


def offline_commands():
    """The command lines of the offline block (the apt line left out: it installs what this Python has)."""
    body = re.split(r"^#{2,3} ", section(OFFLINE)[len(OFFLINE):], flags=re.M)[0]      # to the next heading
    blocks = re.findall(r"^```sh\n(.*?)^```", body, re.S | re.M)
    assert len(blocks) == 1, blocks
    lines = [line.split("  #")[0].strip() for line in blocks[0].splitlines()]
    assert lines[0].startswith("sudo apt install python3-requests python3-jsonschema python3-pytest"), lines
    return lines[1:]


def test_the_offline_block_names_the_demo_and_the_suite():
    assert offline_commands() == ["python3 tests/demo.py", "python3 -m pytest -q"]


def test_the_offline_demo_runs_as_written(tmp_path):
    from test_demo import DEMO_HEADINGS, no_index_env
    demo = offline_commands()[0]
    done = subprocess.run(shlex.split(HandSession(tmp_path).localise(demo)), capture_output=True, text=True,
                          cwd=str(ROOT), env=no_index_env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(heading in done.stdout for heading in DEMO_HEADINGS), done.stdout


def test_the_offline_suite_command_collects_every_test(tmp_path):
    """The suite itself is this run: the README's command, with --collect-only, must import every test module on
    this interpreter's own packages with no index (nothing it needs is fetched at collection)."""
    from test_demo import no_index_env
    suite = HandSession(tmp_path).localise(offline_commands()[1])
    done = subprocess.run(shlex.split(suite) + ["--collect-only", "-p", "no:cacheprovider"], capture_output=True,
                          text=True, cwd=str(ROOT), env=no_index_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    collected = re.fullmatch(r"(\d+) tests collected in [\d.]+s", done.stdout.splitlines()[-1])   # no ", N errors"
    assert collected and int(collected.group(1)) > 1000, done.stdout[-500:]


# ── What the agent sees: the toolsets as the README lists them, against the fixed tools' snapshot ──────────

AGENT_SEES = "## What the agent sees"
TOOLSET_BULLET = re.compile(r"^- \*\*(\w+)\*\* \(([^)]*?)(\d+) tools\):(.*?)(?=^- \*\*|\Z)", re.S | re.M)


def toolset_parts():
    """{bullet title: the tools it lists}: core's own, each other toolset's beyond core, the application tools."""
    toolsets = fixed_snapshot()["toolsets"]
    parts = {"Application": set(APP_TOOLS), "Core": set(toolsets["core"]) - APP_TOOLS}
    parts.update({name.capitalize(): set(names) - set(toolsets["core"]) for name, names in toolsets.items()
                  if name != "core"})
    return parts


def test_each_toolset_is_listed_whole_with_its_count():
    """The one place the README counts fixed tools: each toolset's bullet names all its tools, and no other."""
    tools, parts = set(fixed_names()), toolset_parts()
    listed = {}
    for title, _, count, body in TOOLSET_BULLET.findall(section(AGENT_SEES)):
        names = set(re.findall(r"`([a-z]+(?:_[a-z]+)*)`", body))
        unknown = {n for n in names if "_" in n and n not in tools}
        assert not unknown, "README's %s names tools there are not: %s" % (title, sorted(unknown))
        listed[title] = names & tools
        assert int(count) == len(listed[title]), "README's %s says %s tools, lists %d" % (title, count,
                                                                                         len(listed[title]))
    assert listed == parts, "README lists %s; tools/list carries %s" % (listed, parts)


def test_read_only_mode_offers_what_the_readme_says():
    offered = next(line for line in section("### Read-only mode").split("\n- ") if line.startswith("Offered:"))
    offered = offered.split(", and the generated tools")[0]
    named = re.findall(r"`([a-z_]+)(…)?`", offered)
    said = {name for name in fixed_names() if any(name == n or (more and name.startswith(n)) for n, more in named)}
    assert said == set(fixed_names(read_only=True)), said ^ set(fixed_names(read_only=True))
