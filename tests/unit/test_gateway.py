"""The instance registry: replica-named ids, duplicates, limits, idle expiry, the prefetch budget."""

from __future__ import annotations

import time

import pytest

from service.client.client import KafkaClient
from service.gateway import (
    Budget,
    Gateway,
    GatewayError,
    InstanceExists,
    InstanceExpired,
    InstanceNotFound,
    InstanceOptions,
    TooManyInstances,
)


async def test_ids_duplicates_limits_and_expiry() -> None:
    gw = Gateway(replica_id="east-1", idle_timeout=10.0, max_instances=3)
    rt = gw.tenant("t1", bootstrap="127.0.0.1:1")  # no connection is made until a consumer starts
    a = await gw.create_instance(rt, "g", InstanceOptions(), "alpha")
    assert a.instance_id == "east-1~alpha" and Gateway.replica_of(a.instance_id) == "east-1"
    with pytest.raises(InstanceExists):
        await gw.create_instance(rt, "g", InstanceOptions(), "alpha")
    b = await gw.create_instance(rt, "other-group", InstanceOptions(), "alpha")  # same name, other group
    assert b.instance_id == "east-1~alpha"
    anon = await gw.create_instance(rt, "g", InstanceOptions())
    assert anon.instance_id.startswith("east-1~consumer-")
    with pytest.raises(TooManyInstances):
        await gw.create_instance(rt, "g", InstanceOptions(), "delta")
    with pytest.raises(GatewayError, match="name must be"):
        await gw.create_instance(rt, "g", InstanceOptions(), "bad/name")
    # a tenant's own limit
    rt2 = gw.tenant("t2", bootstrap="127.0.0.1:1")
    with pytest.raises(TooManyInstances, match="tenant 't2'"):
        await gw.create_instance(rt2, "g", InstanceOptions(), "x", tenant_max_instances=0)
    # tenants do not see each other's instances
    with pytest.raises(InstanceNotFound):
        gw.get_instance(rt2, "g", "east-1~alpha")
    # expiry: idle past the timeout → closed, and a distinct error afterwards
    now = time.monotonic()
    a.last_used = now - 11
    b.active_requests = 1  # a long poll or stream in progress keeps it alive
    b.last_used = now - 11
    assert await gw.reap(now) == 1
    with pytest.raises(InstanceExpired, match="expired after 10 s"):
        gw.get_instance(rt, "g", "east-1~alpha")
    assert gw.get_instance(rt, "other-group", "east-1~alpha") is b
    assert a.closed and gw.expired_total == 1
    # recreating the name clears the expired marker
    again = await gw.create_instance(rt, "g", InstanceOptions(), "alpha")
    assert gw.get_instance(rt, "g", "east-1~alpha") is again
    await gw.close()


def test_budget_and_replica_id_validation() -> None:
    b = Budget(100)
    b.add(60)
    assert b.available()
    b.add(50)
    assert not b.available()
    b.add(-200)
    assert b.used == 0 and b.available()
    with pytest.raises(ValueError):
        Gateway(replica_id="bad~id")
    assert Gateway.replica_of("no-separator") is None
    assert isinstance(KafkaClient("h:1"), KafkaClient)
