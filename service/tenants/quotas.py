"""Quotas: the per-tenant limits (:class:`Quotas`) and their enforcement — the requests-per-second
token bucket, the consumer-instance limit and the concurrent-poll slots (mixed into
:class:`~service.tenants.tenant.Tenant`)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from .errors import RATE_LIMITED, TenantError


@dataclass(frozen=True)
class Quotas:
    """Per-tenant limits; ``None`` means unlimited. ``burst`` (token-bucket size) defaults to
    ``ceil(requests_per_second)``."""

    max_instances: int | None = None
    max_concurrent_polls: int | None = None
    requests_per_second: float | None = None
    burst: int | None = None


class TenantQuotas:
    """A tenant's quotas and the runtime quota state (the token bucket and the number of polls in flight);
    a part of :class:`~service.tenants.tenant.Tenant`, which calls :meth:`_init_quotas` and has the ``id``."""

    id: str

    def _init_quotas(self, quotas: Quotas | None, clock: Callable[[], float]) -> None:
        self.quotas = quotas or Quotas()
        self._clock = clock
        rps = self.quotas.requests_per_second
        self._bucket_size = float(self.quotas.burst or (max(1, math.ceil(rps)) if rps else 1))
        self._tokens = self._bucket_size
        self._refilled = clock()
        self._bucket_lock = threading.Lock()
        self._active_polls = 0

    # -- quotas ---------------------------------------------------------------------------------------
    def check_rate(self) -> None:
        """Take one token from the tenant's bucket (``requests_per_second`` refill, ``burst`` size) or
        raise 429/42901 with ``retry_after`` = whole seconds until a token is available."""
        rate = self.quotas.requests_per_second
        if rate is None:
            return
        with self._bucket_lock:
            now = self._clock()
            elapsed = max(0.0, now - self._refilled)
            self._refilled = now
            self._tokens = min(self._bucket_size, self._tokens + elapsed * rate)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            wait = (1.0 - self._tokens) / rate
        raise TenantError(
            429, RATE_LIMITED,
            f"tenant {self.id!r} exceeded its rate limit of {rate:g} requests per second",
            retry_after=max(1, math.ceil(wait)),
        )

    def check_instance_quota(self, current: int) -> None:
        """Raise 429/42901 when a tenant that already has ``current`` consumer instances may not create
        another one."""
        limit = self.quotas.max_instances
        if limit is not None and current >= limit:
            raise TenantError(
                429, RATE_LIMITED,
                f"tenant {self.id!r} already has {current} consumer instances (limit {limit})",
                retry_after=1,
            )

    @property
    def active_polls(self) -> int:
        return self._active_polls

    def poll_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one of the tenant's ``max_concurrent_polls`` slots for the duration of a poll; when all
        are taken, entering raises 429/42901 at once (no queueing)."""
        return self._poll_slot()

    @contextlib.asynccontextmanager
    async def _poll_slot(self) -> AsyncIterator[None]:
        limit = self.quotas.max_concurrent_polls
        if limit is not None and self._active_polls >= limit:
            raise TenantError(
                429, RATE_LIMITED,
                f"tenant {self.id!r} has too many concurrent polls (limit {limit})",
                retry_after=1,
            )
        self._active_polls += 1
        try:
            yield
        finally:
            self._active_polls -= 1
