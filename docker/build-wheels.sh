#!/bin/sh
# Build stage: a wheel for kafka2delta (the source tree SOURCE) and one for every dependency, into WHEELHOUSE,
# so that the runtime stages install offline (pip --no-index) and never need a compiler.
#
#   docker/build-wheels.sh SOURCE WHEELHOUSE [EXTRAS]      e.g. docker/build-wheels.sh /src /wheels spark
#
# Run by the Dockerfile's builder stages, and by tests/integration/test_container.py on this checkout.
set -eu

if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: $0 SOURCE WHEELHOUSE [EXTRAS]" >&2
    exit 64
fi
source_dir=$(cd "$1" && pwd)
wheelhouse=$2
extras=${3:-}
python=${PYTHON:-python3}

requirement=$source_dir
if [ -n "$extras" ]; then
    requirement="${source_dir}[${extras}]"
fi

mkdir -p "$wheelhouse"
# --no-build-isolation is not used: setuptools comes from the index into an isolated build env, as pip does
# by default. Binary wheels are preferred for every dependency (no compiler is needed for the usual
# platforms); a dependency without one is built here, in the stage that has build-essential.
"$python" -m pip wheel --disable-pip-version-check --prefer-binary --wheel-dir "$wheelhouse" "$requirement"

ls "$wheelhouse"/kafka2delta-*.whl >/dev/null
echo "build-wheels: $(find "$wheelhouse" -name '*.whl' | wc -l) wheels in $wheelhouse"
