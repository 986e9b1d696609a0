"""Mirror the sink's progress into a consumer group through the gateway (for lag dashboards only).

A consumer instance with manual assignment commits each micro-batch's end offsets (``POST .../offsets`` commits
offset + 1, so the next offset ``n`` is sent as ``n - 1``; partitions still at 0 are left out). The Spark
checkpoint stays the source of truth: a failed commit is reported and retried with the next batch.
"""

from __future__ import annotations

import uuid

from sink.http import GatewayHTTP, GatewayHTTPError, quote
from sink.source import parse_key


class GroupCommitter:
    def __init__(self, gateway: str, group: str, api_key: str | None = None) -> None:
        self.http = GatewayHTTP(gateway, api_key)
        self.group = group
        self.instance: str | None = None
        self.assigned: set[str] = set()

    def _base(self) -> str:
        return f"/consumers/{quote(self.group)}/instances/{quote(self.instance or '')}"

    def _create(self) -> None:
        name = f"spark-sink-{uuid.uuid4().hex[:12]}"
        self.http.call("POST", f"/consumers/{quote(self.group)}", f"create a consumer in group {self.group!r}",
                       body={"name": name, "format": "binary", "auto.commit.enable": "false"})
        self.instance, self.assigned = name, set()

    def _assign(self, keys: set[str]) -> None:
        parts = [{"topic": t, "partition": p} for t, p in sorted(map(parse_key, keys))]
        self.http.call("POST", self._base() + "/assignments", "assign partitions", body={"partitions": parts})
        self.assigned = set(keys)

    def commit(self, offsets: dict[str, int]) -> None:
        todo = {k: int(v) for k, v in offsets.items() if int(v) > 0}
        if not todo:
            return
        for attempt in (0, 1):
            try:
                if self.instance is None:
                    self._create()
                if not set(todo) <= self.assigned:
                    self._assign(self.assigned | set(todo))
                body = {"offsets": [{"topic": t, "partition": p, "offset": todo[k] - 1}
                                    for k in sorted(todo) for t, p in [parse_key(k)]]}
                self.http.call("POST", self._base() + "/offsets", f"commit offsets to group {self.group!r}",
                               body=body)
                return
            except GatewayHTTPError as e:
                if attempt == 0 and e.status in (404, 410):  # the instance expired: make a new one
                    self.instance = None
                    continue
                raise

    def committed(self, keys: list[str]) -> dict[str, int]:
        if self.instance is None:
            return {}
        parts = [{"topic": t, "partition": p} for t, p in map(parse_key, keys)]
        _, payload = self.http.call("GET", self._base() + "/offsets", "committed offsets",
                                    body={"partitions": parts})
        import json

        return {f"{o['topic']}:{o['partition']}": int(o["offset"]) for o in json.loads(payload)["offsets"]}

    def close(self) -> None:
        if self.instance is not None:
            try:
                self.http.call("DELETE", self._base(), "delete the consumer instance")
            except Exception:
                pass
            self.instance = None
        self.http.close()
