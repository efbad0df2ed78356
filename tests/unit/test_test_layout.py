"""The shape of the tests (DESIGN.md convention 18): helpers the tests share live
in tests/support/, and no module of the suite imports another test module."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUPPORT = "tests.support"


def _module_name(path: Path) -> str:
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) of every module an import statement names, relative ones
    resolved; `from a import b` names both `a` and `a.b` (b may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[:len(parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _is_test_module(name: str) -> bool:
    """A module of the suite other than tests/support/ and the tests package itself."""
    parts = name.split(".")
    return parts[0] == "tests" and len(parts) > 1 and parts[1] != "support"


def _offences(source: str, module: str, is_package: bool = False) -> list[str]:
    """What `source` (the module `module`) imports that it must not, one line each."""
    bad = sorted({(line, name) for line, name in _imported(ast.parse(source), module, is_package)
                  if _is_test_module(name)})
    # `from tests.e2e.conftest import Server` names tests.e2e.conftest.Server too:
    # only the module is told.
    return [f"line {line}: {name}" for line, name in bad
            if not any(at == line and name.startswith(other + ".") for at, other in bad)]


def test_no_module_of_the_suite_imports_a_test_module() -> None:
    """Shared helpers are imported from tests.support only (fixtures come by name);
    tests/support/ itself imports no test module either."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        module = _module_name(path)
        for offence in _offences(path.read_text(), module, path.name == "__init__.py"):
            found.append(f"{path.relative_to(TESTS.parent)}: {offence}")
    assert not found, ("import shared helpers from tests/support/, never from a test "
                       "module:\n" + "\n".join(found))


def test_the_check_sees_every_way_of_importing_a_test_module() -> None:
    here = "tests.e2e.test_x"
    assert _offences("from tests.e2e.conftest import Server", here) == [
        "line 1: tests.e2e.conftest"]
    assert _offences("import tests.e2e.test_mcp", here) == ["line 1: tests.e2e.test_mcp"]
    assert _offences("from tests.reliability import campaign", here) == [
        "line 1: tests.reliability"]
    assert _offences("from tests import cache", here) == ["line 1: tests.cache"]
    assert _offences("from .conftest import free_port", here) == ["line 1: tests.e2e.conftest"]
    assert _offences("from ..unit import helpers", here) == ["line 1: tests.unit"]
    assert _offences("def f():\n    from tests.browser.conftest import Agent", here) == [
        "line 2: tests.browser.conftest"]
    assert _offences("from tests.conftest import ALICE", here) == ["line 1: tests.conftest"]
    for fine in ("from tests.support.servers import Server", "from tests.support import campaign",
                 "from tests import support", "from . import campaign",
                 "import pytest"):
        module = "tests.support.x" if fine == "from . import campaign" else here
        assert _offences(fine, module) == [], fine
