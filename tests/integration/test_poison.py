"""A poison mix: 10,000 messages, 1% of each kind of bad input, and a SIGKILL between the dead-letter
commit and the main commit. Exactly the good messages land in the table, exactly the bad ones in the
dead-letter table with the right stage and reason, and no offset is in both."""

import json
import random

from tests.support.harness import Message

SCHEMA = {
    "id": "string not null",
    "seq": "long",
    "small": "byte",
    "ts": "timestamp",
    "day": "date",
    "amount": "decimal(10,2)",
    "offset": "long",
    "user": "struct<id:long,country:string>",
}
TRANSFORMS = {"day": "substr(ts, `0`, `10`)", "offset": "kafka.offset"}

# kind → (payload for message number n, stage, a piece of the reason)
BAD_KINDS = {
    "invalid_json": (lambda n: b'{"id": "x%d",' % n, "deserialize", ""),
    "not_an_object": (lambda n: b"[1, 2, 3]", "deserialize", "not an object"),
    "invalid_utf8": (lambda n: b'{"id": "\xff\xfe"}', "deserialize", "UTF-8"),
    "missing_required": (lambda n: b'{"seq": %d, "ts": "2026-11-22T10:00:00Z"}' % n, "coerce", "'id' is required"),
    "out_of_range": (
        lambda n: b'{"id": "r%d", "small": 300, "ts": "2026-11-22T10:00:00Z"}' % n,
        "coerce",
        "'small'",
    ),
    "bad_timestamp": (lambda n: b'{"id": "t%d", "ts": "yesterday"}' % n, "coerce", "yesterday"),
    "transform_fails": (lambda n: b'{"id": "f%d", "ts": 12345}' % n, "transform", "day"),
    "bad_decimal": (
        lambda n: b'{"id": "d%d", "amount": 1.255, "ts": "2026-11-22T10:00:00Z"}' % n,
        "coerce",
        "'amount'",
    ),
}


def good(n: int) -> bytes:
    return json.dumps(
        {
            "id": f"g{n}",
            "seq": n,
            "small": n % 100,
            "ts": f"2026-11-{1 + n % 28:02d}T10:00:00.{n % 1000:03d}Z",
            "amount": f"{n % 1000}.{n % 100:02d}",
            "user": {"id": n, "country": "FR"},
            "extra": "dropped",
        }
    ).encode()


def test_poison_mix_with_a_crash_between_the_two_commits(setup_factory, daemon_factory) -> None:
    setup = setup_factory(
        2, schema=SCHEMA, sections={"transforms": TRANSFORMS}, max_messages_per_file=700, allowed_latency_s=0.5
    )
    rng = random.Random(7)
    kinds = [kind for kind in BAD_KINDS for _ in range(100)] + ["good"] * (10_000 - 100 * len(BAD_KINDS))
    rng.shuffle(kinds)
    messages, expected_kind = [], {}
    next_offset = [0, 0]
    for n, kind in enumerate(kinds):
        partition = n % 2
        value = good(n) if kind == "good" else BAD_KINDS[kind][0](n)
        messages.append(Message(partition, value))
        expected_kind[(partition, next_offset[partition])] = (kind, n)
        next_offset[partition] += 1
    setup.topic.produce_messages(messages)

    crashed = daemon_factory(setup, "--until-caught-up", env={"K2D_FAULT_INJECT": "after_dead_letter_commit:3"})
    assert crashed.wait(180) == -9, crashed.log()[-3000:]
    assert "fault injection: SIGKILL at after_dead_letter_commit" in crashed.log()
    main_before = setup.txn_versions()
    letters_before = setup.dead_letter_txn_versions()
    assert any((letters_before[p] or -1) > (main_before[p] or -1) for p in range(2)), (
        "the crash must leave dead letters recorded ahead of the main table"
    )

    restarted = daemon_factory(setup, "--until-caught-up")
    assert restarted.wait(180) == 0, restarted.log()[-3000:]
    assert "dead letters recorded before a crash are final" in restarted.log()

    rows = setup.rows()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate rows"
    good_expected = {f"g{n}" for (kind, n) in expected_kind.values() if kind == "good"}
    assert {r["id"] for r in rows} == good_expected and len(rows) == len(good_expected)

    letters = setup.dead_letters()
    keys = [(r["partition"], r["offset"]) for r in letters]
    assert len(keys) == len(set(keys)), "duplicate dead letters"
    bad_expected = {key: kind for key, (kind, _) in expected_kind.items() if kind != "good"}
    assert set(keys) == set(bad_expected)
    for letter in letters:
        kind = bad_expected[(letter["partition"], letter["offset"])]
        _, stage, reason = BAD_KINDS[kind]
        assert letter["stage"] == stage, (kind, letter)
        assert reason in letter["error"], (kind, letter["error"])

    # Every row knows its offset (a transform), and no offset is both a row and a dead letter.
    row_offsets = {(int(r["id"][1:]) % 2, r["offset"]) for r in rows}
    assert not row_offsets & set(keys)
    assert setup.txn_versions() == {0: 4999, 1: 4999}
