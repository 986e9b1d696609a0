#!/bin/sh
# System packages some tests and benchmarks need, from the Debian/Ubuntu archive:
#   prometheus (the prometheus and promtool binaries: tests/integration/test_dashboards.py)
#   wrk and curl (C HTTP clients: bench/)
# Idempotent: installs only what is missing, and only as root with apt-get; otherwise says what to install.
# Exit status: 0 when everything is there afterwards, 1 otherwise.
set -u

missing=""
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v curl >/dev/null 2>&1 || missing="$missing curl"

if [ -z "$missing" ]; then
    echo "install-system-deps: prometheus, promtool, wrk and curl are installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: missing Debian package(s):$missing" >&2
    echo "install-system-deps: not root or no apt-get, so not installing them; run as root:" >&2
    echo "    apt-get update && apt-get install -y --no-install-recommends$missing" >&2
    exit 1
fi

echo "install-system-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || exit 1
# shellcheck disable=SC2086  # word splitting of the package list is intended
apt-get install -y -qq --no-install-recommends $missing || exit 1

for cmd in prometheus promtool wrk curl; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        echo "install-system-deps: $cmd still missing after apt-get install" >&2
        exit 1
    fi
done
echo "install-system-deps: done"
