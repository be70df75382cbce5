#!/bin/sh
# Runtime stage of the maintenance image: kafka2delta with its [spark] extra (pyspark, delta-spark) from a
# wheelhouse into the virtualenv PREFIX, offline, exactly as install-daemon.sh does for the daemon.
# The jars (Delta, Spark Kafka source) come separately: fetch-spark-jars.sh, in the Spark builder stage.
#
#   docker/install-maintenance.sh PREFIX WHEELHOUSE
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 PREFIX WHEELHOUSE" >&2
    exit 64
fi
prefix=$1
here=$(cd "$(dirname "$0")" && pwd)

"$here/install-daemon.sh" "$prefix" "$2" "kafka2delta[spark]"
# The extra must have brought Spark and Delta: a missing [spark] extra would otherwise pass silently.
"$prefix/bin/python" -c 'import importlib.metadata as m, pyspark, delta; print("pyspark", pyspark.__version__, "delta-spark", m.version("delta-spark"))'
