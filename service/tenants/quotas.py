"""Quotas: the per-tenant limits (:class:`Quotas`), their shipped defaults (:data:`DEFAULT_QUOTAS`) and their
enforcement — the requests-per-second token bucket, the concurrent poll / stream / range-read slots and the
subscription size (mixed into :class:`~service.tenants.tenant.Tenant`) — plus the consumer-instance limit
across a replica set: the owner of record's ledger (:class:`InstanceLedger`, pure) and each replica's
:class:`InstanceQuotaCoordinator` (asyncio; the HTTP transport is injected by ``api/routing.py``).

Which quotas are global and which are scaled with replicas:

- ``max_instances`` is **global**: the ring owner of the tenant id keeps the tenant's instance count for the
  whole replica set (:class:`InstanceQuotaCoordinator`);
- ``requests_per_second``, ``burst``, ``max_concurrent_polls``, ``max_streams`` and ``max_range_reads`` are
  **scaled**: each replica enforces ``ceil(limit / live replicas)`` (at least 1), so the replica set as a
  whole stays within about the limit;
- ``max_topics_per_subscription`` is per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
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
    max_streams: int | None = None
    max_range_reads: int | None = None
    max_topics_per_subscription: int | None = None


#: The limits every tenant gets unless the tenants file says otherwise (the ``GATEWAY_DEFAULT_*`` settings;
#: open mode's ``default`` tenant too). Sized so that a real deployment does not meet them by accident
#: while a runaway or hostile client does: see docs/security.md. No request rate by default: the limits on
#: what a request can hold (instances, slots, memory, connections) protect the replica, and a rate low
#: enough to matter would throttle one heavy, well-behaved client below what the replica can serve.
DEFAULT_QUOTAS = Quotas(max_instances=1000, max_concurrent_polls=1000, requests_per_second=None, burst=None,
                        max_streams=100, max_range_reads=16, max_topics_per_subscription=1000)

#: error code: the owner of record of a tenant's instance count could not be asked (503, Retry-After)
QUOTA_UNAVAILABLE = 50306


class QuotaUnavailable(TenantError):
    """503/50306: the replica keeping the tenant's instance count could not answer; nothing was created."""

    def __init__(self, message: str) -> None:
        super().__init__(503, QUOTA_UNAVAILABLE, message, retry_after=1)


def _tenant_name(key: str) -> str:
    """The tenant of a ledger key: the tenant id, or ``\x1f<kind>\x1f<tenant id>`` for another kind of instance
    counted apart (share consumer instances)."""
    return key.rsplit("\x1f", 1)[-1] if key.startswith("\x1f") else key


def scaled(limit: int, replicas: int) -> int:
    """A replica's share of a limit enforced by each of ``replicas`` replicas: ``ceil(limit / replicas)``,
    at least 1."""
    return max(1, math.ceil(limit / max(1, replicas)))


