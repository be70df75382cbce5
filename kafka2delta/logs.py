"""Logging setup for the entry point: plain or JSON lines on stderr, secrets never written.

``logging.format = "plain"``: ``2026-11-22 10:00:00,123 WARNING kafka2delta.committer: dead letter t[0]@17 …``.

``logging.format = "json"``: one object per line with ``time`` (RFC 3339, UTC, milliseconds), ``level``,
``logger``, ``message``, and ``exception`` when there is one. A line about one message (its text says
``topic[partition]@offset``, the rule for every such line) also gets ``topic``, ``partition`` and
``offset`` fields; a line about one partition (``topic[partition]``) gets ``topic`` and ``partition``.
Callers may pass them explicitly too (``extra={"topic": …, "partition": …, "offset": …}``).

Redaction: every configured secret value (and its escaped forms: repr, JSON, URL-quoted) is replaced by
``***`` in the message, its arguments, the exception text and stack, and in every JSON field, before
the line is written. A secret that is an Azure SAS token (``sv=…&sig=…``) is also masked value by value, each
as configured and percent-decoded (and so URL-quoted): object_store decodes the token, splits it and sends
each value re-encoded, so a request URI in its errors carries the values in another form and order than the
configured string (the documented public fields, such as ``sv`` or ``spr=https``, stay: masking them would mask
ordinary text). The status page and probes use the same :class:`Redactor` (:mod:`kafka2delta.status`). Only
the entry point calls :func:`setup_logging`; modules use ``logging.getLogger(__name__)``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any, Literal, TextIO
from urllib.parse import quote, unquote

MASK = "***"
_MIN_SECRET_LENGTH = 3  # shorter values would mask ordinary text
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Kafka topic names are [a-zA-Z0-9._-]; a range (t[0]@5..9) is about many messages, not one.
_WHERE = re.compile(r"(?<![\w.-])([A-Za-z0-9._-]+)\[(\d+)\](?:@(\d+)(?![\d.]))?")
_MESSAGE_FIELDS = ("topic", "partition", "offset")


# A SAS token's parameters that are not secret (version, services, resource types, permissions, times, IP range,
# protocol …): values such as "https", "sco" or a date would mask ordinary text. The signature and any other
# parameter are masked.
_SAS_PUBLIC_FIELDS = frozenset(
    {"sv", "ss", "srt", "sp", "se", "st", "sip", "spr", "sr", "sdd", "skt", "ske", "sks", "skv"}
    | {"rscc", "rscd", "rsce", "rscl", "rsct"}
)
_QUERY_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class Redactor:
    """Replaces secret values (and the forms they take once escaped) in text."""

    def __init__(self, secrets: Sequence[str]) -> None:
        forms: set[str] = set()
        for value in (part for secret in secrets for part in (secret, *sas_values(secret))):
            if len(value) < _MIN_SECRET_LENGTH:
                continue
            forms.update({value, repr(value)[1:-1], json.dumps(value)[1:-1], quote(value, safe="")})
        # Longest first: a secret containing another is replaced whole.
        self._forms = sorted((f for f in forms if len(f) >= _MIN_SECRET_LENGTH), key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._forms)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return text


def sas_values(secret: str) -> set[str]:
    """The values of a secret that is an Azure SAS token (``[?]sv=…&sig=…``: only ``key=value`` parameters, one
    of them ``sig``), each as configured and percent-decoded, its public parameters left out; nothing for any
    other secret. The token is read as configured and, as object_store reads it, percent-decoded whole."""
    values: set[str] = set()
    for text in dict.fromkeys((secret, unquote(secret))):
        parts = [part.strip() for part in text.strip().lstrip("?").split("&") if part.strip()]
        pairs = [part.split("=", 1) for part in parts]
        if any(len(pair) != 2 or not _QUERY_KEY.fullmatch(pair[0]) for pair in pairs):
            continue
        if "sig" not in {key.lower() for key, _ in pairs}:
            continue
        for key, value in pairs:
            if key.lower() not in _SAS_PUBLIC_FIELDS:
                values.update({value, unquote(value)})
    return values


class RedactSecrets(logging.Filter):
    """Masks secrets in a record before any formatter sees it: message with its arguments, exception
    text and stack. (The formatters below mask their output again, for records that skip filters.)"""

    def __init__(self, secrets: Sequence[str] | Redactor) -> None:
        super().__init__()
        self._redact = secrets if isinstance(secrets, Redactor) else Redactor(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._redact:
            return True
        record.msg, record.args = self._redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = self._redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self._redact(record.stack_info)
        for name in _MESSAGE_FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, self._redact(value))
        return True


class PlainFormatter(logging.Formatter):
    def __init__(self, redact: Redactor) -> None:
        super().__init__(PLAIN_FORMAT)
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self._redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module docstring)."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        message = self._redact(record.getMessage())
        when = dt.datetime.fromtimestamp(record.created, dt.UTC)
        line: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        line.update(_message_fields(record, message))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = self._redact(record.exc_text)
        if record.stack_info:
            line["stack"] = self._redact(self.formatStack(record.stack_info))
        for key, value in line.items():
            if isinstance(value, str):
                line[key] = self._redact(value)
        return json.dumps(line, ensure_ascii=False, default=str)


def _message_fields(record: logging.LogRecord, message: str) -> dict[str, Any]:
    """``topic``/``partition``/``offset`` from the record's extras, else from the one ``topic[p]@offset``
    its text names (several different ones: the line is about many messages, no fields)."""
    explicit = {name: getattr(record, name) for name in _MESSAGE_FIELDS if getattr(record, name, None) is not None}
    if explicit:
        return explicit
    found = {(m.group(1), m.group(2), m.group(3)) for m in _WHERE.finditer(message)}
    if len(found) != 1:
        return {}
    topic, partition, offset = found.pop()
    fields: dict[str, Any] = {"topic": topic, "partition": int(partition)}
    if offset is not None:
        fields["offset"] = int(offset)
    return fields


def setup_logging(
    level: str = "INFO",
    format: Literal["plain", "json"] = "plain",
    secrets: Sequence[str] | Redactor = (),
    stream: TextIO | None = None,
) -> logging.Handler:
    """One handler on the root logger (replacing any), writing ``format`` lines to ``stream`` (stderr), masking
    ``secrets`` (or what a :class:`Redactor` masks: the entry point's, which the status page uses too)."""
    redact = secrets if isinstance(secrets, Redactor) else Redactor(secrets)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(redact) if format == "json" else PlainFormatter(redact))
    handler.addFilter(RedactSecrets(redact))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return handler
