"""The AWS Glue Schema Registry edge: fetch writer schemas by schema version id through boto3.

Only this module talks to Glue (``glue.get_schema_version(SchemaVersionId=…)``, one read-only call). boto3 is
an optional dependency (``pip install 'kafka2delta[glue]'``): without it, building a :class:`GlueRegistry` is a
:class:`ConfigError` naming ``schema_registry.type``. Credentials come from the usual AWS chain (environment,
shared profile, container or instance role); the region from ``schema_registry.region`` or that chain.

Errors are translated here, once, as :mod:`kafka2delta.registry` does for the Confluent API:

* ``EntityNotFoundException`` → :class:`MessageError` (stage ``deserialize``): the message names a schema
  version the registry does not have, so it is a dead letter. The answer is remembered for
  :data:`NEGATIVE_TTL_S` seconds so a burst of messages naming an unknown version costs one request.
* Connection refused, timeouts, a dropped connection, throttling and HTTP 5xx (``InternalServiceException``
  …) → :class:`RetryableError` (the daemon backs off and retries; offsets do not advance). botocore's own
  retries are off: the daemon's backoff is the one retry policy.
* No credentials found, or the credential provider not answering (instance metadata, a Pod Identity agent
  still starting) → :class:`RetryableError`, with a new client at the next attempt: they may come, and the
  retry budget (``ingest.max_commit_retries``) bounds the wait, after which the daemon stops.
* Refused credentials (``AccessDeniedException``, ``UnrecognizedClientException``, an expired token) →
  :class:`FatalError`; any other Glue error → :class:`FatalError` naming ``schema_registry.type`` with Glue's
  error code. ``InvalidInputException`` among them: the id sent is always a well-formed UUID (any 16 bytes of
  a message's header are one), so Glue refusing the request is not one message's fault, and a dead letter
  per message would empty the topic into the dead letters over a problem of the setup.
* Building the client: no region, or one botocore refuses (``eu west 1``) → :class:`ConfigError` naming
  ``schema_registry.region``; an endpoint it refuses → ``schema_registry.endpoint_url``.

Schemas are cached by version id (LRU, ``cache_size`` entries, never expiring: a schema version never
changes its definition).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

from kafka2delta.config import SchemaRegistryConfig, without_credentials
from kafka2delta.errors import ConfigError, FatalError, MessageError, RetryableError
from kafka2delta.registry import NEGATIVE_TTL_S, RegisteredSchema, SchemaType

_SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
_NOT_FOUND_CODE = "EntityNotFoundException"
_THROTTLING_CODES = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalServiceException",
        "InternalFailure",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
_CREDENTIAL_CODES = frozenset(
    {
        "AccessDeniedException",
        "AccessDenied",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "MissingAuthenticationToken",
    }
)


class GlueRegistry:
    """A small caching reader of the AWS Glue Schema Registry (``GetSchemaVersion`` by version id).

    ``client`` is a boto3 Glue client to use instead of building one from ``config`` (tests stub it).
    """

    def __init__(
        self,
        config: SchemaRegistryConfig,
        *,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            import botocore.exceptions
        except ImportError as exc:
            raise ConfigError("schema_registry.type", "'glue' needs boto3: pip install 'kafka2delta[glue]'") from exc
        self._botocore = botocore.exceptions
        self._config = config
        self._own_client = client is None
        self._client = client
        if self._own_client:
            try:
                self._client = _glue_client(config)  # a bad region or endpoint is a config error at start
            except RetryableError:
                self._client = None  # credentials not fetchable yet (a Pod Identity agent starting): at first use
        endpoint = without_credentials(config.endpoint_url) if config.endpoint_url else ""
        self.where = f"Glue schema registry at {endpoint}" if endpoint else "Glue schema registry"
        """How errors and logs name the registry."""
        self._cache_size = config.cache_size
        self._clock = clock
        self._by_version: OrderedDict[uuid.UUID, RegisteredSchema] = OrderedDict()
        self._missing: OrderedDict[uuid.UUID, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0
        """GetSchemaVersion calls made so far (for tests and metrics)."""

    def schema_version(self, version_id: uuid.UUID) -> RegisteredSchema:
        """The schema version ``version_id``; MessageError if the registry does not have it."""
        with self._lock:
            cached = self._by_version.get(version_id)
            if cached is not None:
                self._by_version.move_to_end(version_id)
                return cached
            missing = self._missing.get(version_id)
            if missing is not None:
                expires, reason = missing
                if self._clock() < expires:
                    raise MessageError("deserialize", reason)
                del self._missing[version_id]
        self.requests += 1
        try:
            if self._client is None:
                self._client = _glue_client(self._config)
            answer = self._client.get_schema_version(SchemaVersionId=str(version_id))
        except self._botocore.ClientError as exc:
            raise self._translate(exc, version_id) from exc
        except (self._botocore.ConnectionError, self._botocore.HTTPClientError) as exc:
            # Refused, a connect or read timeout, a dropped connection: the registry may be back soon.
            raise RetryableError(f"{self.where} is unreachable: {exc}") from exc
        except (self._botocore.NoCredentialsError, self._botocore.PartialCredentialsError) as exc:
            # Often an instance-metadata or Pod Identity blip when the client was made: it holds no credentials
            # for good, so the next attempt makes a new one. The retry budget bounds the wait.
            if self._own_client:
                self._client = None
            raise RetryableError(f"{self.where}: no AWS credentials found ({exc})") from exc
        except self._botocore.CredentialRetrievalError as exc:
            raise RetryableError(f"{self.where}: AWS credentials could not be fetched: {exc}") from exc
        except self._botocore.BotoCoreError as exc:
            raise FatalError(f"schema_registry.type: GetSchemaVersion on the {self.where} failed: {exc!r}") from exc
        found = self._parse(cast(dict[str, Any], answer), version_id)
        with self._lock:
            self._by_version[version_id] = found
            self._by_version.move_to_end(version_id)
            while len(self._by_version) > self._cache_size:
                self._by_version.popitem(last=False)
        return found

    def _translate(self, exc: Any, version_id: uuid.UUID) -> Exception:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", ""))[:200]
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == _NOT_FOUND_CODE:
            reason = f"schema version {version_id} is not in the Glue schema registry"
            with self._lock:
                self._missing[version_id] = (self._clock() + NEGATIVE_TTL_S, reason)
                self._missing.move_to_end(version_id)
                while len(self._missing) > self._cache_size:
                    self._missing.popitem(last=False)
            return MessageError("deserialize", reason)
        if code in _THROTTLING_CODES or status == 429 or status >= 500:
            return RetryableError(f"{self.where} answered {code or 'an error'} (HTTP {status}) to GetSchemaVersion")
        if code in _CREDENTIAL_CODES or status in (401, 403):
            return FatalError(
                f"schema_registry.type: the {self.where} refused the AWS credentials ({code}: {message}); "
                "they need glue:GetSchemaVersion"
            )
        # InvalidInputException among them: the id we send is a well-formed UUID, so a refusal is not the
        # message's fault and must not dead-letter every message.
        return FatalError(f"schema_registry.type: the {self.where} answered {code} (HTTP {status}): {message}")

    def _parse(self, answer: dict[str, Any], version_id: uuid.UUID) -> RegisteredSchema:
        text = answer.get("SchemaDefinition")
        schema_type = answer.get("DataFormat")
        number = answer.get("VersionNumber", 0)
        if not {"SchemaDefinition", "DataFormat", "VersionNumber"} & answer.keys():
            # botocore returns what it parsed of a body cut short (a dropped connection): only ResponseMetadata
            # (found by review). The Confluent edge retries a truncated answer too.
            raise RetryableError(f"{self.where} answered GetSchemaVersion for {version_id} with no schema (cut short?)")
        if not isinstance(text, str) or schema_type not in _SCHEMA_TYPES or not isinstance(number, int):
            raise FatalError(
                f"schema_registry.type: the {self.where} answered something that is not a schema "
                f"for schema version {version_id}"
            )
        return RegisteredSchema(number, cast(SchemaType, schema_type), text)


_SESSION: Any = None
"""One boto3 session for the process: the Glue service model is loaded once, however many pipelines are built."""
_SESSION_LOCK = threading.Lock()


def _glue_client(config: SchemaRegistryConfig) -> Any:
    """A boto3 Glue client for ``config``. botocore resolves the credentials here (instance metadata, a
    container credentials endpoint …): that failing is a RetryableError, a bad region or endpoint a ConfigError
    naming it."""
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError as exc:  # botocore without boto3
        raise ConfigError("schema_registry.type", "'glue' needs boto3: pip install 'kafka2delta[glue]'") from exc
    settings = botocore.config.Config(
        connect_timeout=config.timeout_s,
        read_timeout=config.timeout_s,
        retries={"total_max_attempts": 1},  # the daemon backs off and retries itself
        user_agent_extra="kafka2delta",
    )
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        session = _SESSION
    try:
        return session.client(
            "glue",
            region_name=config.region or None,
            endpoint_url=config.endpoint_url or None,
            config=settings,
        )
    except botocore.exceptions.NoRegionError as exc:
        raise ConfigError(
            "schema_registry.region", "no AWS region: set it here or in the environment (AWS_REGION)"
        ) from exc
    except botocore.exceptions.InvalidRegionError as exc:  # a ValueError too: before the endpoint's clause
        raise ConfigError("schema_registry.region", f"boto3 refused the region: {exc}") from exc
    except (botocore.exceptions.CredentialRetrievalError, botocore.exceptions.ConnectionError) as exc:
        raise RetryableError(f"AWS credentials for the Glue schema registry could not be fetched: {exc}") from exc
    except (ValueError, botocore.exceptions.BotoCoreError) as exc:
        raise ConfigError("schema_registry.endpoint_url", f"boto3 refused the Glue client: {exc}") from exc
