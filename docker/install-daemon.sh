#!/bin/sh
# Runtime stage of the daemon image: install kafka2delta from a wheelhouse into the virtualenv PREFIX,
# offline (pip --no-index), byte-compiled, and without pip afterwards, so that nothing is ever written
# under PREFIX at run time (read-only root filesystem) and the image carries no installer.
#
#   docker/install-daemon.sh PREFIX WHEELHOUSE [REQUIREMENT]
#
# PREFIX is created with `python3 -m venv` unless it already is a virtualenv. REQUIREMENT defaults to
# "kafka2delta"; install-maintenance.sh passes "kafka2delta[spark]". Also installs PREFIX/bin/kafka2delta-healthcheck
# (the image's HEALTHCHECK: GET http://127.0.0.1:$K2D_METRICS__PORT/healthz).
# Run by the Dockerfile, and by tests/integration/test_container.py in a fresh virtualenv.
set -eu

if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 PREFIX WHEELHOUSE [REQUIREMENT]" >&2
    exit 64
fi
prefix=$1
wheelhouse=$2
requirement=${3:-kafka2delta}
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -x "$prefix/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$prefix"
fi
"$prefix/bin/python" -m pip install --disable-pip-version-check --no-index --find-links "$wheelhouse" \
    --compile "$requirement"

# The health check, with the venv's interpreter in its shebang (no shell, no curl in a slim image).
sed "1s|.*|#!$prefix/bin/python|" "$here/healthcheck.py" >"$prefix/bin/kafka2delta-healthcheck"
chmod 0755 "$prefix/bin/kafka2delta-healthcheck"

# No installer at run time: nothing may change the environment of a running container.
"$prefix/bin/python" -m pip uninstall --disable-pip-version-check --yes --quiet pip

# Fail the build, not the first start: the entry point must run and every module of the daemon import.
"$prefix/bin/kafka2delta" --version
"$prefix/bin/python" -c "import kafka2delta.cli"
# Everything readable and runnable by any uid (the image runs as 10001, Kubernetes may pick another).
chmod -R a+rX "$prefix"
