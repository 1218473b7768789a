"""The comparison server for the cold-start benchmark: the official MCP Python SDK over stdio with N trivial tools.

Usage: python3 bench/sdk_server.py N

mcp 2.x renamed FastMCP to `mcp.server.mcpserver.MCPServer`; the API is the same decorator-free `add_tool`.
Each tool gets typed parameters so the SDK builds an input schema for it, as it would for a real tool.
"""
import sys

from mcp.server.mcpserver import MCPServer


def make_tool(index):
    """A distinct function per tool: the SDK inspects each signature and builds its argument model."""
    def tool(key: str, count: int = 1, verbose: bool = False) -> str:
        return "%s:%d:%s" % (key, count, verbose)
    tool.__name__ = "tool_%03d" % index
    tool.__doc__ = "Trivial tool number %d: echoes its arguments." % index
    return tool


def build_server(tool_count):
    server = MCPServer(name="sdk-bench", instructions="Benchmark twin of mero-mcp.")
    for index in range(tool_count):
        server.add_tool(make_tool(index))
    return server


if __name__ == "__main__":
    build_server(int(sys.argv[1]) if len(sys.argv) > 1 else 30).run("stdio")
