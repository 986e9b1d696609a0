"""bench/share.py with tiny numbers on the session Apache Kafka broker, so the bench cannot rot: both rows (HTTP
share consumers, Java KafkaShareConsumer) read every record and every acknowledgement is applied."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from service.embedded.kafka import EmbeddedKafka
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_share_bench_smoke(kafka: EmbeddedKafka) -> None:
    n = 300
    out = subprocess.run([sys.executable, "bench/share.py", "--records", str(n), "--partitions", "2", "--workers",
                          "2", "--max-records", "50", "--bootstrap", kafka.bootstrap],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines()
            if line.startswith("| ") and "---" not in line and not line.startswith("| client")}
    assert set(rows) == {"gateway, HTTP share consumers", "Java KafkaShareConsumer 4.4.0"}, out.stdout
    for line in rows.values():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert float(cells[1].replace(",", "")) > 0, line  # records/s
        assert int(cells[5].replace(",", "")) >= n, line  # deliveries: at least every record once
    assert re.search(rf"\b{n} acknowledgements applied, 0 not\b", rows["gateway, HTTP share consumers"]), rows
