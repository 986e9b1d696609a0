#!/bin/sh
# Pre-build the venv of ../shared/registry/start, the launcher of the real Schema Registry (Karapace) that the
# integration tests start (tests/integration/conftest.py: schema_registry), so that no test pays for the install.
# The venv lives in ~/.cache/kcg-registry-venv/<hash of the launcher, its pins and the Python minor version>:
# the first run takes about a minute (pip), later ones about 0.3 s. Without ../shared there is nothing to do.
# Usage: tools/install-registry.sh PYTHON    (the interpreter the tests run with, so the venv's key matches)
set -eu
py=$1
start="$(cd "$(dirname "$0")/.." && pwd)/../shared/registry/start"
if [ ! -f "$start" ]; then
    echo "install-registry: no $start, the schema-registry tests will skip"
    exit 0
fi
"$py" "$start" --install-only > /dev/null
