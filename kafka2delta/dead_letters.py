"""Dead letters: messages that failed a stage. Never dropped silently, never blocking the stream.

This issue records them in the log (one line each, ``topic[partition]@offset``, stage and reason)
and in the ``kafka2delta_messages_dead_lettered_total`` metric; the dead-letter Delta table plugs in
behind :class:`DeadLetterSink`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)
_PREVIEW_BYTES = 120


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    stage: str
    reason: str
    payload: bytes

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


class DeadLetterSink(Protocol):
    def record(self, dead_letters: Sequence[DeadLetter]) -> None:
        """Make the dead letters durable before the offsets that hold them are committed."""
        ...


class LoggingDeadLetterSink:
    """Logs each dead letter at WARNING with a short preview of its payload."""

    def record(self, dead_letters: Sequence[DeadLetter]) -> None:
        for letter in dead_letters:
            preview = letter.payload[:_PREVIEW_BYTES]
            more = "…" if len(letter.payload) > _PREVIEW_BYTES else ""
            logger.warning(
                "dead letter %s stage=%s reason=%s payload=%r%s (%d bytes)",
                letter.where,
                letter.stage,
                letter.reason,
                preview,
                more,
                len(letter.payload),
            )
