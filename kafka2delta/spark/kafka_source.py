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

The daemon's own consumer-group settings (``partition.assignment.strategy``, ``group.instance.id``,
``auto.offset.reset``, ``enable.auto.*`` …: Spark's source manages its group itself, and refuses some of them)
and librdkafka-only settings that share a name with a Java one but not its syntax (``ssl.cipher.suites``:
OpenSSL names) are left out. Every other setting is passed on as it is (the Java client ignores, with a
warning, the ones it does not know). A security setting that has no Java form here (Kerberos, OAUTHBEARER) is
a :class:`~kafka2delta.errors.ConfigError` naming it.

Kafka's Java client reads PEM keys in PKCS#8 only (``BEGIN PRIVATE KEY`` or ``BEGIN ENCRYPTED PRIVATE KEY``);
librdkafka also reads PKCS#1 (``BEGIN RSA PRIVATE KEY``, cert-manager's default): convert with
``openssl pkcs8 -topk8 -nocrypt -in key.pem -out key8.pem`` (README "Secured Kafka").
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


# Not passed to the Java client: the daemon's group membership and fetch queue, and names it spells otherwise.
_LEFT_OUT = frozenset(
    {
        "partition.assignment.strategy",
        "group.instance.id",
        "group.id",
        "auto.offset.reset",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
        "queued.max.messages.kbytes",
        "queued.min.messages",
        "ssl.cipher.suites",
    }
)
# Security families with no translation here: refused rather than failing inside Spark at run time.
_UNSUPPORTED_PREFIXES = ("sasl.kerberos.", "sasl.oauthbearer.")


def kafka_source_options(bootstrap_servers: str, settings: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options of Spark's Kafka source for these bootstrap servers and librdkafka settings."""
    for key in settings:
        if key.startswith(_UNSUPPORTED_PREFIXES):
            raise ConfigError(
                f"kafka.settings.{key}",
                "the Spark jobs translate SASL/SCRAM, SASL/PLAIN and TLS for Kafka's Java client, not Kerberos or "
                "OAUTHBEARER",
            )
    java = {key: value for key, value in settings.items() if key not in _TRANSLATED and key not in _LEFT_OUT}
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
    ca_location = settings.get("ssl.ca.location", "")
    if ca_location and ca_location != "probe":  # "probe": the system's CAs, which the JVM has of its own
        if ca_location.endswith("/"):
            raise ConfigError(
                "kafka.settings.ssl.ca.location",
                "Kafka's Java client (the Spark jobs) wants one PEM file of CA certificates, not a directory",
            )
        java.update({"ssl.truststore.location": ca_location, "ssl.truststore.type": "PEM"})
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
    elif settings.get("ssl.certificate.pem") or settings.get("ssl.key.pem"):
        for name in ("ssl.certificate.pem", "ssl.key.pem"):
            if not settings.get(name):
                raise ConfigError(f"kafka.settings.{name}", "is needed too: the client certificate comes with its key")
        if "BEGIN RSA PRIVATE KEY" in settings["ssl.key.pem"] or "Proc-Type:" in settings["ssl.key.pem"]:
            raise ConfigError(
                "kafka.settings.ssl.key.pem",
                "Kafka's Java client (the Spark jobs) reads PKCS#8 keys only (BEGIN PRIVATE KEY): convert it with "
                "openssl pkcs8 -topk8",
            )
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
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
