"""E2B's own SDK test suite, run against a `rift serve` (SPEC §16, issue #28).

The suite is E2B's (MIT, `tests/e2b_upstream/LICENSE`): the Python SDK's sync tests
of sandboxes, commands, files and PTYs, copied unchanged from e2b-dev/E2B at
`COMMIT` (only files are vendored here: CI has no way to the network but the
package index). It runs in a pytest of its own (its own `pytest.ini`, with
pytest-asyncio as it expects), with only the two settings of SPEC §16 in its
environment, and reports by JUnit XML.

Every test either passes or is listed in docs/e2b.md's table "E2B's own tests that
Rift answers otherwise" with why; `listed()` reads that table, so the page and
the test cannot drift apart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.support.tls import PLUGIN, PLUGIN_DIR, resolving_env

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests" / "e2b_upstream"
COMMIT = "b8029973aa7da5f741f7bb1a9f833b38a0885438"  # e2b-dev/E2B, 2026-08-21
PAGE = ROOT / "docs" / "e2b.md"
TABLE_HEADING = "## E2B's own tests that Rift answers otherwise"
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.+?)\s*\|\s*$")


def listed() -> dict[str, str]:
    """The tests docs/e2b.md lists as answered otherwise: test id → why."""
    text = PAGE.read_text()
    start = text.find(TABLE_HEADING)
    if start < 0:  # no table: every failing test is then reported as unlisted
        return {}
    section = text[start + len(TABLE_HEADING):].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit report: `passed`, `failed` or `skipped`, by
    its id relative to the suite (`sync/sandbox_sync/test_kill.py::test_kill`)."""
    found: dict[str, str] = {}
    # The report is the one our own pytest child just wrote, not input from elsewhere.
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314
        module = case.get("classname", "").replace(".", "/")
        test_id = f"{module}.py::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            found[test_id] = "failed"
        elif case.find("skipped") is not None:
            found[test_id] = "skipped"
        else:
            found[test_id] = "passed"
    return found


def run_suite(url: str, token: str, junit: Path, *selection: str,
              tls: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the vendored suite (or `selection` of it, paths relative to the suite)
    against `rift serve` at `url` as the token's user. `tls` (the CA's file, the
    preview domain) when `rift serve` answers TLS itself: the suite trusts that CA,
    and names under the domain (the SDK's `get_host`) reach the server's port."""
    env = {**os.environ, "E2B_API_URL": f"{url}/e2b", "E2B_SANDBOX_URL": f"{url}/e2b",
           "E2B_API_KEY": token}
    env.pop("E2B_DOMAIN", None)
    plugins: list[str] = []
    if tls is not None:
        env.update(resolving_env(tls[1], int(url.rsplit(":", 1)[1]), tls[0]))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN_DIR),
                                                          env.get("PYTHONPATH")]))
        plugins = ["-p", PLUGIN]
    command = [sys.executable, "-m", "pytest", "-c", str(SUITE / "pytest.ini"),
               "--rootdir", str(SUITE), "-p", "no:cacheprovider", "-q", *plugins,
               f"--junitxml={junit}", "-o", "junit_family=xunit1",
               *(selection or ("sync",))]
    return subprocess.run(command, cwd=SUITE, env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
