"""The schema-registry edge: fetch writer schemas by id over the Confluent REST API.

Only this module talks HTTP to the registry (standard library ``urllib.request``: two GET endpoints
need no client library). Errors are translated here, once:

* HTTP 404 with a Confluent "not found" error code (40401 subject, 40402 version, 40403 schema) →
  :class:`MessageError` (stage ``deserialize``): the message names a schema the registry does not
  have, so it is a dead letter. The answer is remembered for :data:`NEGATIVE_TTL_S` seconds so a
  burst of messages with an unknown id costs one request.
* A 404 *without* such an error code means the URL does not point at a Confluent API at all (a
  typo, Apicurio without ``/apis/ccompat/v7``): :class:`FatalError`, because turning every message
  into a dead letter would be the wrong answer to a configuration mistake.
* Connection refused, timeout, HTTP 5xx and 429 → :class:`RetryableError` (the daemon backs off and
  retries; offsets do not advance).
* HTTP 401/403 → :class:`FatalError` naming ``schema_registry.username``; other 4xx and an answer
  that is not a Confluent schema document → :class:`FatalError` naming ``schema_registry.url``.
* A URL urllib cannot read (a port that is not a number from 0 to 65535, an unclosed IPv6 bracket) →
  :class:`ConfigError` naming ``schema_registry.url``, when the client is built.

Schemas are cached by id (LRU, ``cache_size`` entries, never expiring: an id never changes meaning).
The password never appears in a message: errors name the URL without user info.
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, cast

from kafka2delta.config import SchemaRegistryConfig
from kafka2delta.errors import ConfigError, FatalError, MessageError, RetryableError

NEGATIVE_TTL_S = 60.0
"""How long "this id is not in the registry" is believed before asking again (it may be registered
later, e.g. a producer racing its own registration)."""
_NOT_FOUND_CODES = frozenset({40401, 40402, 40403})
_SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]


class SchemaReference(NamedTuple):
    """An import of a schema: ``name`` as the schema text refers to it, and where it is registered."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    id: int
    """The global schema id (0 when fetched by subject/version and the registry did not say)."""
    schema_type: SchemaType
    schema: str
    """The schema text: Avro JSON, .proto source, or JSON Schema."""
    references: tuple[SchemaReference, ...] = field(default_factory=tuple)


