"""Every index, count and size argument of the C entry points, out of range: refused with a Python exception
(IndexError, ValueError, OverflowError, TypeError), never read out of bounds. Each case runs in its own child
process, so a crash (or, under ``make fuzz``, an AddressSanitizer report) fails that case, not the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.twins import covers

ROOT = Path(__file__).resolve().parents[2]
REFUSED = ("IndexError", "ValueError", "OverflowError", "TypeError", "MemoryError")

PRELUDE = """
from service.protocol import records as R
from service.protocol.records import Record, build_batch
from service.schemas import avro_fast
from service.producer import encoding
from service.producer.errors import RecordMetadata
C = R._crecords
A = avro_fast._cavro
P = encoding._cproduce
recs = [Record(i, 0, b"k", b"v" * i, ()) for i in range(4)]
blob = build_batch(recs)
(b,) = list(R.iter_batches(blob))
run = C.RecordRun(blob, Record)
run.add(b._start, b._end, b.records_count, 0, 0, None)
"""

# name -> (entry point it covers, the call)
CASES: dict[str, tuple[str, str]] = {
    "take_budget list i<0": ("_crecords.take_budget", "C.take_budget(recs, -3, 2, 100, False)"),
    "take_budget list i=-1": ("_crecords.take_budget", "C.take_budget(recs, -1, 4, 100, False)"),
    "take_budget list huge negative i": ("_crecords.take_budget", "C.take_budget(recs, -(2**62), 1, 10, True)"),
    "take_budget run i<0": ("_crecords.take_budget", "C.take_budget(run, -3, 2, 100, False)"),
    "decode_records start<0": ("_crecords.decode_records",
                               "C.decode_records(blob, -5, len(blob), 1, 0, 0, None, Record)"),
    "decode_records end past buf": ("_crecords.decode_records",
                                    "C.decode_records(blob, b._start, len(blob) + 9, 4, 0, 0, None, Record)"),
    "decode_records end<start": ("_crecords.decode_records",
                                 "C.decode_records(blob, b._end, b._start, 4, 0, 0, None, Record)"),
    "decode_records count<0": ("_crecords.decode_records",
                               "C.decode_records(blob, b._start, b._end, -1, 0, 0, None, Record)"),
    "decode_records count huge": ("_crecords.decode_records",
                                  "C.decode_records(blob, b._start, b._end, 2**62, 0, 0, None, Record)"),
    "RecordRun.add start<0": ("_crecords.RecordRun.add", "run.add(-1, b._end, 4, 0, 0, None)"),
    "RecordRun.add end past data": ("_crecords.RecordRun.add", "run.add(b._start, len(blob) + 1, 4, 0, 0, None)"),
    "RecordRun.add count huge": ("_crecords.RecordRun.add", "run.add(b._start, b._end, 2**62, 0, 0, None)"),
    "RecordRun.offset past end": ("_crecords.RecordRun.offset", "run.offset(4)"),
    "RecordRun.offset before start": ("_crecords.RecordRun.offset", "run.offset(-5)"),
    "RecordRun.offset huge": ("_crecords.RecordRun.offset", "run.offset(2**62)"),
    "RecordRun[i] past end": ("_crecords.RecordRun", "run[4]"),
    "RecordRun[i] before start": ("_crecords.RecordRun", "run[-5]"),
    "RecordRun.payload too many args": ("_crecords.RecordRun.payload", "run.payload(1, 2)"),
    "frame_buffer negative": ("_crecords.frame_buffer", "C.frame_buffer(-1)"),
    "frame_buffer huge": ("_crecords.frame_buffer", "C.frame_buffer(2**62)"),
    "compile child out of range": ("_cavro.compile", "A.compile([(11, 0, 5, (), ())])"),
    "compile negative kid": ("_cavro.compile", "A.compile([(13, 0, -1, (-2,), (b'',))])"),
    "compile negative size": ("_cavro.compile", "A.compile([(8, -4, -1, (), ())])"),
    "compile bad kind": ("_cavro.compile", "A.compile([(99, 0, -1, (), ())])"),
    "metas n<0": ("_cproduce.metas", "P.metas(RecordMetadata, 0, 0, -1)"),
    "metas n huge": ("_cproduce.metas", "P.metas(RecordMetadata, 0, 0, 2**62)"),
    "render_offset_runs first<0": ("_cproduce.render_offset_runs",
                                   "P.render_offset_runs([(-1, 0, 0, 2)], 1) or P.x"),
    "render_offset_runs count past n": ("_cproduce.render_offset_runs",
                                        "P.render_offset_runs([(0, 0, 0, 2**40)], 2) or P.x"),
    "render_offset_runs n<0": ("_cproduce.render_offset_runs", "P.render_offset_runs([], -1) or P.x"),
    "render_offset_runs count<0": ("_cproduce.render_offset_runs",
                                   "P.render_offset_runs([(0, 0, 0, -1)], 0) or P.x"),
}
# ``... or P.x``: None (declined) is a refusal too; P.x raises AttributeError, reported as declined


def _run(call: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + f"""
try:
    out = {call}
except AttributeError as e:
    print("REFUSED declined")
except BaseException as e:
    print("REFUSED", type(e).__name__, str(e)[:200])
else:
    print("RETURNED", repr(out)[:200])
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                          cwd=ROOT, check=False)


@covers(*sorted({entry for entry, _ in CASES.values()}))
@pytest.mark.parametrize("name", list(CASES))
def test_an_out_of_range_argument_is_refused(name: str) -> None:
    _, call = CASES[name]
    proc = _run(call)
    assert proc.returncode == 0, f"{call}: the process died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    assert "ERROR: AddressSanitizer" not in proc.stderr and "runtime error:" not in proc.stderr, proc.stderr[-3000:]
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith("REFUSED"), f"{call} -> {out}"
    assert out == "REFUSED declined" or out.split()[1] in REFUSED, out
