"""Start the real gateway process (``python -m gateway``) for black-box HTTP tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from service.embedded.tansu import free_port

FAST_ENV = {
    "GATEWAY_CONSUMER_SESSION_TIMEOUT_MS": "2000",
    "GATEWAY_CONSUMER_HEARTBEAT_INTERVAL_MS": "300",
    "GATEWAY_LOG_LEVEL": "warning",
}


class GatewayProcess:
    def __init__(self, bootstrap: str, env: dict[str, str] | None = None, log_file: Path | None = None,
                 base_env: dict[str, str] = FAST_ENV, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **base_env, "GATEWAY_KAFKA_BOOTSTRAP": bootstrap, "GATEWAY_PORT": str(self.port),
                    **(env or {})}
        self.log_file = log_file
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.launch()
        self.wait_healthy()

    def launch(self) -> None:
        """Start the process without waiting for it (several replicas boot in parallel; then
        :meth:`wait_healthy` each)."""
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=self.env, stdout=out,
                                     stderr=subprocess.STDOUT, cwd=self.cwd)

    def wait_healthy(self) -> None:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start (exit {self.proc.poll()}); see {self.log_file}")
            time.sleep(0.05)  # waiting for an external process to bind its port

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        """kill -9: no drain, no LeaveGroup, no final commit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (from /proc)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def cmdline(pid: int) -> str:
    """A process's command line, arguments joined by spaces (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def tenants_gateway(bootstrap: str, tenants_yaml: str, directory: Path, *, name: str = "gw",
                    env: dict[str, str] | None = None, **kwargs: Any) -> GatewayProcess:
    """A gateway process (not started) serving the tenants of ``tenants_yaml``, written to
    ``directory/<name>-tenants.yaml``; its log in ``directory/<name>.log``."""
    path = Path(directory) / f"{name}-tenants.yaml"
    path.write_text(tenants_yaml)
    return GatewayProcess(bootstrap, {"GATEWAY_TENANTS_FILE": str(path), **(env or {})},
                          Path(directory) / f"{name}.log", **kwargs)


def start_replicas(bootstrap: str, directory: Path, token: str, env: dict[str, str] | None = None,
                   ids: str = "ab", timeout: float = 30.0) -> list[GatewayProcess]:
    """Replicas of one gateway (ids ``a``, ``b``, ...) that know each other as peers, with the peer token;
    returned once each is healthy and sees them all. The caller stops them (all are stopped on a failure)."""
    procs = [GatewayProcess(bootstrap, log_file=Path(directory) / f"gw-{rid}.log") for rid in ids]
    peers = ",".join(p.url for p in procs)
    for rid, p in zip(ids, procs, strict=True):
        p.env.update({"GATEWAY_REPLICA_ID": rid, "GATEWAY_PEERS": peers, "GATEWAY_PEER_REFRESH_S": "0.2",
                      "GATEWAY_PEER_TOKEN": token, **(env or {})})
    for p in procs:
        p.launch()
    try:
        for p in procs:
            p.wait_healthy()
        deadline = time.monotonic() + timeout
        for p in procs:  # until each sees all
            while httpx.get(f"{p.url}/internal/peers", headers={"x-kcg-peer-token": token}).json()["placement"] \
                    != sorted(ids):
                assert time.monotonic() < deadline, f"replicas {ids} did not see each other in {timeout} s"
                time.sleep(0.05)  # polling a condition: the peer refresh runs every 0.2 s
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def tenants_replicas(bootstrap: str, tenants_yaml: str, directory: Path, token: str,
                     env: dict[str, str] | None = None, ids: str = "ab") -> list[GatewayProcess]:
    """:func:`start_replicas` serving the tenants of ``tenants_yaml`` (written to ``directory/tenants.yaml``),
    their quota view synced every second (a cap counted across the set is seen soon); the caller stops them."""
    path = Path(directory) / "tenants.yaml"
    path.write_text(tenants_yaml)
    return start_replicas(bootstrap, directory, token, {"GATEWAY_TENANTS_FILE": str(path),
                                                        "GATEWAY_QUOTA_SYNC_S": "1", **(env or {})}, ids)
