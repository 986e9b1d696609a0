"""Process entry point (``consumer-gateway``): settings, embedded broker when needed, HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

from api.app import create_app
from api.hosts import default_allowed_hosts
from api.replicas.peer_auth import peer_tls_problem, peer_token_problem
from api.server.http import HeadLimits, OutputLimits, protocol_class, server_ssl_context, tls_problem
from service.embedded.kafka import EmbeddedKafka
from service.embedded.kafka import start_problem as kafka_problem
from service.embedded.registry import EmbeddedRegistry, launcher_for
from service.embedded.registry import start_problem as registry_problem
from service.embedded.tansu import EmbeddedBroker
from service.lib.logs import configure as configure_logging
from service.settings import Settings

log = logging.getLogger("gateway")
# The drain window ends early once no request was in flight for this long.
DRAIN_QUIET_S = 0.5


def tune_gc() -> None:
    """The hot path allocates many short-lived containers (records are untracked tuples, but lists of
    them, dicts and coroutines are not): with the default thresholds the collector runs every 700
    allocations and its full passes walk every module-level object. Freeze what start-up created (never
    garbage) and collect the young generation less often; reference counting still frees everything else
    at once."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


async def serve(settings: Settings) -> None:
    broker: EmbeddedBroker | EmbeddedKafka | None = None
    registry: EmbeddedRegistry | None = None  # the embedded schema registry (service/embedded/registry.py)
    bootstrap = settings.kafka_bootstrap
    if not bootstrap and settings.embedded_broker == "kafka":
        print("embedded Apache Kafka starting (a few seconds)...", flush=True)
        broker = EmbeddedKafka(port=settings.embedded_broker_port, lib_dir=settings.embedded_kafka_lib)
        # Started from the main thread: PR_SET_PDEATHSIG follows the thread that forks the child.
        broker.start()
        bootstrap = broker.bootstrap
        print(f"embedded Apache Kafka ready in {broker.startup_s:.1f} s (pid {broker.pid}, log {broker.log_path}); "
              f"Kafka bootstrap address: {bootstrap}", flush=True)
    elif not bootstrap:
        broker = EmbeddedBroker(port=settings.embedded_broker_port, storage=settings.embedded_broker_storage)
        # Started from the main thread: PR_SET_PDEATHSIG follows the thread that forks the child.
        broker.start()
        bootstrap = broker.bootstrap
        print(f"embedded Tansu broker listening; Kafka bootstrap address: {bootstrap}", flush=True)
    try:
        app = create_app(settings, bootstrap)
        tune_gc()
        tls = bool(settings.tls_cert_file and settings.tls_key_file)
        certfile, keyfile = settings.tls_cert_file or "", settings.tls_key_file or ""
        # On SIGTERM, the gateway first drains (GATEWAY_SHUTDOWN_DRAIN_S, see _drain_then_exit); then
        # in-flight requests get GATEWAY_SHUTDOWN_TIMEOUT_S to finish (a stream still open is cancelled
        # then), and then Gateway.close() gets the same deadline for the instances.
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                                lifespan="on", access_log=False,
                                # uvicorn's own records go through service.lib.logs (escaped text or JSON lines)
                                log_config=None,
                                timeout_graceful_shutdown=max(1, round(settings.shutdown_timeout_s)),
                                timeout_keep_alive=settings.http_keep_alive_s,
                                # Forwarded / X-Forwarded-* are the app's business (GATEWAY_FORWARDED_ALLOW_IPS,
                                # api.auth): the app must see the direct peer to decide whether to trust them.
                                proxy_headers=False,
                                # request-head size, count and timeout, connection limit (api/server/http.py)
                                http=protocol_class(_http_protocol(settings.http_parser), HeadLimits(
                                    max_bytes=settings.http_max_header_bytes, max_count=settings.http_max_headers,
                                    timeout_s=settings.http_header_timeout_s,
                                    max_connections=settings.http_max_connections), OutputLimits(
                                    max_unsent_bytes=settings.http_max_unsent_bytes,
                                    send_timeout_s=settings.http_send_timeout_s)),
                                # HTTPS (GATEWAY_TLS_CERT_FILE / _KEY_FILE): TLS 1.2+, files checked at start
                                ssl_certfile=certfile or None, ssl_keyfile=keyfile or None,
                                ssl_context_factory=(lambda _c, _d: server_ssl_context(certfile, keyfile)) if tls
                                else None)
        server = uvicorn.Server(config)
        # We own signal handling (uvicorn would re-raise the signal after shutdown and kill the
        # process before the embedded broker is stopped).
        server.capture_signals = contextlib.nullcontext  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        gateway = app.state.gateway
        drain: asyncio.Task[None] | None = None

        async def _drain_then_exit() -> None:
            """First signal: stop handing out records at once (long polls return, streams end with a final
            "shutting down" line) but keep the listener open for commits and other requests of existing
            instances for up to GATEWAY_SHUTDOWN_DRAIN_S, less once nothing was in flight for a moment
            (the time a client needs to send its commit after its stream ended). uvicorn's own graceful
            shutdown, which closes the listener first, starts only then."""
            gateway.start_draining()
            deadline = loop.time() + settings.shutdown_drain_s
            idle_since: float | None = None
            while (now := loop.time()) < deadline and not server.should_exit:
                if server.server_state.tasks:  # requests in flight, open streams included
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= DRAIN_QUIET_S:
                    break
                await asyncio.sleep(0.02)
            server.should_exit = True

        def _stop() -> None:
            nonlocal drain
            if drain is None and not server.should_exit:
                drain = loop.create_task(_drain_then_exit(), name="shutdown-drain")
                return
            if server.should_exit:  # a third signal: exit without waiting for anything
                server.force_exit = True
            server.should_exit = True  # a second signal: skip the rest of the drain window

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _stop)
        scheme = "https" if tls else "http"
        print(f"gateway HTTP on {scheme}://{settings.host}:{settings.port} (bootstrap {bootstrap})", flush=True)
        # a schema registry next to the embedded broker, started in the background (not awaited)
        launcher = launcher_for(settings) if broker is not None else None
        if launcher is not None:
            registry = EmbeddedRegistry(launcher, bootstrap, app.state.schemas, settings,
                                        port=settings.embedded_registry_port)
            registry.start()
        await server.serve()
    finally:
        if registry is not None:  # before the broker: it keeps its schemas there
            await registry.stop()
        if broker is not None:
            broker.stop()
            print("embedded broker stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["sink"]:  # `consumer-gateway sink ...`: the Spark sink job (the `spark` extra)
        from sink.cli import main as sink_main

        return sink_main(args[1:])
    settings = with_host_defaults(Settings())
    configure_logging(settings.log_level, settings.log_format)
    if not settings.tenants_file and settings.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("open mode (no GATEWAY_TENANTS_FILE: no authentication) listening on %s: anyone who can reach "
                    "this address can use the gateway; only Host headers in GATEWAY_ALLOWED_HOSTS (%s) are served",
                    settings.host, settings.allowed_hosts)
    problem = start_problem(settings)
    if problem is not None:
        print(f"consumer-gateway: refusing to start: {problem}", file=sys.stderr, flush=True)
        return 2
    try:
        factory = _loop_factory(settings.event_loop)
        if settings.tls_cert_file:  # a TLS handshake is bounded like a request head
            factory = _with_handshake_timeout(factory, settings.http_header_timeout_s)
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(settings))
    except KeyboardInterrupt:
        pass
    return 0


