"""The txn versions of a table's app ids, kept current by reading only the commits added since the last read.

Every flush reads the txn version of each partition it commits (twice: the table and the dead-letter table), and
every retry after a conflict reads them again. ``DeltaTable.transaction_version`` answers one app id by scanning
the log segment (the checkpoint and every commit after it): on an object store that is a round trip per file per
app id, seconds for one flush of 32 partitions. Here the first read of an app id asks delta-rs, and later reads
only fold in the txn actions of the commits that landed since, one file each (the newest txn action of an app id
is its version: a commit's actions replace the older ones).

Exact, or it falls back: the cache is only ever at the table handle's version; if that version went back (the
table was replaced) or a commit file in between is missing (cleaned up after a checkpoint), it starts again from
delta-rs's answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import pyarrow.fs as pa_fs
from deltalake import DeltaTable

logger = logging.getLogger(__name__)


class TxnVersions:
    """Txn versions by app id as of ``version``; one per table handle (a :class:`~kafka2delta.writer.DeltaWriter`)."""

    def __init__(self, filesystem: pa_fs.FileSystem, root: str) -> None:
        self._filesystem = filesystem
        self._log = f"{root.rstrip('/')}/_delta_log"
        self._known: dict[str, int | None] = {}
        self.version: int | None = None
        """The table version the known versions are of (None: nothing read yet)."""

    def read(self, table: DeltaTable, app_ids: Iterable[str]) -> dict[str, int | None]:
        """The txn version of each app id in ``table``'s current version (its handle already brought up to date).

        Raises what the log reads raise (``DeltaError``, ``OSError``): the caller's retry reads again."""
        current = table.version()
        if self.version is None or current < self.version:
            self._start_at(current)
        elif current > self.version:
            newer = self._commits_after(self.version, current)
            if newer is None:
                self._start_at(current)
            else:
                self._known.update(newer)
                self.version = current
        found = {}
        for app_id in app_ids:
            if app_id not in self._known:
                self._known[app_id] = table.transaction_version(app_id)
            found[app_id] = self._known[app_id]
        return found

    def _start_at(self, version: int) -> None:
        self._known.clear()
        self.version = version

    def _commits_after(self, version: int, current: int) -> dict[str, int] | None:
        """The newest txn version per app id in commits ``version``+1 … ``current``; None if one is gone."""
        newer: dict[str, int] = {}
        for commit in range(version + 1, current + 1):
            path = f"{self._log}/{commit:020d}.json"
            try:
                with self._filesystem.open_input_stream(path) as stream:
                    text = stream.read().decode()
            except FileNotFoundError:
                logger.info("commit %d of %s is gone: reading its txn versions from the snapshot", commit, self._log)
                return None
            for line in text.splitlines():
                if '"txn"' not in line:
                    continue
                txn = json.loads(line).get("txn")
                if txn is not None:
                    newer[txn["appId"]] = int(txn["version"])
        return newer
