"""The daemon's HTTP edge: ``/metrics``, ``/healthz``, ``/readyz``, ``/status.json`` and ``/`` (a status page).

One threaded server on ``metrics.host:metrics.port``. The loop stays single-threaded: it writes what it
wants shown to a :class:`StatusBoard` (a lock-guarded copy, updated at commits, rebalances and progress
ticks) and the server threads only read immutable :class:`Status` snapshots from it.

- ``/metrics``: the Prometheus registry (text format, or OpenMetrics when the scraper asks for it).
- ``/healthz``: liveness. 200 while the loop has turned within :func:`liveness_window_s` (a retry
  backoff counts as a turn: waiting on purpose is alive); 503 with a JSON reason otherwise, or when the
  loop failed.
- ``/readyz``: readiness. 200 when partitions are assigned and the table was reachable at the last
  attempt; 503 with the reason otherwise (a replica with no partition in a group larger than the
  topic's partition count is not ready, by design).
- ``/``: a self-contained HTML page (no script, no external asset; it reloads itself every 5 s):
  per partition the committed offset, lag and last commit; the recent commits; dead letters by stage.
- ``/status.json``: the same data as JSON.

Every text a snapshot holds (an error's text, a failure, URIs, names) goes through the board's ``redact``: the
entry point gives it the log redactor (:class:`kafka2delta.logs.Redactor`), so a configured secret an error
carries (a request URI with a SAS token's signature) is ``***`` on the page, in the JSON and in the probes'
reasons, as in the logs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from kafka2delta import __version__
from kafka2delta.config import without_credentials
from kafka2delta.errors import FatalError
from kafka2delta.records import TopicPartition

logger = logging.getLogger(__name__)

T = TypeVar("T")

RECENT_COMMITS = 20
_MIN_LIVENESS_WINDOW_S = 60.0  # above the longest retry backoff (30 s), with room for a slow flush


def liveness_window_s(allowed_latency_s: float, consume_timeout_s: float) -> float:
    """How long the loop may go without turning before ``/healthz`` fails: a loop turn waits at most
    ``consume_timeout_s``, and a flush (every ``allowed_latency_s``) may take a few times that."""
    return max(_MIN_LIVENESS_WINDOW_S, 3 * allowed_latency_s, 10 * consume_timeout_s)


# --- the snapshot ------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    committed_offset: int | None
    """The partition's txn version in the table: the last offset whose outcome is final."""
    high_watermark: int | None
    """The broker's high watermark (cached by the consumer), None until known."""
    lag: int | None
    """``high_watermark`` minus the offset after ``committed_offset``."""
    buffered_messages: int = 0
    last_commit_version: int | None = None
    """The table version of this daemon's last commit for the partition (since it started)."""
    last_commit_time: float | None = None
    """Unix time of that commit."""
    topic: str = ""
    table: str = ""
    """The table the partition's messages go to (its name)."""


@dataclass(frozen=True)
class CommitRecord:
    version: int
    time: float
    """Unix time."""
    reason: str
    offsets: Mapping[TopicPartition, tuple[int, int]]
    """Per topic partition: the first and last offset the commit covers (rows, dead letters and skips)."""
    rows: int
    dead_letters: int
    seconds: float
    """The flush's duration."""
    table: str = ""
    """The table's name (its route's name, or its URI)."""

    def offsets_json(self) -> dict[str, Any]:
        """``topics``: topic → partition → [first, last]; with one topic also ``offsets``: partition → [first, last]."""
        topics: dict[str, dict[str, list[int]]] = {}
        for tp, (first, last) in sorted(self.offsets.items()):
            topics.setdefault(tp.topic, {})[str(tp.partition)] = [first, last]
        return {"topics": topics, **({"offsets": next(iter(topics.values()))} if len(topics) == 1 else {})}


@dataclass(frozen=True)
class TableStatus:
    name: str
    uri: str
    version: int | None
    """The table version of this daemon's last commit to it (or when it was opened)."""


