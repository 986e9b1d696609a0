"""The share consumer instance registry (service/instances/share.py) without a broker: names, limits, idle
expiry (410 afterwards, 404 for a name never used), acknowledgements of records not held, shutdown."""

from __future__ import annotations

from typing import Any

import pytest

from service.errors import GatewayError
from service.instances.share import (
    NOT_HELD,
    ShareInstanceExists,
    ShareInstanceExpired,
    ShareInstanceNotFound,
    ShareOptions,
    ShareRegistry,
)
from service.share.session import AckType


class _Client:
    """Stands in for a KafkaClient: the registry only keeps it until a subscription starts a consumer."""

    metadata: Any = None


async def test_names_limits_expiry_and_close() -> None:
    reg = ShareRegistry(idle_timeout=10.0)
    a = await reg.create("t", _Client(), "g", ShareOptions(), "a")  # type: ignore[arg-type]
    with pytest.raises(ShareInstanceExists) as taken:
        await reg.create("t", _Client(), "g", ShareOptions(), "a")  # type: ignore[arg-type]
    assert (taken.value.status, taken.value.error_code) == (409, 40910)
    with pytest.raises(GatewayError) as bad:
        await reg.create("t", _Client(), "g", ShareOptions(), "no spaces")  # type: ignore[arg-type]
    assert bad.value.error_code == 42206
    generated = await reg.create("t", _Client(), "g", ShareOptions(), None)  # type: ignore[arg-type]
    assert generated.name.startswith("rest-share-r0-")
    with pytest.raises(GatewayError) as full:
        await reg.create("t", _Client(), "g", ShareOptions(), "c", tenant_max_instances=2)  # type: ignore[arg-type]
    assert (full.value.status, full.value.error_code) == (429, 42901)
    assert reg.get("t", "g", "a") is a

    # idle past the timeout: closed and gone, a request for it answers 410 (a never-used name 404)
    assert await reg.reap(now=a.last_used + 11.0) == 2
    assert a.closed
    with pytest.raises(ShareInstanceExpired) as gone:
        reg.get("t", "g", "a")
    assert (gone.value.status, gone.value.error_code) == (410, 41010)
    with pytest.raises(ShareInstanceNotFound) as missing:
        reg.get("t", "g", "zzz")
    assert (missing.value.status, missing.value.error_code) == (404, 40410)

    # a record never delivered to the instance is reported not held, nothing is sent (no consumer yet)
    b = await reg.create("t", _Client(), "g", ShareOptions(), "b")  # type: ignore[arg-type]
    [refused] = await b.acknowledge([("topic", 0, 5, 7, AckType.ACCEPT)], wait=True, linger=0.0)  # 5 to 7
    assert (refused.applied, refused.error, refused.type) == (False, NOT_HELD, "accept")
    assert (refused.offset, refused.last) == (5, 7)  # one answer for the run

    await reg.close()
    assert b.closed and reg.instance_count == 0
    with pytest.raises(GatewayError) as draining:
        await reg.create("t", _Client(), "g", ShareOptions(), "d")  # type: ignore[arg-type]
    assert (draining.value.status, draining.value.error_code) == (503, 50301)
