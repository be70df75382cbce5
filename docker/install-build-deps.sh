#!/bin/sh
# Builder stages only (never a runtime stage): what building wheels and fetching the Delta jars needs.
#
#   docker/install-build-deps.sh            a C toolchain, for a dependency that has no binary wheel
#   docker/install-build-deps.sh maven      also a JDK 17 and Maven, to fetch the Delta jars
set -eu

packages="build-essential"
# A base with Debian's python3 (dev/image.py's local base, for building without a registry) has neither pip
# nor the C headers; python.org's image (the default PYTHON_IMAGE) has both in /usr/local.
if ! "${PYTHON:-python3}" -m pip --version >/dev/null 2>&1; then
    packages="$packages python3-pip python3-dev"
fi
if [ "${1:-}" = "maven" ]; then
    # openjdk's postinst links man pages into a directory the slim images do not have.
    mkdir -p /usr/share/man/man1
    packages="$packages openjdk-17-jdk-headless maven"
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086  # a list of package names
apt-get install --yes --no-install-recommends $packages
rm -rf /var/lib/apt/lists/*
