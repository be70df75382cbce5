#!/bin/sh
# Spark builder stage: fetch the jars the maintenance jobs load besides pyspark's own, from Maven Central into
# JARDIR: Delta Lake (delta-spark, delta-storage), Spark's Kafka source (spark-sql-kafka-0-10, for
# `kafka2delta jobs mutate|ttl`) and, with S3_JARS=true, hadoop-aws and the AWS SDK. The image sets
# K2D_SPARK__JARS=JARDIR/* (spark.jars: the jobs' offline mode), so nothing is fetched at run time.
#
#   docker/fetch-spark-jars.sh PREFIX JARDIR
#
# Versions come from the virtualenv PREFIX: delta-spark's and pyspark's, Scala's from pyspark's
# spark-core_<scala> jar, Hadoop's from its hadoop-client-api jar. Jars pyspark already ships (antlr4,
# hadoop-client-*, lz4 …) are left out.
# Needs Java and Maven (docker/install-build-deps.sh maven); the Maven repository is $MAVEN_REPO (default
# ~/.m2/repository). Also run by tests/integration/test_container.py with S3_JARS=false.
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 PREFIX JARDIR" >&2
    exit 64
fi
prefix=$1
jardir=$2
s3_jars=${S3_JARS:-true}

pyspark_jars=$("$prefix/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
delta_version=$("$prefix/bin/python" -c 'import importlib.metadata as m; print(m.version("delta-spark"))')
spark_version=$("$prefix/bin/python" -c 'import importlib.metadata as m; print(m.version("pyspark"))')
scala_version=$(find "$pyspark_jars" -name 'spark-core_*.jar' | sed -E 's|.*/spark-core_([0-9.]+)-.*|\1|' | head -n 1)
hadoop_version=$(find "$pyspark_jars" -name 'hadoop-client-api-*.jar' | sed -E 's|.*/hadoop-client-api-(.+)\.jar|\1|' | head -n 1)
if [ -z "$scala_version" ] || [ -z "$hadoop_version" ]; then
    echo "fetch-spark-jars: cannot read the Scala/Hadoop versions from $pyspark_jars" >&2
    exit 1
fi
echo "fetch-spark-jars: spark $spark_version (scala $scala_version), delta $delta_version, hadoop $hadoop_version, S3_JARS=$s3_jars"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
s3_dependency=""
if [ "$s3_jars" = "true" ]; then
    s3_dependency="<dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId><version>$hadoop_version</version></dependency>"
fi
cat >"$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafka2delta</groupId>
  <artifactId>maintenance-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>io.delta</groupId><artifactId>delta-spark_$scala_version</artifactId><version>$delta_version</version></dependency>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_$scala_version</artifactId><version>$spark_version</version></dependency>
    $s3_dependency
  </dependencies>
</project>
POM

mkdir -p "$jardir"
repo_option=""
if [ -n "${MAVEN_REPO:-}" ]; then
    repo_option="-Dmaven.repo.local=$MAVEN_REPO"
fi
# shellcheck disable=SC2086  # an optional option
mvn --batch-mode --quiet --file "$work/pom.xml" $repo_option \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$work/jars"

# Leave out what pyspark already has (same artifact, any version): two copies of a class on the classpath.
for jar in "$work"/jars/*.jar; do
    artifact=$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)?\.jar$//')
    if ls "$pyspark_jars/$artifact"-[0-9]*.jar >/dev/null 2>&1; then
        continue
    fi
    cp "$jar" "$jardir/"
done
ls "$jardir/delta-spark_$scala_version-$delta_version.jar" "$jardir/delta-storage-$delta_version.jar" \
    "$jardir/spark-sql-kafka-0-10_$scala_version-$spark_version.jar" >/dev/null
chmod -R a+rX "$jardir"
echo "fetch-spark-jars: $(find "$jardir" -name '*.jar' | wc -l) jars in $jardir"
ls "$jardir"
