"""Several topics, one daemon: a table per topic (``table.uri`` with ``{topic}``), a topic pattern that picks up
a topic created while the daemon runs, two topics sharing one table (txn ids naming the topic), a table written
by the single-topic release that a second topic joins, and 200 topics at once."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
import shutil
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from tests.support.harness import BackgroundProducer, Daemon, Message, Topic, event, toml_section, wait_for
from tests.support.observability import free_port, http_get, scrape, total
from tests.support.routing import (
    BROKEN,
    LEGACY_APP_ID,
    LEGACY_BAD,
    LEGACY_FIXTURE,
    LEGACY_PARTITIONS,
    LEGACY_ROUNDS,
    LEGACY_TABLE,
    LEGACY_TOPIC,
    create_topics,
    duplicates,
    expected_ids,
    ids,
    legacy_payload,
    produce,
    rows,
    run_measured,
    setup_for,
    topic_ids,
    txn_versions,
    write_config,
)

PER_PARTITION = 50


def _log_line(log: str, pattern: str) -> bool:
    return re.search(pattern, log, re.MULTILINE) is not None


def _problems(report: dict[str, Any] | str) -> Any:
    """What a multi-topic ``verify --json`` found wrong, short (or its output when it is not JSON)."""
    if not isinstance(report, dict) or "reports" not in report:
        return report
    return {
        found["topic"]: {
            "log_gaps": found["log_gaps"],
            "dead_letter_log_gaps": found["dead_letter_log_gaps"],
            **{
                f"{name}[{p['partition']}]": p[name]
                for p in found["partitions"]
                for name in ("missing", "duplicated", "in_both", "unexpected")
                if p[name]
            },
        }
        for found in report["reports"]
        if not found["ok"]
    }


def _verified(code: int, report: dict[str, Any] | str, topics: set[str]) -> dict[str, dict[str, Any]]:
    """The reports of a multi-topic ``verify --json``, by topic, having checked each found nothing wrong."""
    assert code == 0 and isinstance(report, dict) and report["ok"] is True, _problems(report)
    by_topic = {r["topic"]: r for r in report["reports"]}
    assert set(by_topic) == topics
    for topic, found in by_topic.items():
        counts = {k: found[k] for k in ("lost", "duplicated_total", "in_both_total", "unexpected_total", "pending")}
        assert counts == dict.fromkeys(counts, 0), (topic, counts)
        assert found["ok"] is True and found["log_gaps"] == [] and found["dead_letter_log_gaps"] == [], found
    return by_topic


def _config_with(tmp_path: Path, bootstrap: str, topics: list[Topic], more: list[str]) -> Path:
    """A config of ``topics``, each into ``<tmp_path>/lake/{topic}`` unless ``more`` (TOML lines) says otherwise."""
    config = write_config(
        tmp_path / "config.toml",
        bootstrap,
        {"topics": [t.name for t in topics]},
        {"uri": f"{tmp_path / 'lake'}/{{topic}}"},
        ingest={"max_messages_per_file": 20},
    )
    config.write_text(config.read_text() + "\n".join(more) + "\n")
    return config


def test_three_topics_each_into_its_own_table(
    tmp_path: Path, kafka_bootstrap: str, topic_factory: Callable[[int], Topic], daemon_factory: Callable[..., Daemon]
) -> None:
    topics = [topic_factory(4) for _ in range(3)]
    names = {t.name for t in topics}
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "config.toml",
        kafka_bootstrap,
        {"topics": [t.name for t in topics]},
        {"uri": f"{lake}/{{topic}}"},
        ingest={"max_messages_per_file": 20},
    )
    produced = {t.name: t.produce(PER_PARTITION) for t in topics}
    bad = topics[1]
    bad.produce_messages([Message(2, BROKEN)])  # offset PER_PARTITION of its partition 2

    daemon = daemon_factory(setup_for(config, topics[0], lake / topics[0].name), "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-4000:]

    assert sorted(p.name for p in lake.iterdir()) == sorted([*names, "_dead_letters"])
    for topic in topics:
        found = rows(lake / topic.name, ["id", "kafka_topic"])
        assert duplicates(r["id"] for r in found) == {}, topic.name
        assert sorted(r["id"] for r in found) == sorted(produced[topic.name]), topic.name
        assert {r["kafka_topic"] for r in found} == {topic.name}
        last = {f"{topic.name}-{p}": PER_PARTITION - 1 for p in range(4)}
        if topic is bad:
            last[f"{topic.name}-2"] = PER_PARTITION  # the dead letter is final too
        assert txn_versions(lake / topic.name, last) == last

    letters = rows(lake / "_dead_letters")
    assert [(r["topic"], r["partition"], r["offset"], r["stage"]) for r in letters] == [
        (bad.name, 2, PER_PARTITION, "deserialize")
    ]
    assert letters[0]["table"] == str(lake / bad.name) and letters[0]["app_id"] == bad.name
    assert txn_versions(lake / "_dead_letters", [f"{bad.name}-dlq-2"]) == {f"{bad.name}-dlq-2": PER_PARTITION}

    code, report = setup_for(config, topics[0], lake / topics[0].name).verify()
    by_topic = _verified(code, report, names)
    for topic in topics:
        checked = by_topic[topic.name]
        assert checked["table_uri"] == str(lake / topic.name)
        assert checked["dead_letter_uri"] == str(lake / "_dead_letters")
        extra = 1 if topic is bad else 0
        assert (checked["produced"], checked["rows"], checked["dead_letters"]) == (
            4 * PER_PARTITION + extra,
            4 * PER_PARTITION,
            extra,
        )


def test_a_topic_pattern_picks_up_a_topic_created_while_running(
    tmp_path: Path, kafka_bootstrap: str, daemon_factory: Callable[..., Daemon]
) -> None:
    prefix = f"rt{uuid.uuid4().hex[:10]}"
    names = [f"{prefix}.a", f"{prefix}.b"]
    decoy = f"{prefix}-other"  # does not match the pattern: never ingested
    create_topics(kafka_bootstrap, [*names, decoy], 2)
    topics = {name: Topic(name, 2, kafka_bootstrap) for name in [*names, decoy]}
    produced = {name: topics[name].produce(30) for name in [*names, decoy]}
    lake = tmp_path / "lake"
    port = free_port()
    config = write_config(
        tmp_path / "config.toml",
        kafka_bootstrap,
        {"topic_pattern": f"^{prefix}\\..*"},
        {"uri": f"{lake}/{{topic}}"},
        ingest={"unused_table_close_s": 2.0},
        refresh_ms=1000,
        metrics_port=port,
    )
    setup = setup_for(config, topics[names[0]], lake / names[0])
    daemon = daemon_factory(setup)
    for name in names:
        wait_for(lambda name=name: len(ids(lake / name)) == 60, 90, f"the rows of {name}")

    third = f"{prefix}.c"
    create_topics(kafka_bootstrap, [third], 2)
    topics[third] = Topic(third, 2, kafka_bootstrap)
    produced[third] = topics[third].produce(30)
    wait_for(lambda: len(ids(lake / third)) == 60, 90, f"the rows of {third}, created while the daemon runs")
    # The first topics still flow beside it.
    produced[names[0]] += topics[names[0]].produce(10, start=30)
    wait_for(lambda: len(ids(lake / names[0])) == 80, 60, f"the later rows of {names[0]}")

    # A deleted topic is released at the next metadata refresh, and its table closed 2 s later (its status row
    # and metrics series gone); the others keep flowing.
    deleted = names[1]
    base = f"http://127.0.0.1:{port}"
    assert total(scrape(base), "kafka2delta_rows_written_total", topic=deleted) == 60
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # kept alive until the deletion is done
    admin.delete_topics([deleted])[deleted].result(30)
    released = re.compile(rf"(revoked|lost) .*{re.escape(deleted)}\[")
    wait_for(lambda: released.search(daemon.log()) is not None, 60, f"{deleted} released after its deletion")
    wait_for(lambda: f"closed table {lake / deleted}:" in daemon.log(), 30, f"the table of {deleted} closed")
    samples = scrape(base)
    assert [
        s for s in samples if dict(s[1]).get("topic") == deleted or dict(s[1]).get("table") == str(lake / deleted)
    ] == []
    assert total(samples, "kafka2delta_rows_written_total", topic=names[0]) == 80
    code, _, body = http_get(f"{base}/status.json")
    assert code == 200
    assert sorted(t["name"] for t in json.loads(body)["tables"]) == sorted(str(lake / n) for n in (names[0], third))
    produced[names[0]] += topics[names[0]].produce(10, start=40)
    wait_for(lambda: len(ids(lake / names[0])) == 100, 60, f"the rows of {names[0]} after the deletion")

    assert daemon.process.poll() is None, daemon.log()[-4000:]
    assert daemon.stop() == 0, daemon.log()[-4000:]
    log = daemon.log()
    for p in range(2):
        assert f"assigned {third}[{p}]" in log

    assert not (lake / decoy).exists()
    for name in [*names, third]:
        found = ids(lake / name)
        assert duplicates(found) == {}, name
        assert sorted(found) == sorted(produced[name]), name
        last = 49 if name == names[0] else 29
        assert txn_versions(lake / name, [f"{name}-0", f"{name}-1"]) == {f"{name}-0": last, f"{name}-1": last}

    code, report = setup.verify()
    by_topic = _verified(code, report, {names[0], third})  # the deleted topic is no longer subscribed
    assert by_topic[names[0]]["rows"] == 100 and by_topic[third]["rows"] == 60


def test_two_topics_share_one_table_with_topic_named_txn_ids(
    tmp_path: Path, kafka_bootstrap: str, topic_factory: Callable[[int], Topic], daemon_factory: Callable[..., Daemon]
) -> None:
    a, b = topic_factory(2), topic_factory(2)
    uri = tmp_path / "lake" / "orders"
    config = write_config(
        tmp_path / "config.toml",
        kafka_bootstrap,
        {"topics": [a.name, b.name]},
        {"uri": str(uri), "app_id": "shop"},
        ingest={"max_messages_per_file": 200, "allowed_latency_s": 0.5},
    )
    setup = setup_for(config, a, uri)
    expected: Counter[tuple[str, str]] = Counter()
    for topic in (a, b):
        expected.update((topic.name, i) for i in topic.produce(40))

    first = daemon_factory(setup, "--until-caught-up")
    assert first.wait(180) == 0, first.log()[-4000:]
    assert topic_ids(uri) == expected
    app_ids = [f"shop-{t.name}-{p}" for t in (a, b) for p in range(2)]
    assert txn_versions(uri, app_ids) == dict.fromkeys(app_ids, 39)
    assert txn_versions(uri, ["shop-0", "shop-1"]) == {"shop-0": None, "shop-1": None}

    # More messages while a second daemon runs; it is stopped mid-stream, a third catches up.
    producers = {t.name: BackgroundProducer(t, per_partition=1500, start=40) for t in (a, b)}
    second = daemon_factory(setup)
    wait_for(lambda: sum(topic_ids(uri).values()) > 400, 90, "commits of the second daemon")
    assert second.stop() == 0, second.log()[-4000:]
    stopped = txn_versions(uri, app_ids)
    for name, producer in producers.items():
        expected.update((name, i) for i in producer.join())
    for topic in (a, b):  # and more after the stop, whenever it came
        expected.update((topic.name, i) for i in topic.produce(100, start=1540))

    third = daemon_factory(setup, "--until-caught-up")
    assert third.wait(180) == 0, third.log()[-4000:]
    found = topic_ids(uri)
    assert {k: n for k, n in found.items() if n > 1} == {}
    assert set(found) == set(expected)
    assert txn_versions(uri, app_ids) == dict.fromkeys(app_ids, 1639)
    log = third.log()
    for app_id, version in stopped.items():
        name, partition = app_id.removeprefix("shop-").rsplit("-", 1)
        assert version is not None and _log_line(
            log,
            rf"assigned {re.escape(name)}\[{partition}\] .*starting at {version + 1} \(table txn version {version}\)",
        ), (app_id, version, log[-4000:])

    code, report = setup.verify()
    by_topic = _verified(code, report, {a.name, b.name})
    assert by_topic[a.name]["rows"] == by_topic[b.name]["rows"] == 2 * 1640


def test_each_route_transforms_and_filters_its_topic_its_own_way(
    tmp_path: Path, kafka_bootstrap: str, topic_factory: Callable[[int], Topic], daemon_factory: Callable[..., Daemon]
) -> None:
    clicks, orders = topic_factory(2), topic_factory(2)
    lake = tmp_path / "lake"
    # [transforms] for every topic no route transforms; the clicks route has its own, and its own filter.
    config = _config_with(
        tmp_path,
        kafka_bootstrap,
        [clicks, orders],
        [
            *toml_section("transforms", {"type": "'every topic'"}),
            "[[routes]]",
            *toml_section("routes", {"topic": clicks.name, "uri": f"{lake}/clicks", "filter": "seq >= `30`"})[1:],
            *toml_section("routes.transforms", {"type": "'clicks route'", "user.country": "'DE'", "ts": "seq"}),
            *toml_section("routes.coercions", {"epoch_unit": "s"}),  # its seq as epoch seconds
        ],
    )
    produced = {t.name: t.produce(PER_PARTITION) for t in (clicks, orders)}
    # The route's filter cannot order a string against a number: a dead letter naming the route's key.
    clicks.produce_messages([Message(1, b'{"id": "text-seq", "seq": "x"}')])

    daemon = daemon_factory(setup_for(config, orders, lake / orders.name), "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-4000:]

    ordered = rows(lake / orders.name, ["id", "type", "user"])
    assert sorted(r["id"] for r in ordered) == sorted(produced[orders.name])
    assert {r["type"] for r in ordered} == {"every topic"} and {r["user"]["country"] for r in ordered} == {"FR"}
    clicked = rows(lake / "clicks", ["id", "seq", "type", "user", "ts"])
    kept = expected_ids(2, range(30, PER_PARTITION))
    assert sorted(r["id"] for r in clicked) == sorted(kept)
    assert all(r["ts"] == dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=r["seq"]) for r in clicked)
    assert {r["type"] for r in clicked} == {"clicks route"} and {r["user"]["country"] for r in clicked} == {"DE"}
    letters = rows(lake / "_dead_letters")
    assert [(r["topic"], r["partition"], r["offset"], r["stage"]) for r in letters] == [
        (clicks.name, 1, PER_PARTITION, "transform")
    ]
    assert letters[0]["error"].startswith("routes[0].filter: cannot compare"), letters[0]["error"]

    code, report = setup_for(config, orders, lake / orders.name).verify()
    by_topic = _verified(code, report, {clicks.name, orders.name})
    assert (by_topic[orders.name]["rows"], by_topic[orders.name]["skipped"]) == (2 * PER_PARTITION, 0)
    filtered_out = 2 * PER_PARTITION - len(kept)
    assert (by_topic[clicks.name]["rows"], by_topic[clicks.name]["skipped"]) == (len(kept), filtered_out)
    assert by_topic[clicks.name]["dead_letters"] == 1


def test_a_route_reads_its_topic_in_a_format_of_its_own(
    tmp_path: Path, kafka_bootstrap: str, topic_factory: Callable[[int], Topic], daemon_factory: Callable[..., Daemon]
) -> None:
    events, logs = topic_factory(2), topic_factory(2)
    lake = tmp_path / "lake"
    # [format] is JSON (the default) for the events; the logs route reads its topic's lines as raw text, gzip'd.
    config = _config_with(
        tmp_path,
        kafka_bootstrap,
        [events, logs],
        [
            "[[routes]]",
            *toml_section("routes", {"topic": logs.name, "uri": f"{lake}/logs"})[1:],
            'schema = { line = "string" }',  # and [table]'s metadata columns
            *toml_section("routes.format", {"type": "raw", "raw_column": "line", "gzip": True}),
        ],
    )
    produced = events.produce(PER_PARTITION)
    lines = [f"GET /item/{p}-{n} 200 ✓" for n in range(PER_PARTITION) for p in range(2)]
    logs.produce_messages([Message(i % 2, gzip.compress(line.encode())) for i, line in enumerate(lines)])
    logs.produce_messages([Message(0, b"not gzip")])  # a dead letter of the route's format

    daemon = daemon_factory(setup_for(config, events, lake / events.name), "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-4000:]

    assert sorted(r["id"] for r in rows(lake / events.name, ["id"])) == sorted(produced)
    assert sorted(r["line"] for r in rows(lake / "logs", ["line"])) == sorted(lines)
    letters = rows(lake / "_dead_letters")
    assert [(r["topic"], r["partition"], r["offset"], r["stage"]) for r in letters] == [
        (logs.name, 0, PER_PARTITION, "deserialize")
    ]
    code, report = setup_for(config, events, lake / events.name).verify()
    by_topic = _verified(code, report, {events.name, logs.name})
    assert (by_topic[logs.name]["rows"], by_topic[logs.name]["dead_letters"]) == (2 * PER_PARTITION, 1)


def test_a_single_topic_table_keeps_its_offsets_when_a_second_topic_joins(
    tmp_path: Path, kafka_bootstrap: str, topic_factory: Callable[[int], Topic], daemon_factory: Callable[..., Daemon]
) -> None:
    """The fixture was written by the release before multi-topic subscriptions (see its README) with
    ``kafka.topic = LEGACY_TOPIC`` and ``table.app_id = "shop"``: txns ``shop-<p>`` = 23. Now the config names two
    topics writing that table."""
    create_topics(kafka_bootstrap, [LEGACY_TOPIC], LEGACY_PARTITIONS)
    legacy = Topic(LEGACY_TOPIC, LEGACY_PARTITIONS, kafka_bootstrap)
    written = sum(count for _, count in LEGACY_ROUNDS)  # 24 per partition: offsets 0..23, in the fixture
    later_bad = {(1, 30)}

    def later_payload(partition: int, seq: int) -> bytes:
        return BROKEN if (partition, seq) in later_bad else event(partition, seq)

    legacy.produce(written, payload=legacy_payload)  # the fixture's messages, at the fixture's offsets
    legacy.produce(16, start=written, payload=later_payload)
    joining = topic_factory(2)
    joining_ids = joining.produce(20)

    lake = tmp_path / "lake"
    for name in (LEGACY_TABLE, f"{LEGACY_TABLE}_dead_letters"):
        shutil.copytree(LEGACY_FIXTURE / name, lake / name)
    uri = lake / LEGACY_TABLE
    assert txn_versions(uri, ["shop-0", "shop-1"]) == {"shop-0": written - 1, "shop-1": written - 1}

    config = write_config(
        tmp_path / "config.toml",
        kafka_bootstrap,
        {"topics": [LEGACY_TOPIC, joining.name]},
        {"uri": str(uri), "app_id": LEGACY_APP_ID},
    )
    setup = setup_for(config, legacy, uri)
    daemon = daemon_factory(setup, "--until-caught-up")
    assert daemon.wait(180) == 0, daemon.log()[-4000:]
    log = daemon.log()
    for p in range(LEGACY_PARTITIONS):
        assert _log_line(
            log,
            rf"assigned {LEGACY_TOPIC}\[{p}\] .*starting at {written} \(table txn version {written - 1}\)",
        ), log[-4000:]
        assert _log_line(log, rf"assigned {joining.name}\[{p}\] .*starting at earliest"), log[-4000:]

    # No duplicate, no gap: the legacy topic's rows at their offsets, the joining topic's rows.
    found = rows(uri, ["kafka_topic", "kafka_partition", "kafka_offset", "id"])
    legacy_bad = LEGACY_BAD | later_bad
    expected = Counter((LEGACY_TOPIC, i) for i in expected_ids(LEGACY_PARTITIONS, range(written + 16), legacy_bad))
    expected.update((joining.name, i) for i in joining_ids)
    assert Counter((r["kafka_topic"], r["id"]) for r in found) == expected
    assert sorted((r["kafka_partition"], r["kafka_offset"]) for r in found if r["kafka_topic"] == LEGACY_TOPIC) == [
        (p, seq) for p in range(LEGACY_PARTITIONS) for seq in range(written + 16) if (p, seq) not in legacy_bad
    ]
    last = written + 16 - 1
    assert txn_versions(uri, [f"shop-{LEGACY_TOPIC}-0", f"shop-{LEGACY_TOPIC}-1"]) == {
        f"shop-{LEGACY_TOPIC}-0": last,
        f"shop-{LEGACY_TOPIC}-1": last,
    }
    assert txn_versions(uri, [f"shop-{joining.name}-0", f"shop-{joining.name}-1"]) == {
        f"shop-{joining.name}-0": 19,
        f"shop-{joining.name}-1": 19,
    }
    # The legacy ids are left as the release wrote them.
    assert txn_versions(uri, ["shop-0", "shop-1"]) == {"shop-0": written - 1, "shop-1": written - 1}

    letters = rows(lake / f"{LEGACY_TABLE}_dead_letters")
    assert sorted((r["topic"], r["partition"], r["offset"]) for r in letters) == [
        (LEGACY_TOPIC, 0, 5),
        (LEGACY_TOPIC, 1, 30),
    ]
    dead_letter_txns = txn_versions(lake / f"{LEGACY_TABLE}_dead_letters", [f"shop-{LEGACY_TOPIC}-dlq-1"])
    assert (dead_letter_txns[f"shop-{LEGACY_TOPIC}-dlq-1"] or -1) >= 30

    code, report = setup.verify()
    by_topic = _verified(code, report, {LEGACY_TOPIC, joining.name})
    assert (by_topic[LEGACY_TOPIC]["rows"], by_topic[LEGACY_TOPIC]["dead_letters"]) == (2 * (written + 16) - 2, 2)


TOPICS = 200
MESSAGES = 5


def test_two_hundred_topics_one_daemon(
    tmp_path: Path, kafka_bootstrap: str, record_property: Callable[[str, object], None]
) -> None:
    """200 one-partition topics, a table each, one daemon: every table holds its rows. The daemon's peak RSS
    (its own ``ru_maxrss``) and wall time are printed and recorded (``record_property``), not asserted on."""
    prefix = f"many{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i:03d}" for i in range(TOPICS)]
    started = time.monotonic()
    create_topics(kafka_bootstrap, names, 1, timeout=90)
    created_s = time.monotonic() - started
    produce(kafka_bootstrap, ((name, 0, event(0, seq)) for name in names for seq in range(MESSAGES)))
    lake = tmp_path / "lake"
    config = write_config(tmp_path / "config.toml", kafka_bootstrap, {"topics": names}, {"uri": f"{lake}/{{topic}}"})

    measured = run_measured(
        [sys.executable, "-m", "kafka2delta", "ingest", "-c", str(config), "--until-caught-up"],
        tmp_path / "daemon.log",
        timeout=240,
    )
    log = (tmp_path / "daemon.log").read_text(errors="replace")
    assert measured.exit_code == 0, log[-4000:]

    want = sorted(expected_ids(1, range(MESSAGES)))
    wrong = {name: ids(lake / name) for name in names if sorted(ids(lake / name)) != want}
    assert wrong == {}, dict(list(wrong.items())[:5])
    versions = {name: txn_versions(lake / name, [f"{name}-0"])[f"{name}-0"] for name in names}
    assert set(versions.values()) == {MESSAGES - 1}

    rss_mib = measured.max_rss_kib / 1024
    print(
        f"{TOPICS} topics x {MESSAGES} messages: daemon wall {measured.wall_s:.1f} s, peak RSS {rss_mib:.0f} MiB "
        f"(topics created in {created_s:.1f} s)"
    )
    record_property("daemon_wall_s", round(measured.wall_s, 1))
    record_property("daemon_peak_rss_mib", round(rss_mib))
    assert rss_mib < 1536, f"peak RSS {rss_mib:.0f} MiB"
