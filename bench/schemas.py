"""Schema'd records: rows per second next to their binary baseline, in the same run.

One embedded Tansu broker (memory://), a real Schema Registry (Karapace via ../shared/registry/start, on a
broker of its own), one real gateway process pointed at it (production settings). Two topics of 4
partitions with N records each, as in bench/schema_consume.py: ``cap-binary`` (100-byte values) and
``cap-avro`` (~100-byte Avro records in the Confluent wire format, confluent-kafka's AvroSerializer).

Rows (each: the time to read all N records; median of ``--rounds`` rounds; the baseline row of each is
measured in the same round, so the ratio compares them under the same machine load):

- ``binary range read into Arrow``: ``GET /topics/cap-binary/partitions/{p}/records`` with ``Accept:
  application/vnd.apache.arrow.stream``, page after page (``max_bytes`` 8 MiB), partition after partition;
- ``avro range read into Arrow``: the same over ``cap-avro`` with ``format=avro`` and the reader schema
  pinned (``value_schema_id``), i.e. typed columns (target >= 200k rows/s). Every page's rows are counted
  and the typed ``value`` column must hold no null (every record decoded).

More rows: add a :class:`Row` to :func:`rows` (a name, a function ``(ctx) -> records read``, the baseline
row's name, a target); they run in the same rounds.

Usage: .venv/bin/python bench/schemas.py [--records N] [--rounds R] [--gateway-env KEY=VALUE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.consume import produce as produce_binary  # noqa: E402
from bench.http_consume import GatewayProc, create_topics  # noqa: E402
from bench.schema_consume import PARTITIONS, produce_avro, start_registry, stop_pid  # noqa: E402
from service.embedded.tansu import EmbeddedBroker  # noqa: E402

ARROW = "application/vnd.apache.arrow.stream"
PAGE_BYTES = 8 * 1024 * 1024


@dataclass
class Context:
    """What a row needs: the gateway, the record count, the topics, the registry."""

    url: str
    records: int
    registry: str
    avro_schema_id: int


@dataclass
class Row:
    name: str
    run: Callable[[Context], int]  # reads; returns the records read (must be ctx.records)
    baseline: str | None = None  # the row it is compared with
    target: str = ""


def range_read(ctx: Context, topic: str, params: dict[str, Any], check: Callable[[pa.Table], None] | None = None
               ) -> int:
    """Every partition of ``topic`` read through the offset-range endpoint as Arrow, page by page."""
    got = 0
    with httpx.Client(base_url=ctx.url, timeout=120, headers={"Accept": ARROW}) as http:
        for p in range(PARTITIONS):
            offset = 0
            while True:
                r = http.get(f"/topics/{topic}/partitions/{p}/records",
                             params={"offset": offset, "max_bytes": PAGE_BYTES, **params})
                r.raise_for_status()
                table = pa.ipc.open_stream(r.content).read_all()
                if check is not None and table.num_rows:
                    check(table)
                got += table.num_rows
                offset = int(r.headers["X-Next-Offset"])
                if offset >= int(r.headers["X-End-Offset"]):
                    break
    return got


def _all_decoded(table: pa.Table) -> None:
    assert table.column("value").null_count == 0, "undecoded rows"
    assert pa.types.is_struct(table.schema.field("value").type)


def rows() -> list[Row]:
    return [
        Row("binary range read into Arrow", lambda c: range_read(c, "cap-binary", {})),
        Row("avro range read into Arrow",
            lambda c: range_read(c, "cap-avro", {"format": "avro", "value_schema_id": c.avro_schema_id},
                                 _all_decoded),
            baseline="binary range read into Arrow", target=">= 200k rows/s"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gateway-env", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    n = a.records
    tmp = Path(tempfile.mkdtemp(prefix="bench-schemas-"))
    reg_broker, registry, reg_pid = start_registry(tmp)
    broker = EmbeddedBroker()
    broker.start()
    try:
        asyncio.run(create_topics(broker.bootstrap, {"cap-binary": PARTITIONS, "cap-avro": PARTITIONS}))
        t = time.perf_counter()
        produce_binary(broker.bootstrap, "cap-binary", n, PARTITIONS, "none")
        size = produce_avro(broker.bootstrap, registry, "cap-avro", n)
        print(f"machine: {os.cpu_count()} cores shared by brokers, registry, gateway and clients; produced {n:,} "
              f"binary (100 B) + {n:,} avro ({size} B framed) records in {time.perf_counter() - t:.1f} s", flush=True)
        sid = httpx.get(f"{registry}/subjects/cap-avro-value/versions/latest", timeout=30).json()["id"]
        env = {"GATEWAY_SCHEMA_REGISTRY_URL": registry, **dict(kv.split("=", 1) for kv in a.gateway_env)}
        table = rows()
        rates: dict[str, list[float]] = {r.name: [] for r in table}
        with GatewayProc(broker.bootstrap, env, tmp / "gateway.log") as gw:
            ctx = Context(gw.url, n, registry, int(sid))
            for row in table:  # warm-up: imports, registry look-ups, compiled readers
                row.run(Context(ctx.url, ctx.records, ctx.registry, ctx.avro_schema_id))
            for r in range(a.rounds):
                for row in table:
                    t0 = time.perf_counter()
                    got = row.run(ctx)
                    elapsed = time.perf_counter() - t0
                    assert got == n, (row.name, got, n)
                    rates[row.name].append(n / elapsed)
                print(f"  round {r + 1}: " + ", ".join(f"{k}: {v[-1]:,.0f}/s" for k, v in rates.items()), flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"\n{n:,} records, {PARTITIONS} partitions, one reader, one request at a time; median of {a.rounds} "
              f"rounds\n{'row':34} {'rows/s':>11} {'vs baseline':>11} {'target':>16}")
        for row in table:
            ratio = f"{med[row.name] / med[row.baseline]:.2f}" if row.baseline else "1.00"
            print(f"{row.name:34} {med[row.name]:>11,.0f} {ratio:>11} {row.target:>16}")
        print("(vs baseline = the row's binary counterpart, measured in the same rounds)")
    finally:
        broker.stop()
        stop_pid(reg_pid)
        reg_broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
