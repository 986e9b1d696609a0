#!/bin/sh
# Install the requirements of optional-dependency groups ("extras") of pyproject.toml into a venv whose
# project is already installed (`pip install -e .`), without reinstalling (and rebuilding) the project itself.
# Usage: tools/install-extras.sh PYTHON EXTRA [EXTRA...]    e.g. tools/install-extras.sh .venv/bin/python test spark
set -eu
py=$1
shift
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$py" - "$@" > "$reqs" <<'PYEOF'
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
for name in sys.argv[1:]:
    for req in extras[name]:
        print(req)
PYEOF
"$py" -m pip install --quiet --disable-pip-version-check -r "$reqs"
