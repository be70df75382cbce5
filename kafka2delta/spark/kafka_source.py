"""The options of Spark's Kafka source (``jobs mutate``, ``jobs ttl``) from ``[kafka]``.

``kafka.settings`` are librdkafka's settings (the daemon's client); Spark's Kafka source is Kafka's Java client,
which spells security differently. Translated (each one a ``kafka.``-prefixed option of the source):

==========================================  =============================================================
librdkafka (``kafka.settings``)             Java client
==========================================  =============================================================
``security.protocol``                       ``security.protocol`` (upper case)
``sasl.mechanism`` / ``sasl.mechanisms``    ``sasl.mechanism``
``sasl.username`` + ``sasl.password``       ``sasl.jaas.config``: ``ScramLoginModule`` (SCRAM-SHA-256/512)
                                            or ``PlainLoginModule`` (PLAIN) with that user and password
``ssl.ca.location``                         ``ssl.truststore.location``, ``ssl.truststore.type = PEM``
``ssl.ca.pem``                              ``ssl.truststore.certificates``, ``ssl.truststore.type = PEM``
``ssl.certificate.location`` +              ``ssl.keystore.location``, ``ssl.keystore.type = PEM``: the Java
``ssl.key.location`` (one file)             client reads key and certificate from ONE file, so both must
                                            name the same PEM file holding the key and the certificate
``ssl.certificate.pem`` + ``ssl.key.pem``   ``ssl.keystore.certificate.chain`` + ``ssl.keystore.key`` (PEM)
``ssl.key.password``                        ``ssl.key.password``
``ssl.keystore.location`` (+ ``.password``)  the same, ``ssl.keystore.type = PKCS12``
``ssl.endpoint.identification.algorithm``   the same (``none`` becomes empty: no host name check)
==========================================  =============================================================

Every other setting is passed on as it is (the Java client ignores, with a warning, the librdkafka-only ones).
A security setting that has no Java form is a :class:`~kafka2delta.errors.ConfigError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafka2delta.errors import ConfigError

_LOGIN_MODULES = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}
# librdkafka settings the translation consumes (the rest pass as they are).
_TRANSLATED = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.certificate.pem",
    "ssl.key.pem",
    "ssl.key.password",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
)


def kafka_source_options(bootstrap_servers: str, settings: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options of Spark's Kafka source for these bootstrap servers and librdkafka settings."""
    java = {key: value for key, value in settings.items() if key not in _TRANSLATED}
    java["bootstrap.servers"] = bootstrap_servers
    java.update(_sasl(settings))
    java.update(_tls(settings))
    return {f"kafka.{key}": value for key, value in java.items()}


def _sasl(settings: Mapping[str, str]) -> dict[str, str]:
    java: dict[str, str] = {}
    if settings.get("security.protocol"):
        java["security.protocol"] = settings["security.protocol"].upper()
    mechanism_key = (
        "sasl.mechanisms"
        if settings.get("sasl.mechanisms") and not settings.get("sasl.mechanism")
        else "sasl.mechanism"
    )
    mechanism = settings.get(mechanism_key, "").upper()
    if mechanism:
        java["sasl.mechanism"] = mechanism
    if "sasl.username" in settings or "sasl.password" in settings:
        module = _LOGIN_MODULES.get(mechanism)
        if module is None:
            raise ConfigError(
                f"kafka.settings.{mechanism_key}",
                f"the Spark jobs pass sasl.username/password to Kafka's Java client for {', '.join(_LOGIN_MODULES)}"
                f" only, not {mechanism or 'GSSAPI (librdkafka default)'!r}",
            )
        user, password = (
            _jaas_quoted(settings.get("sasl.username", "")),
            _jaas_quoted(settings.get("sasl.password", "")),
        )
        java["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    return java


def _tls(settings: Mapping[str, str]) -> dict[str, str]:
    java: dict[str, str] = {}
    if settings.get("enable.ssl.certificate.verification", "true").lower() == "false":
        raise ConfigError(
            "kafka.settings.enable.ssl.certificate.verification",
            "Kafka's Java client (the Spark jobs) cannot skip verifying the broker's certificate: set ssl.ca.location",
        )
    if settings.get("ssl.ca.location"):
        java.update({"ssl.truststore.location": settings["ssl.ca.location"], "ssl.truststore.type": "PEM"})
    elif settings.get("ssl.ca.pem"):
        java.update({"ssl.truststore.certificates": settings["ssl.ca.pem"], "ssl.truststore.type": "PEM"})
    certificate, key = settings.get("ssl.certificate.location"), settings.get("ssl.key.location")
    if certificate or key:
        if certificate != key:
            raise ConfigError(
                "kafka.settings.ssl.key.location",
                "Kafka's Java client (the Spark jobs) reads the client key and certificate from one PEM file: put "
                "both in one file and name it in ssl.certificate.location and ssl.key.location, or use a PKCS#12 "
                "keystore (ssl.keystore.location, ssl.keystore.password)",
            )
        java.update({"ssl.keystore.location": str(key), "ssl.keystore.type": "PEM"})
    elif settings.get("ssl.certificate.pem") and settings.get("ssl.key.pem"):
        java["ssl.keystore.certificate.chain"] = settings["ssl.certificate.pem"]
        java["ssl.keystore.key"] = settings["ssl.key.pem"]
        java["ssl.keystore.type"] = "PEM"
    elif settings.get("ssl.keystore.location"):
        java.update({"ssl.keystore.location": settings["ssl.keystore.location"], "ssl.keystore.type": "PKCS12"})
        if settings.get("ssl.keystore.password"):
            java["ssl.keystore.password"] = settings["ssl.keystore.password"]
    if settings.get("ssl.key.password"):
        java["ssl.key.password"] = settings["ssl.key.password"]
    algorithm = settings.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        java["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
    return java


def _jaas_quoted(value: str) -> str:
    """``value`` inside a JAAS double-quoted string (Kafka parses it with a StreamTokenizer: backslash escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
