"""The chaos suite: faults injected while the daemon runs, then the independent checker.

Every scenario ends the same way: a daemon run with ``--until-caught-up`` commits everything, then
:func:`tests.support.chaos.check` reads the topic with its own consumer and both tables with deltalake
(:mod:`kafka2delta.verify`) and asserts lost 0, duplicated 0, no offset in both tables, and the
dead-letter table holding exactly the poison messages (every scenario mixes them in).

Short forms run in the default suite; ``K2D_CHAOS=full`` (``make chaos``) runs the full forms with
larger counts. The tools the scenarios share are in ``tests/support/chaos.py``; this file holds the
``chaos_result`` fixture: each test writes its figures to ``tests/chaos/results/<form>/<test>.json``, and
``python -m tests.chaos.report`` turns the full run's files into the matrix of ``docs/RELIABILITY.md``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import FORM, ChaosResult

RESULTS = Path(__file__).resolve().parent / "results"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_OUTCOME] = report.outcome
    return report


_OUTCOME = pytest.StashKey[str]()


@pytest.fixture
def chaos_result(request: pytest.FixtureRequest) -> Iterator[ChaosResult]:
    result = ChaosResult()
    started = time.monotonic()
    yield result
    node = request.node
    path = Path(str(node.path)).relative_to(Path(__file__).resolve().parents[2])
    data: dict[str, Any] = {
        "test": node.nodeid,
        "scenario": result.scenario or node.name,
        "form": FORM,
        "outcome": node.stash.get(_OUTCOME, "error"),
        "duration_s": round(time.monotonic() - started, 1),
        "faults": result.faults,
        "notes": result.notes,
        "rerun": f"K2D_CHAOS={FORM} .venv/bin/python -m pytest '{path}::{node.name}'",
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if result.verdict is not None:
        data.update(result.verdict.figures)
    data.update(result.figures)
    out = RESULTS / FORM
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', node.name)}.json").write_text(json.dumps(data, indent=2) + "\n")
