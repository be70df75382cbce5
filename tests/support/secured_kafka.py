"""The secured broker of the security tests (``tests/integration/test_secured_kafka.py``,
``tests/spark/test_secured_kafka.py``): a :class:`dev.kafka.broker.SecuredBroker` with one SCRAM user, and the
librdkafka settings a user writes in ``[kafka.settings]`` for each of its listeners."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dev.kafka.broker import SecuredBroker

USER, PASSWORD = "ingest", "s3cret-Pa55word"


@contextmanager
def secured_broker(work_dir: Path) -> Iterator[SecuredBroker]:
    """A started SecuredBroker in ``work_dir`` with the SCRAM-SHA-512 user USER/PASSWORD; stopped on exit."""
    broker = SecuredBroker(work_dir)
    try:
        broker.start()
        broker.add_scram_user(USER, PASSWORD)
        yield broker
    finally:
        broker.stop()


def listener_settings(broker: SecuredBroker, listener: str, **changes: str) -> dict[str, str]:
    """The ``[kafka.settings]`` (librdkafka) for ``listener`` of ``broker``, with ``changes`` applied."""
    certs = broker.certificates
    sasl = {"sasl.mechanism": SecuredBroker.MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD}
    settings = {
        "SASL_PLAINTEXT": sasl,
        "SASL_SSL": {**sasl, "ssl.ca.location": str(certs.ca)},
        "SSL": {
            "ssl.ca.location": str(certs.ca),
            "ssl.certificate.location": str(certs.client_certificate),
            "ssl.key.location": str(certs.client_key),
        },
    }[listener]
    return {"security.protocol": listener, **settings, **changes}