@dataclass(frozen=True)
class Status:
    """What the daemon shows, at one instant."""

    topic: str
    app_id: str
    group_id: str
    table_uri: str
    dead_letter_table_uri: str
    version: str
    """kafka2delta's version."""
    started_at: float
    """Unix time."""
    uptime_s: float
    state: str
    """``starting``, ``running``, ``stopping``, ``stopped`` or ``failed``."""
    table_version: int | None
    partitions: tuple[PartitionStatus, ...]
    commits: tuple[CommitRecord, ...]
    """Newest first, at most :data:`RECENT_COMMITS`."""
    dead_letters_by_stage: Mapping[str, int]
    """Dead letters recorded since start, by stage."""
    buffered_messages: int
    buffered_bytes: int
    seconds_since_loop_turn: float
    liveness_window_s: float
    table_error: str | None
    """The error of the last table operation when it failed, None when it succeeded."""
    failure: str | None = None
    """Why the loop stopped, when it failed."""
    tables: tuple[TableStatus, ...] = ()
    """Every table this daemon writes (opened so far)."""
    in_group: bool = False
    """The consumer group has given this daemon an assignment (maybe of no partition) since it started."""

    def liveness(self) -> tuple[bool, str]:
        if self.state == "failed":
            return False, f"the loop failed: {self.failure or 'unknown error'}"
        if self.seconds_since_loop_turn > self.liveness_window_s:
            return False, (
                f"the loop has not turned for {self.seconds_since_loop_turn:.0f} s "
                f"(limit {self.liveness_window_s:.0f} s)"
            )
        return True, f"the loop turned {self.seconds_since_loop_turn:.1f} s ago"

    def readiness(self) -> tuple[bool, str]:
        if self.state in ("stopped", "failed"):
            return False, f"the daemon is {self.state}"
        if not self.partitions and not self.in_group:
            return False, "no partition assigned"
        if self.table_error is not None:
            return False, f"the table was not reachable at the last attempt: {self.table_error}"
        if not self.partitions:
            # Ready: a rollout waits for each new pod to be ready, and an idle one (more daemons than partitions,
            # no topic matching the pattern yet) would never be, stalling it.
            return True, "in the consumer group, no partition assigned (idle)"
        return True, f"{len(self.partitions)} partitions assigned, table reachable"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["partitions"] = [dataclasses.asdict(p) for p in self.partitions]
        data["commits"] = [
            {**{k: v for k, v in dataclasses.asdict(c).items() if k != "offsets"}, **c.offsets_json()}
            for c in self.commits
        ]
        data["tables"] = [dataclasses.asdict(t) for t in self.tables]
        data["dead_letters_by_stage"] = dict(self.dead_letters_by_stage)
        live, live_reason = self.liveness()
        ready, ready_reason = self.readiness()
        data["live"], data["live_reason"] = live, live_reason
        data["ready"], data["ready_reason"] = ready, ready_reason
        return data


@dataclass
class _Partition:
    table: str = ""
    committed_offset: int | None = None
    high_watermark: int | None = None
    lag: int | None = None
    buffered_messages: int = 0
    last_commit_version: int | None = None
    last_commit_time: float | None = None


def _unchanged(text: str) -> str:
    return text