class SchemaRegistry:
    """A small caching client of the Confluent schema-registry REST API (read-only)."""

    def __init__(self, config: SchemaRegistryConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        try:
            parts = urllib.parse.urlsplit(config.url)
        except ValueError as exc:  # an unclosed IPv6 bracket; the text names no part of the URL
            raise ConfigError("schema_registry.url", f"not a URL: {exc}") from exc
        username, password = config.username, config.password
        if parts.username is not None and not username:
            # Credentials in the URL (http://user:pass@host) work too, but never show in messages.
            username = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
        netloc = parts.netloc.rsplit("@", 1)[-1]  # host[:port] as written: an IPv6 address keeps its brackets
        try:
            _ = parts.port  # urllib checks the port when it is read
        except ValueError as exc:
            raise ConfigError("schema_registry.url", f"bad port in {netloc!r}: {exc}") from exc
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        """The base URL without user info: safe to print."""
        self._username = username
        self._timeout = config.timeout_s
        self._cache_size = config.cache_size
        self._clock = clock
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if username:
            token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._by_id: OrderedDict[int, RegisteredSchema] = OrderedDict()
        self._by_version: OrderedDict[tuple[str, int], RegisteredSchema] = OrderedDict()
        self._missing: OrderedDict[object, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0
        """HTTP requests sent so far (for tests and metrics)."""

    # --- public API --------------------------------------------------------------------------

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under ``schema_id``; MessageError if the registry does not have it."""
        with self._lock:
            cached = self._by_id.get(schema_id)
            if cached is not None:
                self._by_id.move_to_end(schema_id)
                return cached
            self._raise_if_known_missing(schema_id)
        answer = self._get(f"/schemas/ids/{schema_id}", schema_id, f"schema id {schema_id} is not in the registry")
        found = self._parse(answer, schema_id, f"schema id {schema_id}")
        with self._lock:
            self._remember(self._by_id, schema_id, found)
        return found

    def referenced(self, subject: str, version: int) -> RegisteredSchema:
        """The schema a reference points at (a protobuf import, an Avro named type)."""
        key = (subject, version)
        # "latest" (-1) moves; only concrete versions are cached.
        cacheable = version > 0
        with self._lock:
            cached = self._by_version.get(key) if cacheable else None
            if cached is not None:
                self._by_version.move_to_end(key)
                return cached
            self._raise_if_known_missing(key)
        quoted = urllib.parse.quote(subject, safe="")
        what = f"subject {subject!r} version {version}"
        answer = self._get(f"/subjects/{quoted}/versions/{version}", key, f"{what} is not in the registry")
        found = self._parse(answer, int(answer.get("id", 0) or 0), what)
        if cacheable:
            with self._lock:
                self._remember(self._by_version, key, found)
        return found

    # --- internals ---------------------------------------------------------------------------

    def _raise_if_known_missing(self, key: object) -> None:
        entry = self._missing.get(key)
        if entry is None:
            return
        expires, reason = entry
        if self._clock() < expires:
            raise MessageError("deserialize", reason)
        del self._missing[key]

    def _remember(self, cache: OrderedDict[Any, RegisteredSchema], key: Any, value: RegisteredSchema) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self._cache_size:
            cache.popitem(last=False)

    def _get(self, path: str, key: object, missing: str) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, headers=self._headers)
        self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                raise self._translate(exc, path, key, missing) from exc
        except urllib.error.URLError as exc:
            raise RetryableError(f"schema registry {self.url} is unreachable: {exc.reason}") from exc
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            # A read timeout, a reset connection, a truncated answer: the registry may be back soon.
            raise RetryableError(f"schema registry {self.url} did not answer GET {path}: {exc!r}") from exc
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise FatalError(
                f"schema_registry.url: GET {self.url}{path} did not answer JSON; is this a Confluent schema registry?"
            ) from exc
        if not isinstance(answer, dict):
            raise FatalError(
                f"schema_registry.url: GET {self.url}{path} answered {type(answer).__name__}, not an object"
            )
        return cast(dict[str, Any], answer)

    def _translate(self, exc: urllib.error.HTTPError, path: str, key: object, missing: str) -> Exception:
        status = exc.code
        where = f"schema registry {self.url}"
        if status in (401, 403):
            if self._username:
                return FatalError(
                    f"schema_registry.username: {where} refused the credentials of user {self._username!r} "
                    f"(HTTP {status})"
                )
            return FatalError(
                f"schema_registry.username: {where} requires authentication (HTTP {status}); "
                "set schema_registry.username and schema_registry.password"
            )
        if status == 429 or status >= 500:
            return RetryableError(f"{where} answered HTTP {status} to GET {path}")
        code, message = _error_body(exc)
        if status == 404 and code in _NOT_FOUND_CODES:
            with self._lock:
                self._missing[key] = (self._clock() + NEGATIVE_TTL_S, missing)
                self._missing.move_to_end(key)
                while len(self._missing) > self._cache_size:
                    self._missing.popitem(last=False)
            return MessageError("deserialize", missing)
        detail = f"error_code {code}: {message}" if code is not None else "not a Confluent registry error"
        return FatalError(f"schema_registry.url: GET {self.url}{path} answered HTTP {status} ({detail})")

    def _parse(self, answer: dict[str, Any], schema_id: int, what: str) -> RegisteredSchema:
        text = answer.get("schema")
        schema_type = answer.get("schemaType") or "AVRO"  # Confluent omits it for Avro
        references = answer.get("references") or []
        if not isinstance(text, str) or schema_type not in _SCHEMA_TYPES or not isinstance(references, list):
            raise FatalError(f"schema_registry.url: {self.url} answered something that is not a schema for {what}")
        try:
            refs = tuple(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in references)
        except (KeyError, TypeError, ValueError) as exc:
            raise FatalError(f"schema_registry.url: {self.url} answered malformed references for {what}") from exc
        return RegisteredSchema(schema_id, cast(SchemaType, schema_type), text, refs)


def _error_body(exc: urllib.error.HTTPError) -> tuple[int | None, str]:
    """The Confluent error body ``{"error_code": 40403, "message": "..."}``, if that is what it is."""
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError, http.client.HTTPException):
        return None, ""
    if not isinstance(body, dict):
        return None, ""
    code = body.get("error_code")
    return (code if isinstance(code, int) else None), str(body.get("message", ""))[:200]
