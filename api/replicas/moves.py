"""Scale-out and scale-in with durable instances: after every refresh of the peer set, the instances this
replica holds whose ring owner is now another live, settled replica are handed off to it, one at a time
(:meth:`~service.instances.registry.Gateway.move_instance`); their next request reaches the new owner, which re-creates
them. Which ones move is decided by :mod:`service.durable.moves` (sans-io); instances whose owner did not
change stay. ``GATEWAY_INSTANCE_MOVE_AFTER_S``: how long a peer must have been up before instances move to it
(a flapping peer moves nothing); ``GATEWAY_MOVE_INSTANCES=false``: instances stay where they are."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from service.durable.moves import AliveSince, Move, PeerState, instances_to_move
from service.instances.registry import Gateway
from service.ring import PeerTable
from service.settings import Settings

log = logging.getLogger(__name__)

#: at shutdown, how long a move in progress may take to finish (its close: commit, LeaveGroup) before it is cancelled
STOP_WAIT_S = 3.0


class InstanceMoves:
    """Moves of the :class:`~api.replicas.router.Router` (run after each peer refresh)."""

    settings: Settings
    gateway: Gateway
    table: PeerTable
    alive_since: AliveSince
    _move_task: asyncio.Task[None] | None

    def check_moves(self, now: float | None = None) -> list[Move]:
        """Note which peers are up since when and start handing off the instances that moved (unless a round
        is still running); returns them."""
        now = time.monotonic() if now is None else now
        self.alive_since.observe((PeerState(p.replica_id, p.alive, p.draining, p.boot)
                                  for p in self.table.peers.values()), now)
        gw = self.gateway
        if not gw.durable_instances or not self.settings.move_instances or gw.draining:
            return []
        if self._move_task is not None and not self._move_task.done():
            return []
        moves = self._moves(now)
        if moves:
            self._move_task = asyncio.create_task(self._move(moves), name="instance-moves")
        return moves

    def _moves(self, now: float, only: Move | None = None) -> list[Move]:
        self.table.self_draining = self.gateway.draining
        gw = self.gateway
        held = ([(only.tenant, only.group, only.name)] if only is not None else
                [(rt.tenant_id, g, n) for rt in gw.tenants.values() for (g, n) in rt.instances])
        return instances_to_move(held, self.table.self_id, self.table.placement_ids(), self.alive_since.since(),
                                 now, self.settings.instance_move_after_s)

    async def _move(self, moves: list[Move]) -> None:
        """One instance at a time, each checked again first (the ring may have changed since)."""
        for m in moves:
            if self.gateway.draining:
                return
            if m not in self._moves(time.monotonic(), only=m):
                continue
            try:
                await self.gateway.move_instance(m.tenant, m.group, m.name, m.target)
            except Exception:
                log.exception("moving consumer instance %s (group %s) to replica %s failed", m.name, m.group,
                              m.target)

    async def stop_moves(self) -> None:
        """At shutdown: a move in progress ends (it gives up once the gateway drains; a close already started
        completes), then the task is cancelled if it is still running."""
        task = self._move_task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
