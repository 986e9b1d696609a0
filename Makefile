# Quick start: `make run` (gateway + embedded Tansu broker) and `make test` (the whole suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEPS := pyproject.toml $(wildcard hatch_build.py service/protocol/_crecords.c)

.PHONY: run test lint bench sink-demo clean system-deps

$(STAMP): $(DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,spark]'
	touch $(STAMP)

# Debian packages the tests and benchmarks use (prometheus + promtool, wrk, curl); installs only what is missing.
system-deps:
	sh tools/install-system-deps.sh

run: $(STAMP)
	exec $(VENV)/bin/consumer-gateway

test: $(STAMP) system-deps
	KCG_REQUIRE_CEXT=1 $(PY) -m pytest -q -p no:cacheprovider
	$(VENV)/bin/ruff check .

lint: $(STAMP)
	$(VENV)/bin/ruff check .

sink-demo: $(STAMP)
	$(PY) -m sink.demo

bench: $(STAMP) system-deps
	$(PY) bench/codec.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find service -name '*.so' -delete
