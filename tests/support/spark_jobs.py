"""Helpers of the job tests: an events schema with leads and subjects, configs with [jobs], request messages."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from kafka2delta.config import Config, load_config

SCHEMA = {
    "id": "string not null",
    "lead_id": "string",
    "contact_id": "string",
    "subject_id": "string",
    "ts": "timestamp",
}
OLD_TS = "2001-01-01T00:00:00Z"


def now_ts() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event(event_id: str, lead: str, subject: str, *, old: bool = False) -> dict[str, Any]:
    return {
        "id": event_id,
        "lead_id": lead,
        "contact_id": None,
        "subject_id": subject,
        "ts": OLD_TS if old else now_ts(),
    }


def update(lead: str, contact: str) -> bytes:
    return json.dumps({"op": "update", "match": {"lead_id": lead}, "set": {"contact_id": contact}}).encode()


def delete(lead: str) -> bytes:
    return json.dumps({"op": "delete", "match": {"lead_id": lead}}).encode()


def forget(subject: str) -> bytes:
    return json.dumps({"subject_id": subject}).encode()


def jobs_section(mutation_topic: str, ttl_topic: str, checkpoints: Path, **extra: Any) -> dict[str, Any]:
    return {
        "mutation_topic": mutation_topic,
        "ttl_topic": ttl_topic,
        "subject_column": "subject_id",
        "retention_column": "ts",
        "retention_days": 30,
        "checkpoint_dir": str(checkpoints),
        "trigger_interval_s": 0.5,
        **extra,
    }


def config(path: Path) -> Config:
    return load_config(path, {})
