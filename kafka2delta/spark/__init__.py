"""PySpark jobs that keep the table healthy and change it safely (maintenance, mutations, GDPR deletes),
and the job coordinator. Never imported by the ingest daemon: pyspark is an optional dependency."""