def start_problem(settings: Settings) -> str | None:
    """A configuration the gateway refuses to start with (a clear message, exit status 2), or None."""
    return (peer_token_problem(settings) or tls_problem(settings.tls_cert_file, settings.tls_key_file)
            or peer_tls_problem(settings) or registry_problem(settings) or kafka_problem(settings))


def with_host_defaults(settings: Settings) -> Settings:
    """The Host check's default (api/hosts.py): in open mode, with no GATEWAY_ALLOWED_HOSTS, only the bind
    address, localhost and the loopback addresses (and the GATEWAY_PEERS hosts) are served, so a web page
    using DNS rebinding cannot drive a developer's gateway. Computed here, at start, rather than in the app:
    an app built by tests (Starlette's TestClient sends Host: testserver) has no check unless asked."""
    if settings.allowed_hosts is not None or settings.tenants_file:
        return settings
    peers = (settings.peers or "").split(",") if settings.peers else []
    # the public URL's host is this gateway's own name (base_uri points clients at it)
    urls = [*peers, settings.public_url] if settings.public_url else peers
    return settings.model_copy(update={"allowed_hosts": default_allowed_hosts(settings.host, urls)})


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop (libuv: cheaper I/O and timers) unless asked for asyncio's or not installed."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("GATEWAY_EVENT_LOOP=uvloop but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def _with_handshake_timeout(factory: Callable[[], asyncio.AbstractEventLoop] | None,
                            timeout_s: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """Loops whose TLS listeners drop a connection that has not completed its handshake within ``timeout_s``
    (uvicorn passes no handshake timeout: the loops' default is 60 s, and the header timeout and connection
    limit of api/server/http.py start only once the handshake is done)."""

    def make() -> asyncio.AbstractEventLoop:
        loop = factory() if factory is not None else asyncio.new_event_loop()
        create_server = loop.create_server

        async def bounded(*args: Any, **kwargs: Any) -> asyncio.Server:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", timeout_s)
            return await create_server(*args, **kwargs)

        loop.create_server = bounded  # type: ignore[method-assign]
        return loop

    return make


def _http_protocol(choice: str) -> str:
    """httptools (C parser) unless asked for h11 or not installed."""
    if choice == "auto":
        return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"
    return choice


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
