#!/bin/sh
# Tools the contract tests use besides Python (tests/integration/test_openapi.py and
# tests/integration/test_generated_clients.py):
#   npm packages, pinned, into the project-local .tools/ (ignored by git):
#     @redocly/cli  (the independent OpenAPI linter, configured by redocly.yaml)
#     typescript, @types/node  (tsc compiles the TypeScript client generated from openapi.yaml and its node test)
#   system packages, from the Debian archive when missing (as root with apt-get):
#     nodejs and npm (runs the above and the compiled client), a Java runtime >= 11 (openapi-generator's jar,
#     which the PyPI package openapi-generator-cli of the test extra ships), a JDK and Maven (the generated
#     Java client; its dependencies come from Maven Central into ~/.m2 when the test builds it)
#   not installed here: the Go toolchain (>= 1.23, for the generated Go client), from go.dev; the test fails
#     without it
# Idempotent: does nothing when the pinned versions are installed. Exit status 0 when everything is there.
set -u

cd "$(dirname "$0")/.." || exit 1
PACKAGES="@redocly/cli@2.77.0 typescript@5.9.3 @types/node@20.19.43"
PREFIX=.tools
STAMP="$PREFIX/.installed"

missing=""
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || missing="$missing default-jdk-headless"
command -v mvn >/dev/null 2>&1 || missing="$missing maven"
if [ -n "$missing" ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "install-node-deps: missing Debian package(s):$missing; as root run:" >&2
        echo "    apt-get update && apt-get install -y --no-install-recommends$missing" >&2
        exit 1
    fi
    echo "install-node-deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || exit 1
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    apt-get install -y -qq --no-install-recommends $missing || exit 1
fi

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PACKAGES" ] && [ -x "$PREFIX/node_modules/.bin/redocly" ] \
        && [ -x "$PREFIX/node_modules/.bin/tsc" ]; then
    echo "install-node-deps: $PACKAGES installed in $PREFIX"
    exit 0
fi
echo "install-node-deps: installing $PACKAGES into $PREFIX"
mkdir -p "$PREFIX" || exit 1
[ -f "$PREFIX/package.json" ] || echo '{"private": true}' > "$PREFIX/package.json"
# shellcheck disable=SC2086
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error --save-exact $PACKAGES || exit 1
echo "$PACKAGES" > "$STAMP"
echo "install-node-deps: done"
