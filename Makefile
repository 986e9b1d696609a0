# Quick start: `make run` (gateway + embedded Tansu broker + embedded Schema Registry) and `make test` (the whole suite,
# then ruff, mypy (the type check of service, api and sink, strict on the pure cores; [tool.mypy] in pyproject.toml)
# and lint-imports (the import layers, [tool.importlinter]).
# `GATEWAY_EMBEDDED_BROKER=kafka make run`: the same on an embedded Apache Kafka (docs/brokers.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` installs the runtime dependencies only (RUN_STAMP: `pip install -e .`, no
# PySpark); `make test` adds the test and spark extras on top (TEST_STAMP) without reinstalling the project.
# Either target run again, or `make run` after `make test`, installs nothing.
RUN_STAMP := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp
DEPS := pyproject.toml $(wildcard hatch_build.py service/protocol/_crecords.c service/schemas/_cavro.c service/producer/_cproduce.c)

.PHONY: run test fuzz lint bench sink-demo clean system-deps

$(RUN_STAMP): $(DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP) pyproject.toml tools/install-extras.sh
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	sh tools/install-extras.sh $(PY) test spark
	touch $(TEST_STAMP)

# Debian packages the tests and benchmarks use (prometheus + promtool, wrk, curl); installs only what is missing.
system-deps:
	sh tools/install-system-deps.sh

# The gateway starts the Schema Registry itself, in the background (service/embedded/registry.py): its first
# start installs Karapace's venv (../shared/registry/start, about 35 s) while the gateway already serves.
# With GATEWAY_EMBEDDED_BROKER=kafka (and no GATEWAY_KAFKA_BOOTSTRAP) the broker is Apache Kafka: its jars are resolved
# from Maven Central first (tools/install-kafka.sh: once, then cached in ~/.cache/kcg-kafka; needs a JDK and Maven).
run: $(RUN_STAMP)
	if [ "$${GATEWAY_EMBEDDED_BROKER:-tansu}" = kafka ] && [ -z "$${GATEWAY_KAFKA_BOOTSTRAP:-}" ]; then \
		sh tools/install-kafka.sh > /dev/null; fi
	exec $(VENV)/bin/consumer-gateway

test: $(TEST_STAMP) system-deps
	sh tools/install-node-deps.sh
	sh tools/install-registry.sh $(PY)
	sh tools/install-kafka.sh > /dev/null
	sh tools/install-spark-kafka.sh > /dev/null
	KCG_REQUIRE_CEXT=1 $(PY) -m pytest -q -p no:cacheprovider --durations=25
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The fuzz tier (tests/fuzz, also part of `make test`) run longer (KCG_FUZZ_PROFILE=long) against ASan/UBSan
# builds of the three C extensions, made in a temporary copy of the sources (tools/fuzz.sh; the in-tree modules
# are not touched). KCG_FUZZ_EXAMPLES=N sets the examples per property test.
fuzz: $(TEST_STAMP)
	sh tools/fuzz.sh $(PY)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

sink-demo: $(TEST_STAMP)
	$(PY) -m sink.demo

bench: $(TEST_STAMP) system-deps
	$(PY) bench/codec.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .mypy_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find service -name '*.so' -delete
