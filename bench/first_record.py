"""Time from subscribe to the first record, as a new user sees it after ``make run``.

Starts the gateway exactly as ``make run`` does (no ``GATEWAY_KAFKA_BOOTSTRAP``: the embedded Tansu broker,
default settings), produces one record with confluent-kafka, then creates a consumer (Confluent v2 request),
subscribes and long-polls until the record arrives. Prints the subscribe→first-record time per round,
beside the same flow with Kafka's external-broker defaults (45 s session) when ``--with-kafka-defaults``.

    .venv/bin/python bench/first_record.py [--rounds 3] [--with-kafka-defaults]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from confluent_kafka import Producer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.embedded.tansu import free_port  # noqa: E402

V2 = {"Content-Type": "application/vnd.kafka.v2+json"}


def start_gateway(env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    full.update(env, GATEWAY_PORT=str(port), GATEWAY_LOG_LEVEL="warning",
                GATEWAY_DEFAULT_REQUESTS_PER_SECOND="0")  # a benchmark is one tenant at full speed
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=full, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    bootstrap = None
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"Kafka bootstrap address: (\S+)", line)
        if m:
            bootstrap = m.group(1)
        if line.startswith("gateway HTTP on"):
            break
    if bootstrap is None:
        raise SystemExit("the gateway did not start an embedded broker")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url, bootstrap
        except httpx.TransportError:
            time.sleep(0.05)
    raise SystemExit("the gateway did not answer /healthz")


def one_round(url: str, bootstrap: str) -> float:
    topic = f"first-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, b"hello")
    p.flush(10)
    group = f"g-{topic}"
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.post(f"/consumers/{group}", headers=V2, json={"name": "c1", "format": "binary",
                                                               "auto.offset.reset": "earliest"})
        r.raise_for_status()
        base = f"/consumers/{group}/instances/c1"
        started = time.monotonic()
        http.post(f"{base}/subscription", headers=V2, json={"topics": [topic]}).raise_for_status()
        while True:
            r = http.get(f"{base}/records", params={"timeout": 10000},
                         headers={"Accept": "application/vnd.kafka.binary.v2+json"})
            r.raise_for_status()
            if r.json():
                took = time.monotonic() - started
                break
            if time.monotonic() - started > 120:
                raise SystemExit("no record within 120 s")
        http.delete(base)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--with-kafka-defaults", action="store_true",
                    help="also measure with Kafka's 45 s session / 3 s heartbeat (the external-broker defaults)")
    args = ap.parse_args()
    setups = [("embedded defaults (make run)", {})]
    if args.with_kafka_defaults:
        setups.append(("Kafka defaults (45 s session)", {"GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "45000",
                                                         "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": "3000"}))
    for label, env in setups:
        proc, url, bootstrap = start_gateway(env)
        try:
            times = [one_round(url, bootstrap) for _ in range(args.rounds)]
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"{label:32s} subscribe -> first record: " + ", ".join(f"{t:.2f} s" for t in times))


if __name__ == "__main__":
    main()
