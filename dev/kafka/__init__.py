"""A local Apache Kafka broker (KRaft) from Maven Central jars: :mod:`dev.kafka.broker`."""
