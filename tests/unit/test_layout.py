"""The shape of the code: dependencies point inward (that every setting is documented:
tests/unit/test_docs.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# package → third-party or sibling modules it must never import
FORBIDDEN = {
    "rift/domain": ("sqlalchemy", "libvirt", "paramiko", "fastapi", "mcp", "argon2",
                    "pydantic", "rift.services", "rift.store", "rift.api", "hypervisor"),
    # The engine reaches the store and the guests through its ports only; the
    # adapters implement them without the engine importing them (the values both
    # use are rift.domain's), and no door is the engine's.
    "rift/services": ("sqlalchemy", "libvirt", "paramiko", "fastapi", "mcp", "rift.api",
                      "rift.store", "rift.guest", "rift.proxy", "rift.e2b", "web"),
    "hypervisor": ("rift", "sqlalchemy", "paramiko", "fastapi", "mcp"),
    "rift/store": ("libvirt", "paramiko", "fastapi", "mcp", "rift.api", "rift.services"),
    # The doors do not install one another: rift/app.py, above them all, does.
    "rift/api": ("web", "rift.e2b", "rift.app"),
    "rift/e2b": ("web", "rift.proxy", "rift.app"),
}
# The egress proxy is a door of its own: it asks the engine which rules a connection
# is under, never the store, and knows no other door (nor any library: sockets only).
PROXY_MAY_IMPORT = ("rift.proxy", "rift.services", "rift.domain")
ONLY_IN = {
    "libvirt": ("hypervisor/libvirt.py",),
    "sqlalchemy": ("rift/store/",),
    "paramiko": ("rift/guest/",),
    "fastapi": ("rift/api/", "web/", "rift/e2b/", "rift/app.py"),
    "mcp": ("rift/api/",),
}
# What kind of guest a host or an image has is asked in one place: the engine's
# kinds of guest (rift/services/lifecycle/guest_kinds/) know the image formats and the
# test driver; the rest of the engine only calls a kind's methods.
GUEST_KINDS = "rift/services/lifecycle/guest_kinds/"
IMAGE_FORMATS = {
    "hypervisor.image_files": (GUEST_KINDS,),
    "hypervisor.kernel_boot": (GUEST_KINDS,),
    "hypervisor.disks": (GUEST_KINDS,),
    # the operator's image commands: removing one, making one from a snapshot
    "hypervisor.qcow2": (GUEST_KINDS, "rift/services/operator/images.py",
                         "rift/services/operator/images.py"),
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _sources() -> list[Path]:
    return [p for d in ("rift", "hypervisor", "web") for p in (ROOT / d).rglob("*.py")
            if "alembic" not in p.parts]


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_packages_import_only_inward() -> None:
    for package, banned in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for name in _imports(path):
                assert not any(_matches(name, b) for b in banned), f"{path}: imports {name}"


def test_the_egress_proxy_imports_the_engine_and_the_standard_library_only() -> None:
    for path in (ROOT / "rift" / "proxy").rglob("*.py"):
        for name in _imports(path):
            assert name.split(".")[0] in sys.stdlib_module_names or any(
                _matches(name, allowed) for allowed in PROXY_MAY_IMPORT), \
                f"{path}: imports {name}"


def test_web_imports_nothing_of_rift_api_and_only_the_app_installs_the_page() -> None:
    # One way: rift/app.py installs the page (web.router.install, handing it its
    # state); web types what it needs of the app itself (web/state.py).
    for path in (ROOT / "web").rglob("*.py"):
        for name in _imports(path):
            assert not _matches(name, "rift.api"), f"{path}: imports {name}"
    for path in (ROOT / "rift").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        for name in _imports(path):
            assert not _matches(name, "web") or rel == "rift/app.py", f"{rel} imports {name}"


def test_each_library_is_imported_only_by_its_adapter() -> None:
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for name in _imports(path):
            for lib, allowed in ONLY_IN.items():
                if _matches(name, lib):
                    assert rel.startswith(allowed), f"{rel} imports {name}"


def test_only_the_guest_kinds_ask_what_a_host_or_an_image_is() -> None:
    for path in (ROOT / "rift" / "services").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        for name in _imports(path):
            for module, allowed in IMAGE_FORMATS.items():
                if _matches(name, module):
                    assert rel.startswith(allowed), f"{rel} imports {name}"
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(GUEST_KINDS):
            assert "is_test_host" not in path.read_text(), f"{rel} asks whether a host is " \
                "the test driver; a kind of guest (its guest_kinds) answers instead"


LONG = 300  # lines: about the most one module holds (DESIGN.md, convention 12)


def _long_modules_explained() -> set[str]:
    """The modules docs/architecture.md's "Modules over 300 lines" table names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Modules over 300 lines\n", 1)[1].split("\n## ", 1)[0]
    return {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}


def test_every_module_over_300_lines_says_why_in_the_architecture_page() -> None:
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
               for d in ("rift", "hypervisor", "web") for path in (ROOT / d).rglob("*.py")}
    explained = _long_modules_explained()
    long = {rel for rel, lines in lengths.items() if lines > LONG}
    assert long - explained == set(), "over 300 lines with no reason in docs/architecture.md"
    assert {rel for rel in explained if lengths.get(rel, 0) <= LONG} == set(), \
        "named in docs/architecture.md's table but gone or no longer over 300 lines"
