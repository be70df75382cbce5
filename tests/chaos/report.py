"""Write the fault matrix of docs/RELIABILITY.md from the chaos suite's result files.

    python -m tests.chaos.report [--form full|short] [--doc docs/RELIABILITY.md]

Each chaos test writes ``tests/chaos/results/<form>/<test>.json`` (see ``tests/chaos/conftest.py``);
this replaces the text between the ``<!-- matrix:start -->`` and ``<!-- matrix:end -->`` markers of the
document with one table row per result, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"
ORDER = [
    "test_kill_points",
    "test_random_kills",
    "test_fan_out",
    "test_replication",
    "test_apply_changes",
    "test_broker",
    "test_storage",
    "test_concurrent_writer",
    "test_topic_changes",
]


def _order(result: dict[str, Any]) -> tuple[int, str]:
    module = result["test"].split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return (ORDER.index(module) if module in ORDER else len(ORDER), result["test"])


def _faults(faults: dict[str, int]) -> str:
    return ", ".join(f"{name} ×{count}" if count != 1 else name for name, count in faults.items()) or "—"


def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "—"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | messages | poison → dead letters | faults injected | lost | duplicated | in both tables "
        "| duration | outcome | notes | rerun |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in sorted(results, key=_order):
        poison = f"{_n(r.get('poison'))} → {_n(r.get('dead_letters'))}" if "poison" in r else "—"
        lines.append(
            f"| {r['scenario']} | {_n(r.get('messages'))} | {poison} | {_faults(r['faults'])} | {_n(r.get('lost'))} "
            f"| {_n(r.get('duplicated'))} | {_n(r.get('in_both'))} | {r['duration_s']:.0f} s | {r['outcome']} "
            f"| {r.get('notes', '').strip().rstrip(';') or '—'} | `{r['rerun']}` |"
        )
    total = sum(r["duration_s"] for r in results)
    messages = sum(r.get("messages", 0) for r in results)
    faults = sum(sum(r["faults"].values()) for r in results)
    lost = sum(r.get("lost", 0) for r in results)
    duplicated = sum(r.get("duplicated", 0) for r in results)
    passed = sum(r["outcome"] == "passed" for r in results)
    finished = max((r.get("finished_at", "") for r in results), default="")
    lines.append("")
    lines.append(
        f"{len(results)} scenarios ({passed} passed), {messages:,} messages, {faults:,} faults injected: "
        f"lost {lost}, duplicated {duplicated}; {total / 60:.1f} min of test time; last result written {finished}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--form", default="full", choices=["full", "short"])
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "RELIABILITY.md")
    args = parser.parse_args(argv)
    files = sorted((RESULTS / args.form).glob("*.json"))
    if not files:
        print(f"no results in {RESULTS / args.form}: run the chaos suite first (make chaos)", file=sys.stderr)
        return 1
    matrix = table([json.loads(f.read_text()) for f in files])
    print(matrix)
    doc = args.doc.read_text()
    if START not in doc or END not in doc:
        print(f"{args.doc} lacks the {START} … {END} markers", file=sys.stderr)
        return 1
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    args.doc.write_text(f"{head}{START}\n{matrix}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
