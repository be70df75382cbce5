"""What a command did, printed as one line (or JSON with ``--json``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


@dataclass
class Report:
    """The outcome of one command on one table."""

    command: str
    table: str
    status: str = "ok"
    """``ok``, ``skipped`` (the coordinator gave no turn: not a failure) or ``failed``."""
    reason: str = ""
    files_before: int | None = None
    files_after: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    rows_before: int | None = None
    rows_after: int | None = None
    rows_changed: int = 0
    """Rows updated plus rows deleted by the command's own commits."""
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        head = f"{self.command} {self.table}: {self.status}"
        if self.reason:
            head += f" ({self.reason})"
        parts = [f"{head} in {self.duration_s:.1f} s"]
        if self.files_before is not None or self.files_after is not None:
            parts.append(f"files {self.files_before} -> {self.files_after}")
        if self.bytes_before is not None or self.bytes_after is not None:
            parts.append(f"bytes {_size(self.bytes_before)} -> {_size(self.bytes_after)}")
        if self.rows_before is not None or self.rows_after is not None:
            parts.append(f"rows {self.rows_before} -> {self.rows_after}")
        parts.append(f"rows changed {self.rows_changed}")
        text = ", ".join(parts)
        if self.details:
            text += "; " + " ".join(f"{k}={v}" for k, v in self.details.items())
        return text

    def json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)
