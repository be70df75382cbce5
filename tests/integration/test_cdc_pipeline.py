"""The change-data-capture pipeline the CDC tests stand on: a row written in PostgreSQL reaches its Kafka topic
as a Debezium change event (PostgreSQL → pgoutput → Debezium in Kafka Connect → the broker)."""

from __future__ import annotations

import json
import time
import uuid

from confluent_kafka import Consumer

from dev.connect.connect import ConnectClient, debezium_postgres_config
from dev.postgres.postgres import Database


def test_an_inserted_row_arrives_as_a_debezium_event(
    postgres: Database, kafka_connect: ConnectClient, kafka_bootstrap: str
) -> None:
    name = f"cdc_{uuid.uuid4().hex[:8]}"
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, amount numeric(10,2), note text)")
        conn.execute(f"INSERT INTO {name} VALUES (1, 1.50, 'snapshot')")
    config = debezium_postgres_config(postgres, topic_prefix=name, tables=[f"public.{name}"], converter="json-plain")
    kafka_connect.add_connector(name, config)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": name,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    try:
        with postgres.connect() as conn:
            conn.execute(f"INSERT INTO {name} VALUES (2, 2.25, 'streamed ✓')")
        consumer.subscribe([f"{name}.public.{name}"])
        events: dict[int, dict] = {}
        deadline = time.monotonic() + 30
        while 2 not in events and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            key, value = msg.key(), msg.value()
            assert key is not None and value is not None  # no deletes here, so no tombstones
            event = json.loads(value)
            events[event["after"]["id"]] = event
            assert json.loads(key) == {"id": event["after"]["id"]}
        assert sorted(events) == [1, 2], f"events after 30 s: {events}"
        assert events[1]["op"] == "r"  # the snapshot of the row there before the connector
        streamed = events[2]
        assert streamed["op"] == "c"
        assert streamed["before"] is None
        assert streamed["after"]["note"] == "streamed ✓"
        assert streamed["after"]["amount"] == "AOE="  # Decimal(scale 2) 225 as big-endian bytes, base64
        assert streamed["source"]["table"] == name
    finally:
        consumer.close()
        kafka_connect.delete_connector(name)
        with postgres.connect() as conn:  # a slot left behind would hold WAL back
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (config["slot.name"],)
                ).fetchone()
                if row is None:
                    break
                if not row[0]:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (config["slot.name"],))
                    break
                time.sleep(0.2)
