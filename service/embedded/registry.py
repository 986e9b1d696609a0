"""The embedded Schema Registry of ``make run``: Karapace next to the embedded Tansu broker.

When the gateway runs on its embedded broker, GATEWAY_SCHEMA_REGISTRY_URL is unset and GATEWAY_EMBEDDED_REGISTRY
allows it (``auto``: when the launcher exists), the gateway starts a real registry with the launcher of
``../shared/registry`` (or GATEWAY_REGISTRY_LAUNCHER) *without delaying its own start*:

1. ``start --install-only`` builds the registry's venv if needed (about 35 s the first time; the launcher's
   progress lines are passed on) and prints the venv;
2. ``start --bootstrap ... --port N --venv VENV`` in the foreground: the launcher ``exec``s the registry, so the
   child we started *is* the registry. It gets its own session (a Ctrl-C in the terminal reaches the gateway,
   which drains first and then stops the registry) and the parent-death signal (a ``kill -9`` of the gateway
   takes it down too: it never outlives the gateway, unlike the launcher's detached ``--background`` mode);
3. readiness is polled like the launcher does it: ``GET /subjects`` answers 200 and ``/master_available`` is
   true (Karapace answers reads before its master election is done, but not writes).

Meanwhile :class:`~service.schemas.formats.SchemaService` has a *pending* default registry: schema'd requests
answer 503/50307 with Retry-After. Ready: the registry becomes the gateway-wide default. Failed: the launcher's
error is logged with the end of the registry's log, the default is cleared (schema'd requests answer
422/42211 naming the setting) and the gateway keeps serving. :meth:`EmbeddedRegistry.stop` (SIGTERM to the
registry's process group, then SIGKILL after a grace period) runs when the gateway stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from service.embedded.tansu import free_port
from service.schemas.formats import SchemaService
from service.settings import Settings

log = logging.getLogger("gateway.registry")

#: the launcher beside the repository (``../shared/registry/start``)
DEFAULT_LAUNCHER = Path(__file__).resolve().parents[2].parent / "shared" / "registry" / "start"
#: Tansu holds the registry's master-election JoinGroup for about half the session timeout: 6 s makes the
#: registry ready in ~4.5 s instead of ~6.5 s (below ~5 s its 3 s heartbeats would not fit)
SESSION_TIMEOUT_MS = "6000"
#: the registry must take writes this long after the launcher first exec'd it (install time not included)
READY_TIMEOUT_S = 60.0
#: a registry whose HTTP answers but whose master election has not completed this long after is restarted
#: (Karapace on Tansu now and then never elects itself: "No master set" forever, seen in CI); a healthy one
#: takes writes ~3 s after its HTTP is up
ELECTION_TIMEOUT_S = 15.0
#: how long the first-run install may take before it is given up
INSTALL_TIMEOUT_S = 600.0
STOP_GRACE_S = 5.0
LOG_TAIL_LINES = 30


def find_launcher(settings: Settings) -> Path | None:
    """The launcher to use: GATEWAY_REGISTRY_LAUNCHER if set (``None`` when that file is missing), else the
    default one if it exists."""
    if settings.registry_launcher:
        path = Path(settings.registry_launcher).expanduser()
        return path if path.is_file() else None
    return DEFAULT_LAUNCHER if DEFAULT_LAUNCHER.is_file() else None


def wanted(settings: Settings) -> bool:
    """Whether the conditions other than the launcher allow an embedded registry: the embedded broker
    (no GATEWAY_KAFKA_BOOTSTRAP), no GATEWAY_SCHEMA_REGISTRY_URL, and GATEWAY_EMBEDDED_REGISTRY not false."""
    return not settings.kafka_bootstrap and not settings.schema_registry_url and settings.embedded_registry is not False


def launcher_for(settings: Settings) -> Path | None:
    """The launcher of the embedded registry this gateway starts, or ``None`` (not wanted, or ``auto`` and no
    launcher: logged; GATEWAY_EMBEDDED_REGISTRY=true without one is refused earlier, by :func:`start_problem`)."""
    if not wanted(settings):
        return None
    launcher = find_launcher(settings)
    if launcher is not None:
        return launcher
    where = settings.registry_launcher or str(DEFAULT_LAUNCHER)
    if settings.registry_launcher or settings.embedded_registry is True:  # asked for explicitly: a warning
        log.warning("GATEWAY_REGISTRY_LAUNCHER=%s does not exist: no embedded schema registry", where)
    else:
        log.info("no schema registry launcher at %s: no embedded schema registry (schema'd formats need "
                 "GATEWAY_SCHEMA_REGISTRY_URL)", where)
    return None


#: variables the launcher and the registry may see: what a process needs to run (PATH, HOME, locale, temporary
#: directory, time zone), what its first-run ``pip install`` needs (cache dir, proxies, CA bundles, pip's own
#: settings) and the registry's own KARAPACE_* settings. Nothing else of the gateway's environment reaches
#: it: GATEWAY_* (peer and admin tokens, registry and SASL credentials) and whatever secrets the deployment
#: has in its environment stay in the gateway.
CHILD_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "XDG_CACHE_HOME", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})
CHILD_ENV_PREFIXES = ("LC_", "KARAPACE_", "PIP_")


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of ``environ`` (default: the gateway's) for the registry launcher's processes."""
    src = os.environ if environ is None else environ
    return {k: v for k, v in src.items() if k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES)}


