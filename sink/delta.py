"""Idempotent Delta appends from ``foreachBatch`` with delta-rs (``deltalake``).

Each micro-batch is appended in one Delta commit that also records the transaction ``(app id, batch id)``
(Delta's ``txn`` action, delta-rs ``CommitProperties(app_transactions=...)``). A batch whose id is at or below
the table's recorded version for the app id was committed before (Spark replays the last batch after a crash
between the table commit and its own commit log), and is skipped. The app id is the streaming query's id from
the checkpoint's ``metadata`` file, so it is stable across restarts of the same checkpoint; every reader of the
table (delta-rs, pyarrow through it, Spark with delta-spark, DuckDB) sees each record exactly once.
"""

from __future__ import annotations

import json
import os
from typing import Any

APP_PREFIX = "kafka-gateway-sink:"


def local_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def checkpoint_app_id(checkpoint: str) -> str:
    with open(os.path.join(local_path(checkpoint), "metadata")) as f:
        return APP_PREFIX + str(json.load(f)["id"])


def committed_version(table: str, app_id: str) -> int | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        dt = DeltaTable(table)
    except TableNotFoundError:
        return None
    v = dt.transaction_version(app_id)
    return None if v is None else int(v)


def append_batch(table: str, data: Any, app_id: str, batch_id: int, merge_schema: bool = False) -> bool:
    """Append ``data`` (an Arrow table) as batch ``batch_id`` of ``app_id``; False if it was already there.
    ``merge_schema``: a typed table whose reader schema gained fields since the table was made gets them as
    new columns (delta-rs ``schema_mode="merge"``)."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    done = committed_version(table, app_id)
    if done is not None and done >= batch_id:
        return False
    extra: dict[str, Any] = {"schema_mode": "merge"} if merge_schema else {}
    write_deltalake(table, data, mode="append", **extra, commit_properties=CommitProperties(
        app_transactions=[Transaction(app_id, batch_id)],
        custom_metadata={"kafka_gateway_sink.batch_id": str(batch_id)}))
    return True


class DeltaBatchWriter:
    """The ``foreachBatch`` function (runs on the driver)."""

    def __init__(self, table: str, checkpoint: str, merge_schema: bool = False) -> None:
        self.table = local_path(table)
        self.checkpoint = checkpoint
        self.merge_schema = merge_schema
        self.written = 0
        self.skipped = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        data = df.toArrow()
        if data.num_rows == 0:
            return
        if append_batch(self.table, data, checkpoint_app_id(self.checkpoint), batch_id,
                        getattr(self, "merge_schema", False)):
            self.written += 1
        else:
            self.skipped += 1
