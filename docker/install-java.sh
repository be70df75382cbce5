#!/bin/sh
# Maintenance runtime stage: a Java 17 runtime for Spark (headless JRE, no JDK, no compiler).
# Debian 12 (bookworm) carries openjdk-17; later Debian releases do not (see docs/OPERATING.md).
set -eu

export DEBIAN_FRONTEND=noninteractive
# openjdk's postinst links man pages into a directory the slim images do not have.
mkdir -p /usr/share/man/man1
apt-get update
# procps: Spark's launcher scripts call ps.
apt-get install --yes --no-install-recommends openjdk-17-jre-headless procps
rm -rf /var/lib/apt/lists/*
java -version
