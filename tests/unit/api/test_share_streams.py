"""What a share stream settles when it ends (api/share/streams.py): the acquisition in flight finishes and what
it acquired is released, as is a chunk whose write did not complete; in implicit mode the last chunk written
stays accepted (it is no longer the instance's "previous") and the released records leave it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from api.share.streams import settle_stream_end
from service.instances.share import AckRange, ShareInstance, ShareOptions
from service.share.consumer import ShareRecord
from service.share.ranges import RunMap
from service.share.session import AckType


def rec(offset: int) -> ShareRecord:
    return ShareRecord("t", 0, offset, 0, None, b"v", (), 1, 1e12)


class StubInstance(ShareInstance):
    """A share instance without a consumer: what it would acknowledge is recorded (and no longer held)."""

    def __init__(self, mode: str) -> None:
        super().__init__("t", "g", "w", ShareOptions(ack_mode=mode), None)  # type: ignore[arg-type]
        self.sent: list[AckRange] = []
        self.released = 0  # memory budget charge given back

    def release_charge(self, n: int) -> None:
        self.released += n

    async def acknowledge(self, acks: list[AckRange], *, wait: bool, linger: float) -> list[Any]:
        self.sent += acks
        for t, p, f, la, _ in acks:
            self.held[(t, p)].remove(f, la)
        return []


@pytest.mark.parametrize("mode", ["explicit", "implicit"])
async def test_unwritten_and_in_flight_records_are_released(mode: str) -> None:
    inst = StubInstance(mode)
    inst.held[("t", 0)] = RunMap()
    inst.held[("t", 0)].assign(0, 5, (1, 1e12))
    inst.previous = [("t", 0, 4, 5, AckType.ACCEPT)] if mode == "implicit" else []

    async def acquiring() -> tuple[list[ShareRecord], int]:
        await asyncio.sleep(0)
        return [rec(4), rec(5)], 70

    # 0-1 written (held, not settled here), 2-3 a chunk whose write did not complete, 4-5 in flight
    await settle_stream_end(inst, asyncio.ensure_future(acquiring()), [rec(2), rec(3)])  # type: ignore[arg-type]
    assert inst.sent == [("t", 0, 2, 5, AckType.RELEASE)]
    assert list(inst.held[("t", 0)]) == [(0, 1, (1, 1e12))]
    assert inst.previous == []
    assert inst.released == 70  # the in-flight acquisition's memory charge is given back


async def test_a_failed_acquisition_and_nothing_unwritten_release_nothing() -> None:
    inst = StubInstance("explicit")

    async def failing() -> tuple[list[ShareRecord], int]:
        raise RuntimeError("broker gone")

    await settle_stream_end(inst, asyncio.ensure_future(failing()), [])  # type: ignore[arg-type]
    assert inst.sent == []
