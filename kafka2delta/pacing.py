"""How long a table's buffers may wait before their commit, when many writers share the table's log.

Every commit is one log version, and versions are written one after another: on an object store each costs a
listing and a conditional PUT, tens of milliseconds, so a log takes a few dozen commits per second at most. N
daemons (pods of one consumer group) each committing every ``allowed_latency_s`` ask for N / allowed_latency_s:
past what the log can take, each commit races the others (delta-rs re-reads every winning commit and tries the
next version) and retries grow with N.

``ingest.table_commits_per_s`` is a budget for the whole table. After each of its commits a writer sees how many
versions the log gained since its commit k commits ago: ``writers ≈ versions gained / k`` (counting every
writer's commits, compaction and mutations too). It then waits ``writers / budget`` seconds between commits,
never less than ``allowed_latency_s``, at most :data:`MAX_INTERVAL_S`. Every writer measures the same log, so the
fleet settles at the budget without talking to each other; one writer alone never waits longer than configured.
A writer whose partitions went quiet for a while saw the others' commits meanwhile over few of its own: the count
is never taken above the log's rate over the same span of the clock times the writer's wait (found by review: after
a 10-minute pause beside a fleet well under its budget, it waited ~16 s, a rare writer 60 s). A limit of records
or bytes still commits at once (memory stays bounded).
"""

from __future__ import annotations

from collections import deque

MAX_INTERVAL_S = 60.0
"""Longest wait the budget imposes (beyond it, a larger budget or fewer writers is the answer)."""
WINDOW_COMMITS = 8
"""This writer's last commits the log's growth is measured over."""


class CommitPacer:
    """The wait before one table's next commit (``interval_s``), from the versions its log gains."""

    def __init__(self, *, allowed_latency_s: float, table_commits_per_s: float) -> None:
        self._allowed = allowed_latency_s
        self._budget = table_commits_per_s
        self._commits: deque[tuple[int, float]] = deque(maxlen=WINDOW_COMMITS + 1)
        """This writer's last commits: the version each left the table at, and when (seconds, monotonic)."""
        self.interval_s = allowed_latency_s
        self.writers = 1.0
        """Commits of all writers per wait of this one, over the window (about the number of writers)."""

    def committed(self, version: int, now: float) -> float:
        """Record a commit of this writer that left the table at ``version`` at ``now``; the wait before the next
        one."""
        if self._commits and version < self._commits[-1][0]:
            self._commits.clear()  # the table was replaced
        self._commits.append((version, now))
        (first, since), (last, until) = self._commits[0], self._commits[-1]
        if self._budget <= 0 or len(self._commits) < 2:
            return self.interval_s
        # Commits of all writers per commit of ours (self-consistent while the fleet settles), but no more than the
        # log's rate gives over one wait of ours (a quiet spell of ours is no crowd).
        per_commit = (last - first) / (len(self._commits) - 1)
        per_wait = (last - first) / (until - since) * self.interval_s if until > since else per_commit
        self.writers = max(1.0, min(per_commit, per_wait))
        self.interval_s = min(max(self._allowed, self.writers / self._budget), max(MAX_INTERVAL_S, self._allowed))
        return self.interval_s
