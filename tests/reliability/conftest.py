"""The reliability campaign (issue 7): its summary table, and the secrets search
kept for last."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import campaign


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The secrets search runs after the rest of the campaign, whatever is selected."""
    items.sort(key=lambda item: item.nodeid.startswith("tests/reliability/test_secrets.py"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not campaign.FIGURES:
        return
    form = "soak (make soak)" if campaign.SOAK else "short form (make test)"
    terminalreporter.write_sep("=", f"reliability: {form}")
    terminalreporter.write_line(campaign.table())
    report = os.environ.get("RIFT_RELIABILITY_REPORT")
    if report:
        campaign.write_report(Path(report))
