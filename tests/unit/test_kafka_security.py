"""Security settings: which librdkafka errors stop the daemon naming a key (``kafka.security_failure``), and the
librdkafka settings in the Java client's words for Spark's Kafka source (``spark.kafka_source``)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from kafka2delta.errors import ConfigError, FatalError
from kafka2delta.kafka import SECURITY_GRACE_S, SecurityWatch, new_consumer, security_failure
from kafka2delta.spark.kafka_source import kafka_source_options

# What librdkafka 2.x reports to the error callback (copied from runs against dev/kafka's SecuredBroker).
WRONG_PASSWORD = (
    "sasl_ssl://127.0.0.1:38979/bootstrap: SASL authentication error: Authentication failed during authentication "
    "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 332ms in state AUTH_REQ)"
)
WRONG_MECHANISM = (
    "sasl_plaintext://127.0.0.1:46007/bootstrap: SASL SCRAM-SHA-256 mechanism handshake failed: Broker: Unsupported "
    "SASL mechanism: broker's supported mechanisms: SCRAM-SHA-512 (after 302ms in state AUTH_HANDSHAKE)"
)
UNTRUSTED_BROKER = (
    "sasl_ssl://127.0.0.1:38979/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify "
    "failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root "
    "CA certificates are installed (install ca-certificates package) (after 22ms in state SSL_HANDSHAKE)"
)
REFUSED_CLIENT = (
    "ssl://127.0.0.1:44315/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate: "
    "SSL alert number 42 (after 1ms in state APIVERSION_QUERY)"
)
SASL = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ingest"}


def failure(code: int, text: str, settings: dict[str, str]) -> str | None:
    found = security_failure(KafkaError(code, text), settings)
    return str(found) if found is not None else None


@pytest.mark.parametrize(
    ("code", "text", "settings", "expected"),
    [
        (
            KafkaError._AUTHENTICATION,
            WRONG_PASSWORD,
            SASL,
            "kafka.settings.sasl.password: authentication failed for sasl.username 'ingest'; librdkafka: sasl_ssl:",
        ),
        (
            KafkaError.SASL_AUTHENTICATION_FAILED,
            "Broker: SASL Authentication failed",
            SASL,
            "kafka.settings.sasl.password: authentication failed",
        ),
        (
            KafkaError._AUTHENTICATION,
            WRONG_MECHANISM,
            {"sasl.mechanisms": "SCRAM-SHA-256"},
            "kafka.settings.sasl.mechanisms: the broker does not offer this SASL mechanism",
        ),
        (
            KafkaError._AUTHENTICATION,
            WRONG_MECHANISM,
            SASL,
            "kafka.settings.sasl.mechanism: the broker does not offer this SASL mechanism",
        ),
        (
            KafkaError._SSL,
            UNTRUSTED_BROKER,
            {"ssl.ca.location": "/etc/ca.pem"},
            "kafka.settings.ssl.ca.location: the broker's certificate is not trusted",
        ),
        (
            KafkaError._SSL,
            UNTRUSTED_BROKER,
            {"ssl.ca.pem": "-----BEGIN CERTIFICATE-----"},
            "kafka.settings.ssl.ca.pem: the broker's certificate is not trusted",
        ),
        (
            KafkaError._SSL,
            UNTRUSTED_BROKER,
            {},
            "kafka.settings.ssl.ca.location: the broker's certificate is not trusted",
        ),
        (
            KafkaError._TRANSPORT,
            REFUSED_CLIENT,
            {"ssl.certificate.location": "/c.crt", "ssl.key.location": "/c.key"},
            "kafka.settings.ssl.certificate.location: the broker refused the client certificate",
        ),
        (
            KafkaError._TRANSPORT,
            REFUSED_CLIENT,
            {"ssl.keystore.location": "/c.p12"},
            "kafka.settings.ssl.keystore.location: the broker refused the client certificate",
        ),
        (
            KafkaError._SSL,
            "ssl://b:9093/bootstrap: SSL handshake failed: ssl/tls alert certificate required",
            {},
            "kafka.settings.ssl.certificate.location: the broker wants a client certificate (mTLS) and none is set",
        ),
    ],
)
def test_security_failures_name_the_key(code: int, text: str, settings: dict[str, str], expected: str) -> None:
    found = failure(code, text, settings)
    assert found is not None and found.startswith(expected), found


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
        (KafkaError._TIMED_OUT, "sasl_ssl://b:9093/bootstrap: 1 request(s) timed out: disconnect"),
        (KafkaError._SSL, "ssl://b:9093/bootstrap: SSL transport error: Connection reset by peer"),
    ],
)
def test_other_errors_are_left_to_librdkafka_retries(code: int, text: str) -> None:
    assert failure(code, text, SASL) is None


def test_the_watch_keeps_the_first_failure_and_raises_it_when_checked() -> None:
    watch = SecurityWatch(SASL)
    watch.check()  # nothing yet
    assert not watch.saw(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
    assert watch.saw(KafkaError(KafkaError._SSL, UNTRUSTED_BROKER))
    with pytest.raises(FatalError, match=r"^kafka\.settings\.sasl\.password: "):
        watch.check()


def test_once_admitted_a_refusal_is_fatal_only_if_it_lasts() -> None:
    """A SCRAM credential missing on a restarted broker, a re-authentication mid rolling restart: passing."""
    now = [0.0]
    watch = SecurityWatch(SASL, clock=lambda: now[0])
    watch.admitted()
    watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
    watch.check()  # logged, librdkafka retries
    now[0] = 100.0
    watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
    watch.check()
    watch.admitted()  # a message again: the refusal passed
    # A lasting refusal: librdkafka reports it at each reconnect (every 10 s at most).
    for second in range(1000, 1000 + SECURITY_GRACE_S, 10):
        now[0] = float(second)
        watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
        watch.check()
    now[0] = 1000.0 + SECURITY_GRACE_S
    watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
    with pytest.raises(FatalError, match=rf"sasl\.password: .*\(for {SECURITY_GRACE_S} s\)$"):
        watch.check()


def test_refusals_far_apart_are_separate_outages() -> None:
    """On an idle topic nothing admits us again between two passing refusals hours apart: neither is fatal."""
    now = [0.0]
    watch = SecurityWatch(SASL, clock=lambda: now[0])
    watch.admitted()
    for moment in (0.0, 5.0, 3 * 3600.0, 3 * 3600.0 + 5.0, 9 * 3600.0):
        now[0] = moment
        watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
        watch.check()


@pytest.mark.parametrize(
    ("code", "key"),
    [(KafkaError.TOPIC_AUTHORIZATION_FAILED, "kafka.topic"), (KafkaError.GROUP_AUTHORIZATION_FAILED, "kafka.group_id")],
)
def test_acl_refusals_name_the_key(code: int, key: str) -> None:
    found = failure(code, "Broker: Topic authorization failed", SASL)
    assert found is not None and found.startswith(f"{key}: the broker's ACLs do not allow 'ingest'"), found


# ---------------------------------------------------------------------------- Spark's Kafka source

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def test_sasl_ssl_with_scram_in_the_java_clients_words() -> None:
    settings = {**SASL, "sasl.password": 'p"a\\ss', "ssl.ca.location": "/certs/ca.pem", "fetch.max.bytes": "1048576"}

    assert kafka_source_options("b:9093", settings) == {
        "kafka.bootstrap.servers": "b:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM} required username="ingest" password="p\\"a\\\\ss";',
        "kafka.ssl.truststore.location": "/certs/ca.pem",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.fetch.max.bytes": "1048576",  # not a security setting: passed as it is
    }


def test_plain_with_the_plural_mechanisms_key() -> None:
    options = kafka_source_options(
        "b:9092",
        {"security.protocol": "sasl_plaintext", "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p"},
    )
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="p";'
    )
    assert "kafka.sasl.username" not in options and "kafka.sasl.password" not in options


def test_mtls_from_one_pem_file_a_pkcs12_keystore_or_pem_strings() -> None:
    one_file = {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"}
    one_file |= {"ssl.certificate.location": "/client.pem", "ssl.key.location": "/client.pem", "ssl.key.password": "k"}
    assert kafka_source_options("b:9094", one_file) == {
        "kafka.bootstrap.servers": "b:9094",
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.location": "/ca.pem",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.keystore.location": "/client.pem",
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.key.password": "k",
    }
    pkcs12 = kafka_source_options("b", {"ssl.keystore.location": "/c.p12", "ssl.keystore.password": "pw"})
    assert pkcs12["kafka.ssl.keystore.type"] == "PKCS12" and pkcs12["kafka.ssl.keystore.password"] == "pw"
    strings = kafka_source_options("b", {"ssl.ca.pem": "CA", "ssl.certificate.pem": "CERT", "ssl.key.pem": "KEY"})
    assert strings == {
        "kafka.bootstrap.servers": "b",
        "kafka.ssl.truststore.certificates": "CA",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.keystore.certificate.chain": "CERT",
        "kafka.ssl.keystore.key": "KEY",
        "kafka.ssl.keystore.type": "PEM",
    }


def test_no_host_name_check_is_an_empty_algorithm_in_java() -> None:
    options = kafka_source_options("b", {"ssl.endpoint.identification.algorithm": "none"})
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"sasl.username": "u", "sasl.password": "p"}, "kafka.settings.sasl.mechanism"),
        ({"sasl.mechanisms": "GSSAPI", "sasl.username": "u"}, "kafka.settings.sasl.mechanisms"),
        ({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"}, "kafka.settings.sasl.mechanism"),
        ({"ssl.certificate.location": "/c.crt", "ssl.key.location": "/c.key"}, "kafka.settings.ssl.key.location"),
        ({"enable.ssl.certificate.verification": "false"}, "kafka.settings.enable.ssl.certificate.verification"),
    ],
)
def test_settings_without_a_java_form_are_config_errors(settings: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        kafka_source_options("b", settings)
    assert raised.value.key == key


def test_no_settings_only_the_bootstrap_servers() -> None:
    assert kafka_source_options("b:9092", {}) == {"kafka.bootstrap.servers": "b:9092"}


@pytest.mark.parametrize(
    ("setting", "value", "key"),
    [
        ("ssl.ca.location", "/nonexistent/ca.pem", "kafka.settings.ssl.ca.location"),
        ("no.such.setting", "1", "kafka.settings.no.such.setting"),
        ("session.timeout.ms", "soon", "kafka.settings.session.timeout.ms"),
    ],
)
def test_a_setting_librdkafka_refuses_is_a_config_error_naming_it(setting: str, value: str, key: str) -> None:
    settings = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "security.protocol": "SSL", setting: value}
    with pytest.raises(ConfigError) as raised:
        new_consumer(settings)
    assert raised.value.key == key
    assert "librdkafka refused it" in str(raised.value)


def test_the_daemons_group_settings_do_not_reach_the_java_client() -> None:
    settings = {
        **SASL,
        "partition.assignment.strategy": "cooperative-sticky",  # a class list in Java: ConfigException
        "group.instance.id": "k2d-0",
        "auto.offset.reset": "earliest",  # refused by Spark's Kafka source
        "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384",  # OpenSSL names
        "ssl.ca.location": "probe",  # the system's CAs: the JVM has its own
        "fetch.max.bytes": "1048576",
    }
    options = kafka_source_options("b:9093", settings)
    for key in ("partition.assignment.strategy", "group.instance.id", "auto.offset.reset", "ssl.cipher.suites"):
        assert f"kafka.{key}" not in options
    assert "kafka.ssl.truststore.location" not in options
    assert options["kafka.fetch.max.bytes"] == "1048576"


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"sasl.oauthbearer.client.id": "x"}, "kafka.settings.sasl.oauthbearer.client.id"),
        ({"sasl.kerberos.service.name": "kafka"}, "kafka.settings.sasl.kerberos.service.name"),
        ({"ssl.ca.location": "/etc/ssl/certs/"}, "kafka.settings.ssl.ca.location"),
        ({"ssl.key.pem": "-----BEGIN PRIVATE KEY-----"}, "kafka.settings.ssl.certificate.pem"),
        (
            {"ssl.certificate.pem": "-----BEGIN CERTIFICATE-----", "ssl.key.pem": "-----BEGIN RSA PRIVATE KEY-----"},
            "kafka.settings.ssl.key.pem",
        ),
    ],
)
def test_security_settings_the_java_client_cannot_take_are_refused(extra: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        kafka_source_options("b:9093", {**SASL, **extra})
    assert raised.value.key == key


def test_a_newline_in_a_password_stays_inside_the_jaas_string() -> None:
    options = kafka_source_options("b:9093", {**SASL, "sasl.password": "two\nlines"})
    assert 'password="two\\nlines";' in options["kafka.sasl.jaas.config"]


def test_an_acl_refusal_names_the_key_of_the_subscription() -> None:
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")
    watch = SecurityWatch(SASL, topic_key="kafka.topic_pattern")
    assert watch.saw(refused)
    with pytest.raises(FatalError, match=r"^kafka\.topic_pattern: the broker's ACLs"):
        watch.check()


def test_a_raised_reconnect_backoff_keeps_a_lasting_refusal_one_outage() -> None:
    # Reconnecting every 2 minutes, a lasting refusal is reported every 2 minutes: still one outage.
    now = [0.0]
    watch = SecurityWatch({**SASL, "reconnect.backoff.max.ms": "120000"}, clock=lambda: now[0])
    watch.admitted()
    for second in range(0, SECURITY_GRACE_S, 120):
        now[0] = float(second)
        watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
        watch.check()
    now[0] = float(SECURITY_GRACE_S + 60)
    watch.saw(KafkaError(KafkaError._AUTHENTICATION, WRONG_PASSWORD))
    with pytest.raises(FatalError, match=r"sasl\.password"):
        watch.check()
