"""The pure core: the messages of one partition → rows in the table schema + dead letters.

deserialize → (transforms, next issue) → coerce. No Kafka, no Delta, no clock: unit tests drive it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from kafka2delta.batches import PartitionMessages, StageResult
from kafka2delta.coercions import coerce
from kafka2delta.dead_letters import DeadLetter
from kafka2delta.serialization import Deserializer


@dataclass
class ProcessedPartition:
    """What became of every message of a :class:`PartitionMessages`."""

    partition: int
    rows: pa.Table
    dead_letters: list[DeadLetter]
    skipped_empty: int
    first_offset: int
    last_offset: int
    max_timestamp_ms: int


class Pipeline:
    def __init__(self, deserializer: Deserializer, table_schema: pa.Schema) -> None:
        self._deserializer = deserializer
        self._schema = table_schema

    def process(self, messages: PartitionMessages) -> ProcessedPartition:
        """Every input message ends as exactly one of: a row, a dead letter, a counted skip."""
        non_empty = [i for i, payload in enumerate(messages.payloads) if payload]
        payloads = [messages.payloads[i] or b"" for i in non_empty]
        dead_letters: list[DeadLetter] = []

        def collect(result: StageResult, positions: list[int]) -> list[int]:
            """Record the failures of a stage; return the input positions of the rows that passed."""
            for index, error in result.failures:
                position = positions[index]
                dead_letters.append(
                    DeadLetter(
                        messages.topic,
                        messages.partition,
                        messages.offsets[position],
                        error.stage,
                        error.reason,
                        messages.payloads[position] or b"",
                    )
                )
            return [positions[i] for i in result.indices]

        decoded = self._deserializer.decode(payloads)
        positions = collect(decoded, non_empty)
        coerced = coerce(decoded.rows, self._schema)
        collect(coerced, positions)
        dead_letters.sort(key=lambda letter: letter.offset)
        return ProcessedPartition(
            partition=messages.partition,
            rows=coerced.rows,
            dead_letters=dead_letters,
            skipped_empty=len(messages) - len(non_empty),
            first_offset=messages.offsets[0],
            last_offset=messages.offsets[-1],
            max_timestamp_ms=max(messages.timestamps_ms),
        )