class TenantQuotas:
    """A tenant's quotas and the runtime quota state (the token bucket and the slots in use);
    a part of :class:`~service.tenants.tenant.Tenant`, which calls :meth:`_init_quotas` and has the ``id``.

    :attr:`replicas` (set by the routing layer) gives the number of live replicas: the rate and the
    concurrency limits are this replica's share of them (:func:`scaled`)."""

    id: str

    def _init_quotas(self, quotas: Quotas | None, clock: Callable[[], float]) -> None:
        self.quotas = quotas or Quotas()
        self._clock = clock
        rps = self.quotas.requests_per_second
        self._bucket_size = float(self.quotas.burst or (max(1, math.ceil(rps)) if rps else 1))
        self._tokens: float | None = None  # full at the first request
        self._refilled = clock()
        self._bucket_lock = threading.Lock()
        self._active: dict[str, int] = {"polls": 0, "streams": 0, "range reads": 0}
        self.replicas: Callable[[], int] = lambda: 1

    # -- quotas ---------------------------------------------------------------------------------------
    def check_rate(self) -> None:
        """Take one token from the tenant's bucket (``requests_per_second`` refill, ``burst`` size; this
        replica's share of both) or raise 429/42901 with ``retry_after`` = whole seconds until a token is
        available."""
        rate = self.quotas.requests_per_second
        if rate is None:
            return
        n = self.replicas()
        size = float(scaled(math.ceil(self._bucket_size), n)) if n > 1 else self._bucket_size
        rate = rate / n if n > 1 else rate
        with self._bucket_lock:
            now = self._clock()
            elapsed = max(0.0, now - self._refilled)
            self._refilled = now
            tokens = size if self._tokens is None else self._tokens
            self._tokens = min(size, tokens + elapsed * rate)
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            wait = (1.0 - self._tokens) / rate
        raise TenantError(
            429, RATE_LIMITED,
            f"tenant {self.id!r} exceeded its rate limit of {self.quotas.requests_per_second:g} requests per second"
            + (f" ({rate:g} per second on each of {n} gateway replicas)" if n > 1 else ""),
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

    def check_subscription_size(self, topics: int) -> None:
        """Raise 422/42206 for a subscription (or assignment) naming more than ``max_topics_per_subscription``
        topics: it is refused before anything reaches the broker."""
        limit = self.quotas.max_topics_per_subscription
        if limit is not None and topics > limit:
            raise TenantError(
                422, 42206,
                f"the subscription names {topics} topics; tenant {self.id!r} may name at most {limit} "
                "(max_topics_per_subscription): subscribe to a pattern instead",
            )

    @property
    def active_polls(self) -> int:
        return self._active["polls"]

    @property
    def active_streams(self) -> int:
        return self._active["streams"]

    @property
    def active_range_reads(self) -> int:
        return self._active["range reads"]

    def poll_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one of the tenant's ``max_concurrent_polls`` slots for the duration of a poll (streams and
        range reads hold one too); when all are taken, entering raises 429/42901 at once (no queueing)."""
        return self._slots(("polls", self.quotas.max_concurrent_polls))

    def stream_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A stream's slots for its whole life: one of ``max_streams`` and one of ``max_concurrent_polls``."""
        return self._slots(("streams", self.quotas.max_streams), ("polls", self.quotas.max_concurrent_polls))

    def range_read_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A range read's slots: one of ``max_range_reads`` and one of ``max_concurrent_polls``."""
        return self._slots(("range reads", self.quotas.max_range_reads),
                           ("polls", self.quotas.max_concurrent_polls))

    @contextlib.asynccontextmanager
    async def _slots(self, *wanted: tuple[str, int | None]) -> AsyncIterator[None]:
        n = self.replicas()
        for kind, limit in wanted:
            if limit is None:
                continue
            share = scaled(limit, n)
            if self._active[kind] >= share:
                per = f" ({share} on each of {n} gateway replicas)" if n > 1 else ""
                raise TenantError(
                    429, RATE_LIMITED,
                    f"tenant {self.id!r} has too many concurrent {kind} (limit {limit}{per})",
                    retry_after=1,
                )
        for kind, _ in wanted:
            self._active[kind] += 1
        try:
            yield
        finally:
            for kind, _ in wanted:
                self._active[kind] -= 1


# ---------------------------------------------------------------------------------------------------------
# max_instances across replicas
# ---------------------------------------------------------------------------------------------------------
#: a released reservation is remembered this long, so that a count report older than the release cannot
#: bring it back (reports are at most a request timeout old)
TOMBSTONE_S = 120.0