@dataclass
class StatusBoard:
    """What the loop publishes for the server threads. Every method is thread-safe and cheap. ``redact`` masks
    secrets in every text of a :meth:`snapshot` (the stored texts stay as given: only snapshots leave the board)."""

    topic: str
    app_id: str
    group_id: str
    table_uri: str
    dead_letter_table_uri: str
    liveness_window_s: float
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    redact: Callable[[str], str] = _unchanged
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _started: float = 0.0
    _started_wall: float = 0.0
    _last_turn: float = 0.0
    _state: str = "starting"
    _failure: str | None = None
    _table_version: int | None = None
    _table_error: str | None = None
    _partitions: dict[TopicPartition, _Partition] = field(default_factory=dict)
    _tables: dict[str, TableStatus] = field(default_factory=dict)
    _commits: deque[CommitRecord] = field(default_factory=lambda: deque(maxlen=RECENT_COMMITS))
    _dead_letters: dict[str, int] = field(default_factory=dict)
    _buffered_messages: int = 0
    _buffered_bytes: int = 0
    _in_group: bool = False

    def __post_init__(self) -> None:
        self._started = self._last_turn = self.clock()
        self._started_wall = self.wall_clock()

    def loop_turned(self) -> None:
        self._last_turn = self.clock()  # one float store: no lock needed

    def joined_group(self) -> None:
        """The group gave this daemon an assignment (an empty one too: an idle member is in the group)."""
        self._in_group = True  # one bool store: no lock needed

    def left_group(self) -> None:
        """The group took the assignment away without notice (lost): not ready until it gives one again."""
        self._in_group = False

    def set_state(self, state: str, failure: str | None = None) -> None:
        with self._lock:
            self._state, self._failure = state, failure

    def table_reachable(self, version: int | None = None) -> None:
        with self._lock:
            self._table_error = None
            if version is not None:
                self._table_version = version

    def table_unreachable(self, error: str) -> None:
        with self._lock:
            self._table_error = error

    def table_opened(self, name: str, uri: str, version: int | None) -> None:
        with self._lock:
            self._tables[name] = TableStatus(name, without_credentials(uri), version)

    def table_closed(self, name: str) -> None:
        with self._lock:
            self._tables.pop(name, None)

    def partitions(
        self,
        committed: Mapping[TopicPartition, int | None],
        highs: Mapping[TopicPartition, int],
        lags: Mapping[TopicPartition, int],
        buffered: Mapping[TopicPartition, int],
        buffered_bytes: int,
        tables: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """The assigned partitions now: their committed offsets, known high watermarks and lags (the loop's:
        ``PartitionState.lag``), buffers and tables."""
        with self._lock:
            for gone in set(self._partitions) - set(committed):
                del self._partitions[gone]
            for tp, offset in committed.items():
                entry = self._partitions.setdefault(tp, _Partition())
                entry.committed_offset = offset
                high = highs.get(tp)
                entry.high_watermark = high
                entry.lag = lags.get(tp)
                entry.buffered_messages = buffered.get(tp, 0)
                entry.table = (tables or {}).get(tp, "")
            self._buffered_messages = sum(buffered.values())
            self._buffered_bytes = buffered_bytes

    def committed(self, record: CommitRecord, dead_letters_by_stage: Mapping[str, int]) -> None:
        with self._lock:
            self._commits.appendleft(record)
            self._table_version = record.version
            self._table_error = None
            known = self._tables.get(record.table)
            if known is not None:
                self._tables[record.table] = dataclasses.replace(known, version=record.version)
            for partition in record.offsets:
                entry = self._partitions.get(partition)
                if entry is not None:
                    entry.last_commit_version, entry.last_commit_time = record.version, record.time
            for stage, count in dead_letters_by_stage.items():
                self._dead_letters[stage] = self._dead_letters.get(stage, 0) + count

    def snapshot(self) -> Status:
        status = self._snapshot()
        return status if self.redact is _unchanged else _redacted(status, self.redact)

    def _snapshot(self) -> Status:
        now = self.clock()
        with self._lock:
            partitions = tuple(
                PartitionStatus(tp.partition, e.committed_offset, e.high_watermark, e.lag, e.buffered_messages,
                                e.last_commit_version, e.last_commit_time, tp.topic, e.table)
                for tp, e in sorted(self._partitions.items())
            )  # fmt: skip
            return Status(
                topic=self.topic,
                app_id=self.app_id,
                group_id=self.group_id,
                table_uri=without_credentials(self.table_uri),
                dead_letter_table_uri=without_credentials(self.dead_letter_table_uri),
                version=__version__,
                started_at=self._started_wall,
                uptime_s=now - self._started,
                state=self._state,
                table_version=self._table_version,
                partitions=partitions,
                commits=tuple(self._commits),
                dead_letters_by_stage=dict(sorted(self._dead_letters.items())),
                buffered_messages=self._buffered_messages,
                buffered_bytes=self._buffered_bytes,
                seconds_since_loop_turn=max(0.0, now - self._last_turn),
                liveness_window_s=self.liveness_window_s,
                table_error=self._table_error,
                failure=self._failure,
                tables=tuple(self._tables[name] for name in sorted(self._tables)),
                in_group=self._in_group,
            )


def _redacted(value: T, redact: Callable[[str], str]) -> T:
    """``value`` with ``redact`` applied to every string in it: fields of the snapshot's dataclasses, items of its
    tuples (topic partitions among them) and keys and values of its mappings."""
    found: Any = value
    if isinstance(found, str):
        found = redact(found)
    elif dataclasses.is_dataclass(found) and not isinstance(found, type):
        changed = {f.name: _redacted(getattr(found, f.name), redact) for f in dataclasses.fields(found) if f.init}
        found = dataclasses.replace(found, **changed)
    elif isinstance(found, TopicPartition):
        found = TopicPartition(redact(found.topic), found.partition)
    elif isinstance(found, tuple):
        found = tuple(_redacted(item, redact) for item in found)
    elif isinstance(found, Mapping):
        found = {_redacted(key, redact): _redacted(item, redact) for key, item in found.items()}
    return cast(T, found)


# --- rendering ---------------------------------------------------------------------------


def _when(unix: float | None) -> str:
    if unix is None:
        return "—"
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h {minutes:02d} min"
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], empty: str, css: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty">{html.escape(empty)}</p>'
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2329;background:#f6f7f9}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.sub{color:#5b6670;margin-bottom:16px}
.badges span{display:inline-block;padding:2px 10px;border-radius:12px;margin-right:8px;font-weight:600;font-size:12px}
.ok{background:#d7f5dd;color:#11632a}.bad{background:#fde0e0;color:#9b1c1c}
dl{display:grid;grid-template-columns:max-content auto;gap:4px 16px;margin:0}
dt{color:#5b6670}dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px rgba(0,0,0,.08);min-width:480px}
th,td{padding:6px 12px;border-bottom:1px solid #e6e9ec;text-align:right;white-space:nowrap}
th{background:#eef1f4;font-weight:600}
td:first-child,th:first-child{text-align:left}
td.text,th.text{text-align:left}
.lag-high{color:#9b1c1c;font-weight:600}
.empty{color:#5b6670;font-style:italic}
.card{background:#fff;padding:12px 16px;box-shadow:0 1px 2px rgba(0,0,0,.08);display:inline-block}
.top{display:flex;gap:32px;flex-wrap:wrap;align-items:flex-start}
table.dead-letters{min-width:240px}
table.commits th:nth-child(4){text-align:left}
table.commits td:nth-child(4){text-align:left;font-family:ui-monospace,Menlo,monospace}
table.by-table th:nth-child(4),table.by-table td:nth-child(4){text-align:right;font-family:inherit}
table.by-table th:nth-child(5){text-align:left}
table.by-table td:nth-child(5){text-align:left;font-family:ui-monospace,Menlo,monospace}
"""


def render_page(status: Status) -> str:
    """The status page: one HTML document, inline style, no script, no external asset."""
    esc = html.escape
    live, live_reason = status.liveness()
    ready, ready_reason = status.readiness()
    badges = (
        f'<span class="{"ok" if live else "bad"}" id="live" title="{esc(live_reason)}">'
        f"{'live' if live else 'not live'}</span>"
        f'<span class="{"ok" if ready else "bad"}" id="ready" title="{esc(ready_reason)}">'
        f"{'ready' if ready else 'not ready'}</span>"
        f'<span class="ok" id="state">{esc(status.state)}</span>'
    )
    tables = ", ".join(f"{t.name} (v{_number(t.version)})" for t in status.tables)
    overview = [
        ("topic", status.topic),
        ("table", status.table_uri),
        *([("tables", tables)] if len(status.tables) > 1 else []),
        ("dead-letter table", status.dead_letter_table_uri),
        ("table version", _number(status.table_version)),
        ("app id / group", f"{status.app_id} / {status.group_id}"),
        ("kafka2delta", status.version),
        ("started", _when(status.started_at)),
        ("uptime", _duration(status.uptime_s)),
        ("buffered", f"{status.buffered_messages:,} messages, {status.buffered_bytes:,} bytes"),
        ("health", f"{live_reason}; {ready_reason}"),
    ]
    overview_html = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in overview)

    # The topic and table columns only where they tell partitions (or commits) apart.
    many_topics = len({p.topic for p in status.partitions}) > 1
    many_tables = len(status.tables) > 1
    partition_rows = []
    for p in status.partitions:
        lag_css = ' class="lag-high"' if p.lag else ""
        partition_rows.append(
            [
                *([esc(p.topic)] if many_topics else []),
                str(p.partition),
                *([esc(p.table)] if many_tables else []),
                _number(p.committed_offset),
                _number(p.high_watermark),
                f"<span{lag_css}>{_number(p.lag)}</span>",
                _number(p.buffered_messages),
                _number(p.last_commit_version),
                esc(_when(p.last_commit_time)),
            ]
        )
    partitions_html = _table(
        [
            *(["topic"] if many_topics else []),
            "partition",
            *(["table"] if many_tables else []),
            "committed offset",
            "high watermark",
            "lag",
            "buffered",
            "last commit version",
            "last commit",
        ],
        partition_rows,
        "no partition assigned",
        "partitions",
    )

    commit_rows = []
    for c in status.commits:
        ranges = "<br>".join(f"{esc(str(tp))}@{first}..{last}" for tp, (first, last) in sorted(c.offsets.items()))
        commit_rows.append(
            [
                *([esc(c.table)] if many_tables else []),
                str(c.version),
                esc(_when(c.time)),
                esc(c.reason),
                ranges,
                f"{c.rows:,}",
                f"{c.dead_letters:,}",
                f"{c.seconds:.3f} s",
            ]
        )
    commits_html = _table(
        [*(["table"] if many_tables else []), "version", "time", "reason", "offsets", "rows", "dead letters", "flush"],
        commit_rows,
        "no commit yet",
        "commits" if not many_tables else "commits by-table",
    )
    dead_html = _table(
        ["stage", "dead letters"],
        [[esc(stage), f"{count:,}"] for stage, count in status.dead_letters_by_stage.items()],
        "no dead letter since start",
        "dead-letters",
    )
    title = f"kafka2delta · {status.topic}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="refresh" content="5">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1>"
        f'<div class="sub">status at {esc(_when(time.time()))} · <a href="/status.json">status.json</a> · '
        '<a href="/metrics">metrics</a></div>'
        f'<div class="badges">{badges}</div>'
        '<div class="top">'
        f'<section><h2>Overview</h2><div class="card"><dl>{overview_html}</dl></div></section>'
        f"<section><h2>Dead letters by stage</h2>{dead_html}</section>"
        "</div>"
        f"<h2>Partitions</h2>{partitions_html}"
        f"<h2>Recent commits</h2>{commits_html}"
        "</body></html>"
    )


# --- the server --------------------------------------------------------------------------


class StatusServer:
    """The HTTP endpoints on ``host:port`` (port 0: any free port, see :attr:`port`), in daemon threads."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, status: Callable[[], Status]) -> None:
        handler = _handler(registry, status)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise FatalError(f"metrics.port: cannot listen on {host}:{port}: {exc}") from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kafka2delta-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> StatusServer:
        self._thread.start()
        host = self._server.server_address[0]
        logger.info("serving /metrics, /healthz, /readyz and the status page on http://%s:%d/", host, self.port)
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()  # waits for serve_forever: only once it runs
            self._thread.join(5)
        self._server.server_close()


def _handler(registry: CollectorRegistry, status: Callable[[], Status]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"kafka2delta/{__version__}"

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            try:
                if path == "/metrics":
                    encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
                    self._send(200, content_type, encoder(registry))
                elif path == "/healthz":
                    self._probe(*status().liveness())
                elif path == "/readyz":
                    self._probe(*status().readiness())
                elif path == "/status.json":
                    self._send(200, "application/json", json.dumps(status().to_json(), indent=1).encode())
                elif path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", render_page(status()).encode())
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found: try /, /metrics, /healthz, /readyz\n")
            except Exception as exc:  # a rendering bug must not kill the server thread
                logger.exception("HTTP %s failed", path)
                self._send(500, "text/plain; charset=utf-8", f"internal error: {type(exc).__name__}\n".encode())

        def _probe(self, ok: bool, reason: str) -> None:
            body = json.dumps({"status": "ok" if ok else "failing", "reason": reason}).encode()
            self._send(200 if ok else 503, "application/json", body)

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s %s", self.address_string(), format % args)

    return Handler