def start_problem(settings: Settings) -> str | None:
    """A reason to refuse to start (GATEWAY_EMBEDDED_REGISTRY=true without a launcher), or None."""
    if settings.embedded_registry is True and wanted(settings) and find_launcher(settings) is None:
        where = settings.registry_launcher or str(DEFAULT_LAUNCHER)
        return (f"GATEWAY_EMBEDDED_REGISTRY=true but the schema registry launcher {where} does not exist "
                "(set GATEWAY_REGISTRY_LAUNCHER, or GATEWAY_SCHEMA_REGISTRY_URL to use a registry of your own)")
    return None


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# resolved in the parent: the child (forked while other threads may hold the loader's locks) only calls it
_PRCTL = _load_prctl()


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:  # pragma: no cover - runs in the child, between fork and exec
        if _PRCTL is not None:
            _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the gateway died before the death signal was armed
            os._exit(1)

    return setup


def _tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "".join(text.splitlines(True)[-lines:])


class _ElectionStalled(RuntimeError):
    """The registry's HTTP is up, its master election is not done (a restart helps)."""


class EmbeddedRegistry:
    """One embedded registry: :meth:`start` returns at once (a task installs, launches and waits for it);
    :meth:`stop` cancels that and stops the registry. Processes are started from the event loop's thread
    (the main thread in gateway/main.py): the parent-death signal follows the thread that forks."""

    def __init__(self, launcher: Path, bootstrap: str, schemas: SchemaService, settings: Settings,
                 *, port: int = 0, host: str = "127.0.0.1", python: str = sys.executable,
                 ready_timeout: float = READY_TIMEOUT_S, election_timeout: float = ELECTION_TIMEOUT_S) -> None:
        self.launcher = launcher
        self.bootstrap = bootstrap
        self.schemas = schemas
        self.settings = settings
        self.host = host
        self.port = port or free_port(host)
        self.python = python
        self.ready_timeout = ready_timeout
        self.election_timeout = election_timeout
        self.launches = 0
        self.log_file: Path | None = None
        self.ready = False
        self._proc: subprocess.Popen[bytes] | None = None  # the registry (after exec) or the installer
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> asyncio.Task[None]:
        """Mark the default registry as starting (schema'd requests: 503 + Retry-After) and start it in the
        background; call from the running event loop before the server serves."""
        self.schemas.set_default(None, pending=f"the embedded schema registry is starting ({self.url}); "
                                               "retry in a few seconds")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="embedded-registry")
        return self._task

    async def _run(self) -> None:
        try:
            venv = await self._install()
            await self._launch(venv)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: no registry, the gateway keeps serving
            self.schemas.set_default(None)
            tail = _tail(self.log_file)
            log.error("the embedded schema registry did not start: %s%s\nschema'd formats (avro, protobuf, "
                      "jsonschema) answer 422/42211 until GATEWAY_SCHEMA_REGISTRY_URL is set", exc,
                      f"\nlast lines of {self.log_file}:\n{tail.rstrip()}" if tail else "")
            await self._terminate()

    # -- install (first run: about 35 s) --------------------------------------------------------------------
    async def _install(self) -> Path:
        loop = asyncio.get_running_loop()

        def installing() -> None:
            print("embedded schema registry: installing Karapace into its own venv (first run only, under "
                  "a minute); the gateway serves meanwhile, schema'd formats answer 503 until it is ready", flush=True)
            self.schemas.set_default(None, pending="the embedded schema registry is being installed (first run, under "
                                                   "a minute); retry in a few seconds")

        proc = self._proc = self._spawn([self.python, str(self.launcher), "--install-only"], env=child_env())

        def follow() -> tuple[int, str, list[str]]:
            """(exit status, stdout, stderr lines), passing the launcher's progress lines on as they come."""
            assert proc.stderr is not None and proc.stdout is not None
            err: list[str] = []
            announced = False
            for raw in proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                err.append(line)
                if line.startswith("[registry/start] installing") and not announced:
                    announced = True
                    loop.call_soon_threadsafe(installing)
                elif line.startswith("[registry/start]"):
                    log.info("%s", line)
            out = proc.stdout.read().decode(errors="replace")
            return proc.wait(), out, err

        # a thread reads the pipes (it ends when the launcher does; stop() kills it on shutdown)
        code, out, err = await asyncio.wait_for(asyncio.to_thread(follow), INSTALL_TIMEOUT_S)
        self._proc = None
        if code != 0 or not out.strip():
            detail = "\n".join(err[-LOG_TAIL_LINES:])
            raise RuntimeError(f"{self.launcher} --install-only exited with {code}"
                               + (f":\n{detail}" if detail else ""))
        return Path(out.strip().splitlines()[-1])

    # -- run ---------------------------------------------------------------------------------------------
    async def _launch(self, venv: Path) -> None:
        self.log_file = venv / "logs" / f"embedded-registry-{self.port}.log"
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = child_env()
        env.setdefault("KARAPACE_SESSION_TIMEOUT_MS", SESSION_TIMEOUT_MS)
        cmd = [self.python, str(self.launcher), "--bootstrap", self.bootstrap, "--host", self.host,
               "--port", str(self.port), "--venv", str(venv), "--log-level", "WARNING"]
        deadline = time.monotonic() + self.ready_timeout
        while True:
            self._proc = self._spawn(cmd, env=env, log_file=self.log_file)
            self.launches += 1
            log.info("embedded schema registry starting: %s (pid %d, log %s)", self.url, self._proc.pid,
                     self.log_file)
            try:
                await self._wait_ready(deadline)
                break
            except _ElectionStalled as exc:
                log.warning("the embedded schema registry %s; restarting it", exc)
                await self._terminate()
        config = self.settings.model_copy(update={"schema_registry_url": self.url}).schema_registry_config()
        self.schemas.set_default(config)
        self.ready = True
        print(f"embedded schema registry (Karapace) ready: {self.url} (the gateway's default "
              f"GATEWAY_SCHEMA_REGISTRY_URL; log {self.log_file})", flush=True)

    async def _wait_ready(self, deadline: float) -> None:
        """Until the registry takes writes; RuntimeError at ``deadline`` or when it exits, _ElectionStalled
        when its HTTP has answered for ``election_timeout`` seconds without a master (and time is left)."""
        http_up: float | None = None
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                raise RuntimeError(f"the registry exited with code {proc.returncode if proc else None} "
                                   "before it was ready")
            with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
                # /subjects answers as soon as HTTP is up; writes need the master election to be done
                if (await self._get("/subjects"))[0] == 200:
                    status, body = await self._get("/master_available")
                    if status == 200 and orjson.loads(body).get("master_available") is True:
                        return
                    http_up = http_up or time.monotonic()
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"the registry did not take writes at {self.url} within "
                                   f"{self.ready_timeout:.0f}s")
            if http_up is not None and now - http_up > self.election_timeout and deadline - now > self.election_timeout:
                raise _ElectionStalled(f"answers at {self.url} but elected no master within "
                                       f"{self.election_timeout:g}s")
            await asyncio.sleep(0.2)

    async def _get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        """A bare HTTP/1.0 GET on the registry (status, body): the readiness probe, without a client that
        logs every request."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {self.host}:{self.port}\r\n"
                         "Accept: application/json\r\n\r\n".encode())
            data = await asyncio.wait_for(reader.read(), timeout)  # HTTP/1.0: the answer ends at EOF
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    # -- stop --------------------------------------------------------------------------------------------
    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Cancel the start if it is still running and stop the registry (or the installer): SIGTERM to
        its process group, SIGKILL after ``grace`` seconds."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._terminate(grace)
        self.ready = False

    async def _terminate(self, grace: float = STOP_GRACE_S) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, grace)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                await asyncio.to_thread(proc.wait)
        # an installer's pipes are closed by its reader thread; a registry's output went to its log file
        log.info("embedded schema registry stopped (pid %d, exit %s)", proc.pid, proc.returncode)

    @staticmethod
    def _spawn(cmd: list[str], *, env: dict[str, str],
               log_file: Path | None = None) -> subprocess.Popen[bytes]:
        """Start a launcher process with ``env`` (:func:`child_env`, never the gateway's whole environment):
        in its own session, with the parent-death signal. Synchronous on
        purpose (a fork takes milliseconds): the death signal follows the forking thread, which must be the
        event loop's, not a worker thread that may end before the gateway does. Without ``log_file``, its
        stdout and stderr are pipes."""
        setup = _child_setup(os.getpid())
        if log_file is None:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=env, start_new_session=True, preexec_fn=setup)
        with open(log_file, "wb") as out:  # truncated: one start's output
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True, preexec_fn=setup)

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # the child leads its own session: its process group holds everything it started (pip, ...)
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
