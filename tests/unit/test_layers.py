"""The package's shape, kept by machine: the layers and the absence of import
cycles (import-linter, with the contracts in pyproject.toml), a tree that shows
them (few modules at the top, a layers contract for every package, the
contributing page's map generated from the contracts), no private import in the
demos, the docs' examples or the extensions, and modules and functions short
enough to read."""

import ast
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "synkhronos"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60  # code lines, docstring excluded


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter")
    # In a process of its own: import-linter configures logging, which would change
    # how Synkhronos's status lines reach the tests that follow.
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename=sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "pyproject.toml")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, "an import breaks the layers or makes a cycle:\n" + proc.stdout + proc.stderr


_PRIVATE = re.compile(r"(from\s+synkhronos(\.\w+)*\s+import\s+_(?!_)\w+"
                      r"|synkhronos(\.[A-Za-z]\w*)*\._(?!_)\w+|synk\._(?!_)\w+)")


def _private_imports(path):
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if _PRIVATE.search(line) and "automodule" not in line:
            found.append("%s:%d: %s" % (path.relative_to(ROOT), n, line.strip()))
    return found


def test_demos_docs_and_extensions_use_public_names_only():
    paths = list((ROOT / "demos").rglob("*.py")) + list((PACKAGE / "extensions").rglob("*.py"))
    paths += [p for p in (ROOT / "docs").rglob("*")
              if p.suffix in (".md", ".rst", ".py") and p.name != "conf.py"]
    found = [hit for p in paths for hit in _private_imports(p)]
    # Extensions may import their own private kernels (synkhronos.extensions._nnet_*).
    found = [f for f in found if "extensions._nnet_" not in f]
    assert not found, "private names outside the package's core:\n" + "\n".join(found)


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _code_lines(fn):
    body = fn.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str):
        body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1


def test_modules_and_functions_stay_short():
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append("%s (%d lines)" % (path.relative_to(ROOT), len(text.splitlines())))
        for fn in _functions(ast.parse(text)):
            if _code_lines(fn) > MAX_FUNCTION_LINES:
                long_functions.append("%s:%d %s (%d lines)" % (path.relative_to(ROOT), fn.lineno, fn.name,
                                                               _code_lines(fn)))
    too_long = long_modules + long_functions
    assert not too_long, "split these:\n" + "\n".join(too_long)


MAX_TOP_MODULES = 14  # the public modules and the few that implement them


def _layer_map_tool():
    spec = importlib.util.spec_from_file_location("layer_map", ROOT / "tools" / "layer_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_shows_the_layers():
    """Few modules directly in the package, and every package in it (each
    subpackage, and the package itself) has an exhaustive layers contract."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, "modules directly in synkhronos/: %s" % top
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    contracts = _layer_map_tool().contracts()
    covered = {c["containers"][0] for c in contracts if c.get("exhaustive")}
    assert packages <= covered, "packages without an exhaustive layers contract: %s" % (
        sorted(packages - covered))


def test_the_contributing_map_is_the_one_the_contracts_give():
    """docs/contributing.md's map is generated from pyproject.toml's contracts
    and the modules' docstrings: after changing either, run
    ``python tools/layer_map.py --write``."""
    tool = _layer_map_tool()
    page = tool.PAGE.read_text()
    assert tool.page_with_map(page) == page, "the map is stale: run python tools/layer_map.py --write"
