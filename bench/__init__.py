"""The benchmark: kafka2delta side by side with Spark Structured Streaming (``python -m bench.run``)."""
