"""The house in rooms: our modules, each one job, import only downward (issue 40).

mero_runtime.OUR_MODULES lists them from the entry down; a module may import only modules after it in that list,
so no cycle can form and nothing imports the entry. Read from the source (every import statement, and the lazy
loads by name: `heavy("node")`, `own_module("abi")`, `__import__("node")`), not by importing.
"""
import ast
import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAZY_LOADS = {"heavy", "own_module", "__import__"}
LIMIT, ENTRY_LIMIT = 2500, 1500


def our_modules():
    text = (ROOT / "mero_runtime.py").read_text(encoding="utf-8")
    found = re.search(r"^OUR_MODULES = \(([^)]*)\)", text, re.M | re.S)
    return [name.strip().strip('"') for name in found.group(1).split(",") if name.strip()]


def imported_by(name):
    """Every module of ours `name` imports, with the line it does so on."""
    ours = set(our_modules())
    tree = ast.parse((ROOT / (name + ".py")).read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in LAZY_LOADS and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append((node.args[0].value, node.lineno))
    return [(module, line) for module, line in found if module in ours]


def test_every_module_imports_only_modules_below_it():
    order = our_modules()
    upward = ["%s.py:%d imports %s" % (name, line, module)
              for rank, name in enumerate(order) for module, line in imported_by(name)
              if order.index(module) <= rank]
    assert upward == [], upward


def test_the_entry_is_imported_by_none_and_each_lower_module_by_some():
    order = our_modules()
    importers = {name: {importer for importer in order for module, _ in imported_by(importer) if module == name}
                 for name in order}
    assert order[0] == "mero_mcp" and importers["mero_mcp"] == set()
    assert [name for name in order[1:] if not importers[name]] == []      # no module left over


def test_the_module_list_is_the_files_and_what_pip_installs():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg", encoding="utf-8")
    assert setup["options"]["py_modules"].split() == our_modules()
    on_disk = {path.stem for path in ROOT.glob("*.py") if path.name != "setup.py"}
    assert on_disk == set(our_modules())


def test_no_module_is_over_its_size():
    sizes = {name: len((ROOT / (name + ".py")).read_text(encoding="utf-8").splitlines()) for name in our_modules()}
    assert sizes["mero_mcp"] <= ENTRY_LIMIT, sizes
    assert {name: size for name, size in sizes.items() if size > LIMIT} == {}, sizes


def test_developers_md_stays_a_map():
    """Issue 40: a map, not a manual: at most 16,000 characters, naming every module."""
    text = (ROOT / "DEVELOPERS.md").read_text(encoding="utf-8")
    assert len(text) <= 16000, len(text)
    assert [name for name in our_modules() if "`%s.py`" % name not in text] == []
