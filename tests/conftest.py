"""Shared fixtures: a real Tansu broker (session-wide) and helpers to create unique topics."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from service.client.client import KafkaClient
from service.embedded import EmbeddedBroker

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
_counter = itertools.count()


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    broker = EmbeddedBroker(log_file=log)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


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


def require_cext() -> bool:
    return os.environ.get("KCG_REQUIRE_CEXT") == "1"
