"""Shared fixtures: the real brokers (a Tansu and an Apache Kafka broker, each session-wide, the Kafka one started
only when a test asks for it), ``broker`` (a test using it runs once on each) and helpers to create unique topics."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from service.client.client import KafkaClient
from service.embedded.kafka import EmbeddedKafka
from service.embedded.tansu import EmbeddedBroker

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
_counter = itertools.count()
#: the brokers ``broker`` runs a test on (docs/brokers.md: what differs between them)
BROKERS = ("tansu", "kafka")
AnyBroker = EmbeddedBroker | EmbeddedKafka
_kafka_starts: list[str] = []


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    broker = EmbeddedBroker(log_file=log)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafka]:
    """One Apache Kafka broker (single-node KRaft, service/embedded/kafka.py) for the whole session, started by the
    first test that needs it (its start, 2-6 s, is paid once). Tests share it: unique topic and group names. The jars
    come from tools/install-kafka.sh (make test runs it); without them this fails with that instruction."""
    log = tmp_path_factory.mktemp("kafka") / "kafka.log"
    broker = EmbeddedKafka(log_file=log)
    broker.start()
    _kafka_starts.append(f"embedded Apache Kafka {broker.bootstrap}: ready in {broker.startup_s:.1f} s "
                         f"(format {broker.format_s:.1f} s, broker {broker.ready_s:.1f} s); log {log}")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module", params=BROKERS)
def broker(request: pytest.FixtureRequest) -> AnyBroker:
    """The broker of a test that runs on both Tansu and Apache Kafka (module-scoped, so a module's gateway on it is
    shared by its tests; pytest runs a module's tests on one broker, then on the other). ``broker.name`` says which."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _kafka_starts:
        terminalreporter.write_line(line)


@pytest.fixture
def topic_name() -> str:
    return f"t{next(_counter)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def kclient(tansu: EmbeddedBroker) -> AsyncIterator[KafkaClient]:
    client = KafkaClient(tansu.bootstrap)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def bclient(broker: AnyBroker) -> AsyncIterator[KafkaClient]:
    """A client of ``broker`` (Tansu or Kafka): ``kclient`` for the tests that run on both."""
    client = KafkaClient(broker.bootstrap)
    try:
        yield client
    finally:
        await client.close()


def require_cext() -> bool:
    return os.environ.get("KCG_REQUIRE_CEXT") == "1"
