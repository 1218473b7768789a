"""The README's "Try it by hand" section, run as written: every command and host snippet in it, against the node
double on a free port, with the output the README shows.

Substitutions, and only these: `python3` becomes this interpreter (it has requests and jsonschema), the README's
port 2530 a free one, `/path/to/mero-mcp` this checkout. A command block followed by a `text` block must print
those lines: a line `…` stands for any lines, a line ending in `…` for any line that starts so.
"""
from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys

import pytest

from mcp_client import ROOT, McpServer, minimal_env

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
    """`expected` in order; a line `…` skips any number of lines, a line ending in `…` matches by prefix."""
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
            matched = line.startswith(wanted[:-1]) if wanted.endswith(ELLIPSIS) else line == wanted
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
    """(server command, env) of a `claude mcp add [--env K=V]… name -- command args…` line."""
    words = shlex.split(command)
    assert words[:3] == ["claude", "mcp", "add"] and "--" in words, command
    options, server = words[3:words.index("--")], words[words.index("--") + 1:]
    env = {}
    for flag, value in zip(options, options[1:]):
        if flag in ("--env", "-e"):
            key, _, setting = value.partition("=")
            env[key] = setting
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


def test_the_counter_counts_as_the_section_says(start_server, server_env):
    """Step 3's last sentence: a context for the counter, then increment {by: 5} answers the new total."""
    server = start_server(server_env)
    namespace = server.tool_json("create_namespace", {"application": "counter"})["namespaceId"]
    context = server.tool_json("create_context", {"application": "counter", "namespace": namespace})["contextId"]
    assert server.tool_json("counter_increment", {"context": context, "by": 5}) == 5
    assert server.tool_json("counter_increment", {"context": context, "by": 5}) == 10
    assert server.tool_json("counter_value", {"context": context}) == 10


def test_the_matcher_fails_where_it_should():
    assert_lines_match("a\nb\nc", "a\n…\nc")
    assert_lines_match("abc\nx", "ab…\nx")
    for printed, wanted in (("a\nb", "a"), ("a", "a\nb"), ("a\nb", "b"), ("abc", "abd…")):
        with pytest.raises(AssertionError):
            assert_lines_match(printed, wanted)
