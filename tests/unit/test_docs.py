"""The README is the front door and docs/ holds the rest (DESIGN.md convention 25):
every setting and every tool is documented on its page, the README stays short,
and every link between them leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from rift.config import Settings
from rift.contract.tools import CONTRACTS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(page: Path) -> str:
    """A page without its fenced code blocks (a `# comment` there is no heading)."""
    return _FENCE.sub("", page.read_text())


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, code marks and punctuation gone,
    spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose(page).splitlines():
        heading = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if heading:
            anchor = _anchor(heading.group(1))
            name, n = anchor, 0
            while name in found:  # a repeated heading gets -1, -2, …
                n += 1
                name = f"{anchor}-{n}"
            found.add(name)
    return found


def test_every_setting_is_described_and_documented_in_the_operations_page() -> None:
    page = (DOCS / "operations.md").read_text()
    table = page[page.index("## Configuration"):]
    for name, field in Settings.model_fields.items():
        assert field.description, name
        variable = f"RIFT_{name.upper()}"
        assert re.search(rf"^\| `{variable}` \|", table, re.M), \
            f"{variable} has no row in docs/operations.md's configuration table"


def test_every_tool_is_documented_in_the_agents_page() -> None:
    page = (DOCS / "agents.md").read_text()
    for name in (contract.name for contract in CONTRACTS):
        assert f"`{name}`" in page, f"{name} is not in docs/agents.md"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 350, f"README.md has {lines} lines; move the detail into docs/"


def test_the_readme_links_to_every_docs_page() -> None:
    targets = {target.split("#")[0] for target in _LINK.findall(_prose(README))}
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in targets, f"README.md does not link to docs/{page.name}"


def test_every_link_between_the_readme_and_the_docs_resolves() -> None:
    for page in PAGES:
        for target in _LINK.findall(_prose(page)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            assert linked.is_file(), f"{where}: no such file"
            if anchor:
                assert linked.suffix == ".md", f"{where}: an anchor into a file that is not a page"
                assert anchor in _anchors(linked), f"{where}: no heading #{anchor}"
