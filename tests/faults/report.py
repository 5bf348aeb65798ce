"""The fault scenarios' table: one row per scenario test (``make faults`` prints it).

A test takes the ``scenario`` fixture (a :class:`ScenarioRecord`) and fills it from the
retrieval it judged (:meth:`ScenarioRecord.record`); the conftest hooks add the test's
outcome and print every row at the end of the run. ``KVCS_FAULTS_JSON=path`` also writes
the rows as JSON (the figures of docs/reliability.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from .workload import Result, blocks_of


@dataclass
class ScenarioRecord:
    """One scenario's row."""

    name: str
    outcome: str = "not run"
    """The test's outcome: passed, failed, xfailed, ..."""
    result: str = ""
    """What the consumer got: ``complete``, or what it reported for recompute."""
    seconds: float | None = None
    """Time the consumer took to answer (every layer, or RecomputeRequired)."""
    bytes_lost: int = 0
    wrong_tensors: int = 0
    goodput_ratio: float | None = None
    """Goodput under impairment / goodput of the unimpaired run of the same test."""
    notes: list[str] = field(default_factory=list)

    def record(self, result: Result, baseline: Result | None = None) -> None:
        """Take a judged retrieval (``baseline``: the unimpaired run, for the ratio).
        Several calls add up (bytes lost, wrong tensors) and keep the last time."""
        self.seconds = result.seconds
        self.bytes_lost += result.bytes_lost
        self.wrong_tensors += result.wrong_tensors
        if result.error is None:
            self.result = "complete"
        else:
            self.result = (f"recompute {blocks_of(result.missing)} blocks of "
                           f"{len(result.missing)} layers")
        if baseline is not None and baseline.goodput > 0:
            self.goodput_ratio = result.goodput / baseline.goodput

    def note(self, text: str) -> None:
        self.notes.append(text)


RECORDS: list[ScenarioRecord] = []
ROW_PROPERTY = "fault scenario"
"""The user property of a test report carrying its row (from pytest-xdist workers)."""


def format_table(records: list[ScenarioRecord]) -> str:
    """The rows as a fixed-width table."""
    head = ("scenario", "outcome", "consumer got", "time s", "bytes lost", "wrong tensors",
            "goodput ratio")
    rows = [head]
    for r in records:
        rows.append((
            r.name, r.outcome, r.result or "-",
            "-" if r.seconds is None else f"{r.seconds:.2f}",
            str(r.bytes_lost), str(r.wrong_tensors),
            "-" if r.goodput_ratio is None else f"{r.goodput_ratio:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(records: list[ScenarioRecord]) -> None:
    path = os.environ.get("KVCS_FAULTS_JSON")
    if path:
        with open(path, "w") as f:
            json.dump([asdict(r) for r in records], f, indent=1)
