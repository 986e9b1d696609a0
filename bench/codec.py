"""Record batch decode throughput: our C and pure-Python decoders next to kafka-python's.

Run: .venv/bin/python bench/codec.py [--records N] [--repeat R]

Every decoder does the full consumer-side job on the same blob: walk the batches, check each
batch CRC, decompress, and materialise every record (offset, timestamp, key, value, headers).
kafka-python ships no lz4 binding here, so for the lz4 rows its decoder is given cramjam's
lz4 frame decompressor (the same library ours uses): the comparison is of record parsing.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VALUE_SIZE = 100


def make_blob(records_total: int, per_batch: int, compression: int) -> tuple[bytes, int]:
    from service.protocol import records as R

    parts = []
    ts = 1_700_000_000_000
    for start in range(0, records_total, per_batch):
        n = min(per_batch, records_total - start)
        rows = []
        for i in range(start, start + n):
            # JSON-ish, partly repetitive values: lz4 gets a realistic ~2-4x, not a degenerate 50x
            v = (b'{"id":%d,"user":"user-%d","event":"page_view","path":"/items/%d"' % (i, i % 997, i * 7919 % 100_003))
            v = (v + b',"pad":"' + (b"%08x" % (i * 2654435761 % 2**32)) * 8)[: VALUE_SIZE - 2] + b'"}'
            rows.append((None, v, (), ts + i))
        parts.append(R.build_batch(rows, base_offset=start, compression=compression, producer_id=1000,
                                   producer_epoch=0, base_sequence=start))
    return b"".join(parts), records_total


def ours(use_c: bool) -> Callable[[bytes], int]:
    from service.protocol import records as R

    def run(blob: bytes) -> int:
        R.use_c_extension(use_c)
        n = 0
        keep = []
        for batch in R.iter_batches(blob, topic="bench", partition=0):
            recs = batch.decode()
            keep.append(recs)
            n += len(recs)
        return n

    return run


def kafka_python() -> Callable[[bytes], int]:
    import cramjam
    import kafka.codec as kc
    import kafka.record.default_records as dr
    from kafka.record.memory_records import MemoryRecords

    if not kc.has_lz4():
        kc.lz4 = object()  # only flips has_lz4(); decoding goes through the function below
        dr.lz4_decode = lambda b: bytes(cramjam.lz4.decompress(b))

    def run(blob: bytes) -> int:
        n = 0
        keep = []
        mr = MemoryRecords(blob)
        while (batch := mr.next_batch()) is not None:
            if not batch.validate_crc():
                raise RuntimeError("crc")
            recs = list(batch)
            keep.append(recs)
            n += len(recs)
        return n

    return run


def measure(fn: Callable[[bytes], int], blob: bytes, expected: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        n = fn(blob)
        dt = time.perf_counter() - t0
        if n != expected:
            raise RuntimeError(f"decoded {n} records, expected {expected}")
        best = min(best, dt)
    return best


def main(argv: list[str] | None = None) -> int:
    from service.protocol import records as R

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    decoders: list[tuple[str, Callable[[bytes], int]]] = []
    if R.C_EXTENSION_AVAILABLE:
        decoders.append(("ours (C)", ours(True)))
    else:
        print(f"!! C extension not available ({R._C_IMPORT_ERROR}); only the pure-Python path runs")
    decoders.append(("ours (pure Python)", ours(False)))
    decoders.append(("kafka-python", kafka_python()))

    scenarios: list[tuple[str, int, int]] = [
        ("uncompressed, 128 rec/batch", 0, 128),
        ("lz4,          128 rec/batch", 3, 128),
        ("uncompressed,   8 rec/batch", 0, 8),
    ]
    print(f"python {sys.version.split()[0]}, {args.records:,} records of {VALUE_SIZE}-byte values "
          f"(null key, no headers), CRC checked, best of {args.repeat}\n")
    print(f"{'scenario':30} {'decoder':20} {'records/s':>12} {'MB/s wire':>10} {'MB/s data':>10}"
          f" {'vs kafka-python':>16}")
    t_start = time.perf_counter()
    results: dict[str, Any] = {}
    for name, codec, per_batch in scenarios:
        blob, n = make_blob(args.records, per_batch, codec)
        raw_size = len(make_blob(args.records, per_batch, 0)[0]) if codec else len(blob)
        rates = {}
        for dname, fn in decoders:
            dt = measure(fn, blob, n, args.repeat)
            rates[dname] = (n / dt, len(blob) / dt / 1e6, raw_size / dt / 1e6)
        base = rates["kafka-python"][0]
        for dname, (rps, mbw, mbd) in rates.items():
            print(f"{name:30} {dname:20} {rps:12,.0f} {mbw:10.1f} {mbd:10.1f} {rps / base:15.2f}x")
        print()
        results[name] = rates
    R.use_c_extension(R.C_EXTENSION_AVAILABLE)
    print(f"total bench time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
