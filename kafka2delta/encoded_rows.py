"""Rows encoded as they are buffered: a lane's next Parquet file, built in memory one row group at a time.

A buffered row costs its Arrow size until it is written; in a catch-up, where a flush holds up to
``allowed_latency_s`` of messages, that was most of the daemon's memory above its idle footprint (~95 bytes of
RSS per buffered 250-B event). Encoded and compressed as soon as a row group's worth has arrived, a row costs
about its Parquet size (~21 bytes for the same event), and the flush only encodes the last, partial group and
puts the file. The rows and the file are the same as an encoding at the flush would give, in row groups of
``ingest.row_group_rows`` rows (or :data:`GROUP_BYTES` of Arrow data for wide rows) instead of one per file.

Parquet refusing a group (it refuses nothing a table schema allows, so far) leaves the writer unusable, and the
groups already encoded with it: :class:`kafka2delta.errors.RowGroupRefused` makes the loop read the partition
again from its tables' versions, its rows kept as Arrow until their commit, which finds the rows at fault
(dead letters, stage ``write``) as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from kafka2delta.dictionaries import dictionary_columns
from kafka2delta.errors import RowGroupRefused
from kafka2delta.file_stats import FileStats, extremes

DATA_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowCapacityError)
"""Arrow's data errors (not storage errors, which are OSError and retried)."""

GROUP_BYTES = 16 * 1024 * 1024
"""Arrow bytes that make a row group of wide rows (2-KB events: ~12,000 rows) before ``ingest.row_group_rows`` do."""


@dataclass(frozen=True)
class RowGroups:
    """How a lane's rows are encoded while buffered."""

    compression: str
    rows: int
    """Rows per row group (``ingest.row_group_rows``)."""
    nbytes: int = GROUP_BYTES


@dataclass(frozen=True)
class EncodedFile:
    """A finished Parquet file in memory and its Delta statistics."""

    data: pa.Buffer
    schema: pa.Schema
    rows: int
    stats: str


class EncodedRows:
    """The row groups of one lane's next file: an open Parquet writer on an in-memory stream."""

    def __init__(self, schema: pa.Schema, compression: str, use_dictionary: list[str] | bool) -> None:
        self.schema = schema
        self.compression = compression
        self.rows = 0
        self._sink = pa.BufferOutputStream()
        self._writer = pq.ParquetWriter(
            self._sink, schema, compression=compression, write_statistics=True, use_dictionary=use_dictionary
        )
        self._stats = FileStats()
        self._finished: EncodedFile | None = None
        self._broken: Exception | None = None
        """Parquet's error, once the writer refused a group: it has closed its file, and ``close`` would still
        return a file without a footer, so every later call is refused too."""

    @classmethod
    def start(cls, group: pa.Table, compression: str) -> EncodedRows:
        """A file whose first row group is ``group`` (its columns' dictionaries chosen from it)."""
        try:
            encoded = cls(group.schema, compression, dictionary_columns(group))
        except DATA_ERRORS as exc:
            raise _refused(exc) from exc
        encoded.add(group)
        return encoded

    def add(self, group: pa.Table) -> None:
        """Encode ``group`` as the file's next row group (its schema is the file's)."""
        assert self._finished is None, "a finished file takes no more rows"
        self._check()
        try:
            self._writer.write_table(group, row_group_size=max(group.num_rows, 1))
        except DATA_ERRORS as exc:
            self._broken = exc
            raise _refused(exc) from exc
        self.rows += group.num_rows
        self._stats = self._stats.merge(extremes(group)) if self._stats.rows else extremes(group)

    @property
    def nbytes(self) -> int:
        """The encoded bytes held (compressed pages so far)."""
        return self._finished.data.size if self._finished is not None else int(self._sink.tell())

    def finish(self) -> EncodedFile:
        """Close the file (once; later calls return the same file)."""
        if self._finished is None:
            self._check()
            try:
                self._writer.close()
            except DATA_ERRORS as exc:
                self._broken = exc
                raise _refused(exc) from exc
            self._finished = EncodedFile(self._sink.getvalue(), self.schema, self.rows, self._stats.to_json())
        return self._finished

    def _check(self) -> None:
        if self._broken is not None:
            raise _refused(self._broken)

    def read(self) -> pa.Table:
        """The encoded rows, decoded (for the paths that need them as Arrow: an evolution commit, a rejection)."""
        return pq.read_table(pa.BufferReader(self.finish().data), schema=self.schema)


def _refused(exc: Exception) -> RowGroupRefused:
    return RowGroupRefused(f"Parquet refused a row group: {exc}")
