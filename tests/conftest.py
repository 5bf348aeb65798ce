"""Fixtures shared by every test package."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from kvcs.transport import DevCertificate, ensure_dev_certificate

# No per-example deadline: Hypothesis's default (200 ms) measures the machine's load, not
# the code (a wire round trip went past it once beside the other worker, 2 cores)
settings.register_profile("kvcs", deadline=None)
settings.load_profile("kvcs")

FIRST = ("tests/integrations/test_vllm.py",)
"""Modules a pytest-xdist worker starts first (make test): the longest one, so that it does
not start last and leave the other worker idle (two vLLM engines, 2-5 minutes)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker; a serial run keeps its order
        items.sort(key=lambda item: not item.nodeid.startswith(FIRST))


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> DevCertificate:
    """One throwaway dev certificate (chain + key) for the whole run."""
    return ensure_dev_certificate(Path(tmp_path_factory.mktemp("certs")))


# The fault scenarios' table (tests/faults/report.py) is printed here, where the run ends:
# under pytest-xdist (make test) only the controller prints, and it never loads
# tests/faults/conftest.py, so its rows come from the workers' reports.


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if getattr(report, "node", None) is None or not report.user_properties:
        return  # not a controller's copy of a worker's report, or no row on it
    from faults.report import RECORDS, ROW_PROPERTY, ScenarioRecord

    RECORDS.extend(ScenarioRecord(**row) for key, row in report.user_properties
                   if key == ROW_PROPERTY)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    report = sys.modules.get("faults.report")
    if report is None or not report.RECORDS or hasattr(terminalreporter.config, "workerinput"):
        return
    terminalreporter.write_sep("=", "fault scenarios")
    terminalreporter.write_line(report.format_table(report.RECORDS))
    report.write_json(report.RECORDS)
