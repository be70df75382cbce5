"""Developer and test tooling: local servers (Kafka, Apicurio, ZooKeeper, S3), the demo, tool installers.

Run as modules from the repository root, e.g. ``python -m dev.kafka.broker start``.
"""