class InstanceLedger:
    """The owner of record's view of one tenant's instances across the replica set: the reservation tokens
    each replica holds. Pure: the caller supplies the time.

    A token a replica reports as pending (reserved, its instance not registered yet) that this owner did not
    grant is counted but *unconfirmed*: when its reservation arrives it is judged against the limit like a
    new one (so a pending report can never let a reservation past the limit)."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, float]] = {}  # replica id → token → when granted (or first reported)
        self.unconfirmed: set[str] = set()
        self.released: dict[str, float] = {}  # token → when released (tombstones)
        self.synced_with: frozenset[str] | None = None  # the replica set of the last sync
        self.synced_at = -math.inf

    def count(self) -> int:
        return sum(len(tokens) for tokens in self.held.values())

    def _drop(self, token: str) -> None:
        for tokens in self.held.values():
            tokens.pop(token, None)
        self.unconfirmed.discard(token)

    def reserve(self, replica: str, token: str, limit: int | None, now: float) -> bool:
        """Grant ``token`` to ``replica`` unless the tenant holds ``limit`` already (a repeated grant of the
        same token is granted again; a released token never is)."""
        if token in self.released:
            return False
        if token in self.unconfirmed:
            self._drop(token)  # judged now, as a new reservation
        elif any(token in tokens for tokens in self.held.values()):
            return True
        if limit is not None and self.count() >= limit:
            return False
        self.held.setdefault(replica, {})[token] = now
        return True

    def release(self, token: str, now: float) -> None:
        self._drop(token)
        self.released[token] = now

    def apply_sync(self, reports: Mapping[str, tuple[Iterable[str], Iterable[str]]], started: float,
                   replicas: Iterable[str], now: float) -> None:
        """Replace each reporting replica's tokens by its report ``(instance tokens, pending tokens)``, asked
        at ``started``, keeping tokens granted since then and dropping released ones; forget replicas not in
        ``replicas`` (gone: their instances went with them). Replicas that did not report keep theirs."""
        members = frozenset(replicas)
        for gone in [r for r in self.held if r not in members]:
            for token in self.held.pop(gone):
                self.unconfirmed.discard(token)
        for replica, (settled, pending) in reports.items():
            if replica not in members:
                continue
            before = self.held.get(replica, {})
            fresh: dict[str, float] = {}
            for token in settled:
                if token not in self.released:
                    fresh[token] = before.get(token, started)
                    self.unconfirmed.discard(token)
            for token in pending:
                if token not in self.released and token not in fresh:
                    if token not in before:
                        self.unconfirmed.add(token)
                    fresh[token] = before.get(token, started)
            for token, at in before.items():
                if at >= started and token not in self.released:
                    fresh.setdefault(token, at)
            for token in before:
                if token not in fresh:
                    self.unconfirmed.discard(token)
            self.held[replica] = fresh
        for token in [t for t, at in self.released.items() if now - at > TOMBSTONE_S]:
            del self.released[token]
        self.synced_with = members
        self.synced_at = now


class PeerUnreachable(Exception):
    """The peer could not be connected to: nothing reached it (the caller marks it dead)."""


class PeerFailed(Exception):
    """The peer was reached but did not answer usefully (timeout, error status, bad body)."""


#: ``call(replica id, operation, payload)`` → the peer's JSON answer; operations: ``reserve``, ``release``,
#: ``held``. Raises :class:`PeerUnreachable` or :class:`PeerFailed`.
PeerCall = Callable[[str, str, dict[str, object]], Awaitable[dict[str, object]]]


class InstanceQuotaCoordinator:
    """One replica's part in enforcing ``max_instances`` across the replica set.

    The owner of record of a tenant is the ring owner (rendezvous hashing over the live replicas) of the
    tenant id. Creating an instance first reserves a slot with the owner (:meth:`acquire`: a token the
    owner files under this replica); deleting or expiring it releases the token (:meth:`release`). The
    owner counts a tenant only after asking every live replica which tokens it holds (:meth:`sync`: when
    it becomes the owner, when the replica set changed, and every ``sync_s`` seconds), so a replica that
    crashed or restarted leaks nothing for longer than that. When the owner cannot be connected to it is
    marked dead and the next owner is asked; when a replica reached does not answer (timeout, error), the
    create is refused with 503/50306 and ``Retry-After`` (fail closed: the limit is never exceeded
    because a replica was slow).
    """

    def __init__(self, self_id: str, *, owner_of: Callable[[str], str], members: Callable[[], list[str]],
                 local_tokens: Callable[[str], list[str]], call: PeerCall,
                 mark_dead: Callable[[str], None] = lambda _: None, sync_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``owner_of(tenant)``: the ring owner; ``members()``: every live replica id, this one included
        (draining ones too: they hold instances); ``local_tokens(tenant)``: the tokens of this replica's
        instances of the tenant."""
        self.self_id = self_id
        self.owner_of = owner_of
        self.members = members
        self.local_tokens = local_tokens
        self.call = call
        self.mark_dead = mark_dead
        self.sync_s = sync_s
        self.clock = clock
        self.ledgers: dict[str, InstanceLedger] = {}
        self.pending: dict[str, set[str]] = {}  # tenant → tokens reserved, instance not registered yet
        self._sync_locks: dict[str, asyncio.Lock] = {}

    # -- this replica as a client of the owner ------------------------------------------------------------
    def held_tokens(self, tenant: str) -> tuple[list[str], list[str]]:
        """What this replica reports for ``tenant``: its instances' tokens and its pending reservations."""
        return list(self.local_tokens(tenant)), sorted(self.pending.get(tenant, ()))

    async def acquire(self, tenant: str, limit: int, *, what: str = "consumer instances") -> str:
        """Reserve one of the tenant's ``limit`` instances with the owner of record; returns the token (pending
        until :meth:`settle` or :meth:`release`). 429/42901 when the tenant holds ``limit`` across the
        replica set, 503/50306 when the count cannot be established."""
        token = secrets.token_hex(8)
        pending = self.pending.setdefault(tenant, set())
        pending.add(token)
        try:
            granted, count = await self._reserve(tenant, token, limit)
        except BaseException:
            pending.discard(token)
            raise
        if not granted:
            pending.discard(token)
            raise TenantError(
                429, RATE_LIMITED,
                f"tenant {_tenant_name(tenant)!r} already has {count} {what} across the gateway replicas "
                f"(limit {limit})", retry_after=1)
        return token

    def settle(self, tenant: str, token: str) -> None:
        """The instance holding ``token`` is registered (its token is now reported with it)."""
        self.pending.get(tenant, set()).discard(token)

    async def _reserve(self, tenant: str, token: str, limit: int) -> tuple[bool, int]:
        for _ in range(len(self.members()) + 1):
            owner = self.owner_of(tenant)
            if owner == self.self_id:
                return await self.grant(tenant, self.self_id, token, limit)
            try:
                got = await self.call(owner, "reserve", {"tenant": tenant, "replica": self.self_id,
                                                         "token": token, "limit": limit})
            except PeerUnreachable:
                self.mark_dead(owner)  # the ring moves on: ask the next owner
                continue
            except PeerFailed as exc:
                raise QuotaUnavailable(
                    f"the gateway replica {owner!r} keeping tenant {_tenant_name(tenant)!r}'s instance count did not "
                    f"answer ({exc}); nothing was created: retry") from None
            count = got.get("count")
            return bool(got.get("granted")), count if isinstance(count, int) else limit
        raise QuotaUnavailable(f"no gateway replica could count tenant {_tenant_name(tenant)!r}'s instances; retry")

    async def release(self, tenant: str, token: str | None) -> None:
        """Give a token back (instance deleted, expired or never created). Best effort: a release the owner
        never gets is corrected by its next sync."""
        if token is None:
            return
        self.pending.get(tenant, set()).discard(token)
        owner = self.owner_of(tenant)
        if owner == self.self_id:
            self.ledger_release(tenant, token)
            return
        with contextlib.suppress(PeerUnreachable, PeerFailed):
            await self.call(owner, "release", {"tenant": tenant, "token": token})

    # -- this replica as the owner of record ----------------------------------------------------------------
    async def grant(self, tenant: str, replica: str, token: str, limit: int | None) -> tuple[bool, int]:
        """The owner's decision on a reservation: (granted, the tenant's count before it)."""
        ledger = await self.synced(tenant)
        count = ledger.count()
        return ledger.reserve(replica, token, limit, self.clock()), count

    def ledger_release(self, tenant: str, token: str) -> None:
        ledger = self.ledgers.get(tenant)
        if ledger is not None:
            ledger.release(token, self.clock())

    async def synced(self, tenant: str) -> InstanceLedger:
        """The tenant's ledger, synced first when the replica set changed since, or it is ``sync_s`` old."""
        lock = self._sync_locks.setdefault(tenant, asyncio.Lock())
        async with lock:
            ledger = self.ledgers.setdefault(tenant, InstanceLedger())
            if ledger.synced_with != frozenset(self.members()) or self.clock() - ledger.synced_at > self.sync_s:
                await self.sync(tenant, ledger)
            return ledger

    async def sync(self, tenant: str, ledger: InstanceLedger) -> None:
        """Ask every live replica for the tenant's tokens and rebuild the ledger from the answers."""
        started = self.clock()
        members = self.members()
        reports: dict[str, tuple[list[str], list[str]]] = {self.self_id: self.held_tokens(tenant)}
        peers = [r for r in members if r != self.self_id]

        async def ask(replica: str) -> tuple[list[str], list[str]] | None:
            try:
                got = await self.call(replica, "held", {"tenant": tenant})
            except PeerUnreachable:
                self.mark_dead(replica)
                return None
            except PeerFailed as exc:
                raise QuotaUnavailable(
                    f"gateway replica {replica!r} did not say how many instances of tenant {_tenant_name(tenant)!r} it "
                    f"holds ({exc}); nothing was created: retry") from None
            tokens, pending = got.get("tokens"), got.get("pending", [])
            if not all(isinstance(x, list) and all(isinstance(t, str) for t in x) for x in (tokens, pending)):
                raise QuotaUnavailable(f"gateway replica {replica!r} answered an invalid instance count; retry")
            return tokens, pending  # type: ignore[return-value]

        answers = await asyncio.gather(*(ask(r) for r in peers))
        reached = [self.self_id]
        for replica, tokens in zip(peers, answers, strict=True):
            if tokens is not None:
                reports[replica] = tokens
                reached.append(replica)
        ledger.apply_sync(reports, started, reached, self.clock())
        ledger.synced_with = frozenset(self.members())

    async def reconcile(self) -> None:
        """Re-sync the ledgers of the tenants this replica owns; forget the others (another replica owns
        them now and syncs before it counts)."""
        for tenant in list(self.ledgers):
            if self.owner_of(tenant) != self.self_id:
                del self.ledgers[tenant]
                continue
            with contextlib.suppress(QuotaUnavailable):
                lock = self._sync_locks.setdefault(tenant, asyncio.Lock())
                async with lock:
                    await self.sync(tenant, self.ledgers[tenant])

    async def run(self) -> None:
        """Reconcile every ``sync_s`` seconds (the routing layer runs it while it runs)."""
        while True:
            await asyncio.sleep(self.sync_s)
            await self.reconcile()
