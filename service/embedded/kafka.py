"""An embedded Apache Kafka broker (single node, KRaft, broker + controller in one JVM) for dev runs and tests.

The jars come from Maven Central through ``tools/install-kafka.sh`` (``tools/kafka/pom.xml``), which copies them to
``~/.cache/kcg-kafka/<version>/lib``; nothing here downloads anything. :meth:`EmbeddedKafka.start` writes a
``server.properties`` into a fresh temporary directory, copies a formatted storage there (formatted once per version
and SCRAM users by ``kafka.tools.StorageTool format``, one short JVM, and kept in the cache), starts ``kafka.Kafka`` on
free loopback ports and returns once the client listener answers ApiVersions and a Metadata request lists the broker
(our own client, service/client, does both).
:meth:`EmbeddedKafka.stop` sends SIGTERM (Kafka shuts down cleanly), SIGKILL after a grace period, and deletes the
directory. The same interface as the Tansu launcher (service/embedded/tansu.py): ``start``, ``stop``, ``kill``,
``bootstrap``, a context manager; the JVM also gets ``PR_SET_PDEATHSIG`` (start it from the main thread).

Measured on a 2-core machine with JDK 17: ready 2-3 s after ``start()`` when a formatted template is copied (the
default), 3.5-6 s when formatting anew (``template=False``); ``startup_s`` holds the figure of the last start, logged,
and printed by ``make run`` and in the test session's summary.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from service.client.client import KafkaClient
from service.client.connection import ConnectionConfig
from service.client.errors import KafkaError
from service.embedded.tansu import EmbeddedBrokerError, _set_pdeathsig, free_port

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger(__name__)

#: the broker version, the same as <kafka.version> in tools/kafka/pom.xml (a unit test checks both agree)
KAFKA_VERSION = "4.4.0"

#: the settings of a single-node cluster used by tests and `make run`: internal topics with one replica and few
#: partitions, small thread pools and buffers for a 2-core machine, no initial rebalance delay, and group
#: session timeouts down to 1 s allowed (the gateway's embedded-broker defaults use 4 s). Share groups, the
#: consumer (KIP-848) protocol and transactions are as a freshly formatted 4.4 broker has them (all on).
SINGLE_NODE_CONFIG: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    # share groups: a member hears of its assignment on its next heartbeat, 1 s after joining rather than Kafka's 5 s
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "1000",
    # and a group may set its record lock (share.record.lock.duration.ms) down to 1 s (Kafka: 15 s); default 30 s
    "group.share.min.record.lock.duration.ms": "1000",
    # a broker killed and started again on its data registers anew only once its old registration expired: 4 s
    # (Kafka's 9 s made such a restart take 12 s)
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    # the default allocates 128 MiB at start
    "log.cleaner.dedupe.buffer.size": "2097152",
    # as on the embedded Tansu broker of `make run`: a producer's or consumer's metadata request for a missing
    # topic creates it (with num.partitions partitions: Kafka's default of 1)
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
}

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def cache_dir() -> Path:
    """Where tools/install-kafka.sh puts the broker: $KCG_KAFKA_CACHE or ~/.cache/kcg-kafka (XDG_CACHE_HOME)."""
    env = os.environ.get("KCG_KAFKA_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kcg-kafka"


def find_kafka_lib(lib_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory of the broker's jars: ``lib_dir`` (GATEWAY_EMBEDDED_KAFKA_LIB), else the install cache."""
    lib = Path(lib_dir) if lib_dir else cache_dir() / KAFKA_VERSION / "lib"
    jar = lib / f"kafka_2.13-{KAFKA_VERSION}.jar"
    if not jar.is_file():
        raise EmbeddedBrokerError(
            f"Apache Kafka {KAFKA_VERSION} is not installed ({jar} is missing): run `sh tools/install-kafka.sh` "
            "(make test and `GATEWAY_EMBEDDED_BROKER=kafka make run` do), which resolves it from Maven Central")
    return lib


def start_problem(settings: Settings) -> str | None:
    """Why the gateway cannot start its embedded Kafka (GATEWAY_EMBEDDED_BROKER=kafka, no GATEWAY_KAFKA_BOOTSTRAP):
    the jars or java missing; None when it can (or is not asked to)."""
    if settings.kafka_bootstrap or settings.embedded_broker != "kafka":
        return None
    try:
        find_kafka_lib(settings.embedded_kafka_lib)
        find_java()
    except EmbeddedBrokerError as exc:
        return f"GATEWAY_EMBEDDED_BROKER=kafka: {exc}"
    return None


def find_java() -> str:
    """The java of $GATEWAY_EMBEDDED_KAFKA_JAVA, $JAVA_HOME or PATH (Kafka 4.4 needs 17+)."""
    env = os.environ.get("GATEWAY_EMBEDDED_KAFKA_JAVA")
    if env:
        return env
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found:
        return found
    raise EmbeddedBrokerError("no java found (Apache Kafka needs a JDK 17+: set JAVA_HOME or put java on PATH)")


def new_cluster_id() -> str:
    """16 random bytes in unpadded URL-safe base64 (22 characters), as Kafka's own Uuid; Kafka refuses an id
    starting with '-' (it reads as an option), so none is given out."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def render_properties(props: Mapping[str, str]) -> str:
    """A java .properties file; values are written as given (escaping the characters .properties treats
    specially, so a JAAS line or a Windows path round-trips)."""
    def esc(s: str, key: bool) -> str:
        out = s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        if key:
            for ch in (" ", "=", ":", "#", "!"):
                out = out.replace(ch, "\\" + ch)
        return out

    return "".join(f"{esc(k, True)}={esc(v, False)}\n" for k, v in props.items())


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
    except OSError:
        return True


def sweep_stale_dirs(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Delete the directories of embedded brokers whose owner process and broker are both gone (a gateway killed
    with -9 takes its broker with it through PR_SET_PDEATHSIG but cannot delete the data). Only directories with an
    ``owner.pid`` file are considered; returns those deleted. Linux only (reads /proc): elsewhere nothing is swept."""
    if not Path("/proc/self/stat").exists():
        return []
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob("kcg-kafka-*"):
        try:
            pids = [int(x) for x in (d / "owner.pid").read_text().split()]
        except (OSError, ValueError):
            continue
        if pids and not any(_pid_alive(pid) for pid in pids):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


async def probe(bootstrap: str, timeout: float = 2.0) -> str | None:
    """One readiness check with our own client: ApiVersions (the connection's negotiation) and a Metadata
    request that lists at least one broker. The cluster id when ready, None when not (yet)."""
    client = KafkaClient(bootstrap, ConnectionConfig(client_id="kcg-embedded-kafka-probe", request_timeout=timeout,
                                                     connect_timeout=timeout))
    try:
        md = await asyncio.wait_for(client.refresh_metadata(), timeout)
        return (md.cluster_id or "") if md.brokers else None
    except (KafkaError, OSError, TimeoutError):
        return None
    finally:
        await client.close()


def _probe_sync(bootstrap: str, timeout: float) -> str | None:
    """:func:`probe` on a loop of its own in a helper thread: the launcher is synchronous and may be called from
    inside a running event loop (the gateway's serve())."""
    box: list[str | None] = []

    def run() -> None:
        box.append(asyncio.run(probe(bootstrap, timeout)))

    t = threading.Thread(target=run, name="embedded-kafka-probe", daemon=True)
    t.start()
    t.join(timeout + 5)
    return box[0] if box else None


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass(frozen=True)
class BrokerTls:
    """The TLS material of the broker's SSL and SASL_SSL listeners: its certificate (chain) and key as PEM files
    (the key in any form ``cryptography`` reads, unencrypted; the launcher writes Kafka's PEM key store from them,
    which wants PKCS#8), the CA file of the client certificates it trusts, and whether the SSL listener asks for one
    (``client_auth``: "none", "requested", "required"; the SASL_SSL listener never does)."""

    certfile: str
    keyfile: str
    cafile: str
    client_auth: str = "none"


def pem_keystore(tls: BrokerTls) -> str:
    """Kafka's PEM key store: the unencrypted PKCS#8 private key, then the certificate chain (the certificate file
    may hold the key too, as a "key and chain" file: only its certificates are taken)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(tls.keyfile).read_bytes(), password=None)
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode()
    return pkcs8 + _certificates(Path(tls.certfile).read_text())


def _certificates(pem: str) -> str:
    out = []
    rest = pem
    while (start := rest.find("-----BEGIN CERTIFICATE-----")) >= 0:
        end = rest.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
        out.append(rest[start:end] + "\n")
        rest = rest[end:]
    if not out:
        raise EmbeddedBrokerError("no certificate in the broker's certificate file")
    return "".join(out)


def _sasl_safe(value: str, what: str) -> str:
    """A user name or password as it goes, unescaped, into a JAAS line and a --add-scram argument."""
    if not value or any(ch in value for ch in '"\\\n\r;=,[]'):
        shown = repr(value) if what == "user name" else "(not shown)"
        raise EmbeddedBrokerError(f"a SASL {what} of the embedded Kafka must be non-empty, without quotes, "
                                  f"backslashes, '=', ';', ',', brackets or line breaks: {shown}")
    return value


class EmbeddedKafka:
    """One single-node KRaft broker in a temporary directory.

    ``overrides`` are extra or replaced server properties;
    ``heap`` the JVM's -Xmx; ``fast_start`` runs the JIT's first tier only (``-XX:TieredStopAtLevel=1``: a faster
    start, slower steady state: leave it off for benchmarks); ``log_level`` the root log level of the broker's log
    (``<dir>/kafka.log`` unless ``log_file`` is given).

    ``sasl_users`` (name -> password) adds a SASL_PLAINTEXT listener (``sasl_bootstrap``) with PLAIN, SCRAM-SHA-256
    and SCRAM-SHA-512 for those users (the SCRAM credentials are written at format time); ``tls`` adds an SSL
    listener (``ssl_bootstrap``), and with ``sasl_users`` too a SASL_SSL one (``sasl_ssl_bootstrap``). The PLAINTEXT
    listener stays (``bootstrap``: the broker's own and the tests' admin access).
    """

    #: which broker this is (the Tansu launcher says "tansu")
    name = "kafka"

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *, lib_dir: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, str] | None = None, heap: str = "256m", fast_start: bool = True,
                 log_level: str = "WARN", log_file: str | os.PathLike[str] | None = None,
                 java: str | None = None, keep_data: bool = False, sasl_users: Mapping[str, str] | None = None,
                 tls: BrokerTls | None = None, template: bool = True) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.controller_port = free_port(host)
        self.sasl_users = {_sasl_safe(u, "user name"): _sasl_safe(p, "password") for u, p in (sasl_users or {}).items()}
        self.tls = tls
        if tls is not None and tls.client_auth not in ("none", "requested", "required"):
            raise EmbeddedBrokerError(f"client_auth must be none, requested or required, not {tls.client_auth!r}")
        #: the ports of the SASL_PLAINTEXT, SSL and SASL_SSL listeners (0: none)
        self.sasl_port = free_port(host) if self.sasl_users else 0
        self.ssl_port = free_port(host) if tls is not None else 0
        self.sasl_ssl_port = free_port(host) if tls is not None and self.sasl_users else 0
        self.lib_dir = lib_dir
        self.overrides = dict(overrides or {})
        self.heap = heap
        self.fast_start = fast_start
        self.log_level = log_level
        self.log_file = Path(log_file) if log_file else None
        self.java = java
        self.keep_data = keep_data
        #: copy a storage formatted once (per version and SCRAM users, in the install cache) instead of formatting
        #: anew: one JVM less per start; brokers from the same template share its cluster id
        self.template = template
        self.cluster_id = new_cluster_id()
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        #: seconds of the last start: formatting, then the broker JVM until ready, and both
        self.format_s = 0.0
        self.ready_s = 0.0
        self.startup_s = 0.0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """The SASL_PLAINTEXT listener (``sasl_users`` given)."""
        if not self.sasl_port:
            raise EmbeddedBrokerError("this broker has no SASL_PLAINTEXT listener (no sasl_users)")
        return f"{self.host}:{self.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        """The SSL listener (``tls`` given)."""
        if not self.ssl_port:
            raise EmbeddedBrokerError("this broker has no SSL listener (no tls)")
        return f"{self.host}:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """The SASL_SSL listener (``sasl_users`` and ``tls`` given)."""
        if not self.sasl_ssl_port:
            raise EmbeddedBrokerError("this broker has no SASL_SSL listener (it needs sasl_users and tls)")
        return f"{self.host}:{self.sasl_ssl_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def data_dir(self) -> Path:
        if self.workdir is None:
            raise EmbeddedBrokerError("the broker has no directory before start()")
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        if self.log_file is not None:
            return self.log_file
        if self.workdir is None:
            raise EmbeddedBrokerError("the broker has no directory before start()")
        return self.workdir / "kafka.log"

    def server_properties(self) -> dict[str, str]:
        clients = {"PLAINTEXT": self.port, "SASL_PLAINTEXT": self.sasl_port, "SSL": self.ssl_port,
                   "SASL_SSL": self.sasl_ssl_port}
        advertised = ",".join(f"{name}://{self.host}:{port}" for name, port in clients.items() if port)
        names = [name for name, port in clients.items() if port]
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"{advertised},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(f"{n}:{n}" for n in names) + ",CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            **SINGLE_NODE_CONFIG,
        }
        if self.sasl_users:
            props["sasl.enabled.mechanisms"] = ",".join(SASL_MECHANISMS)
            plain = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
            for listener in ("sasl_plaintext", "sasl_ssl") if self.tls is not None else ("sasl_plaintext",):
                props[f"listener.name.{listener}.plain.sasl.jaas.config"] = f"{_PLAIN_MODULE} required {plain};"
                for mech in ("scram-sha-256", "scram-sha-512"):
                    props[f"listener.name.{listener}.{mech}.sasl.jaas.config"] = f"{_SCRAM_MODULE} required;"
        if self.tls is not None:
            props.update({
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.data_dir.parent / "keystore.pem"),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": self.tls.cafile,
                "listener.name.ssl.ssl.client.auth": self.tls.client_auth,
            })
        props.update(self.overrides)
        return props

    def format_arguments(self) -> list[str]:
        """The arguments of ``kafka.tools.StorageTool`` after the properties file: SCRAM users (both hashes)."""
        return [arg for user, password in self.sasl_users.items() for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                for arg in ("--add-scram", f"{mech}=[name={user},password={password}]")]

    def _java_command(self, main: str, *args: str, broker: bool) -> list[str]:
        """The command line of the broker's JVM, or (``broker`` false) of a short tool JVM such as the format."""
        lib = find_kafka_lib(self.lib_dir)
        assert self.workdir is not None
        cmd = [self.java or find_java(), "-XX:-UsePerfData", "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
               # zstd and snappy unpack their native libraries here: the directory goes with the broker
               f"-Djava.io.tmpdir={self.workdir / 'tmp'}"]
        if broker:
            cmd += [f"-Xmx{self.heap}", f"-Xms{min_heap(self.heap)}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                    "-XX:+ExplicitGCInvokesConcurrent"]
            if self.fast_start:
                cmd.append("-XX:TieredStopAtLevel=1")
        else:
            cmd += ["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        # java expands the wildcard itself (one argument, no shell)
        return [*cmd, "-cp", str(lib / "*"), main, *args]

    def start(self, timeout: float = 120.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        find_kafka_lib(self.lib_dir)  # a clear error before creating anything
        if self.workdir is not None and (self.data_dir / "meta.properties").is_file():
            self._restart(timeout)  # stopped or killed with keep_data: the same data, ports and cluster
            return
        for stale in sweep_stale_dirs():
            log.info("deleted %s, left behind by an embedded Kafka whose owner is gone", stale)
        t0 = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix="kcg-kafka-"))
        (self.workdir / "owner.pid").write_text(f"{os.getpid()}\n")
        (self.workdir / "tmp").mkdir()
        self.data_dir.mkdir()
        props_file = self.workdir / "server.properties"
        props_file.write_text(render_properties(self.server_properties()))
        if self.tls is not None:
            keystore = self.workdir / "keystore.pem"
            keystore.touch(0o600)
            keystore.write_text(pem_keystore(self.tls))
        (self.workdir / "log4j2.properties").write_text(_LOG4J2.format(level=self.log_level))
        try:
            if self.template:
                tpl = self._template(timeout)
                shutil.copytree(tpl / "data", self.data_dir, dirs_exist_ok=True)
                self.cluster_id = (tpl / "cluster.id").read_text().strip()
            else:
                self._format(props_file, timeout)
            self.format_s = time.monotonic() - t0
            t1 = time.monotonic()
            self._launch(props_file)
            self._wait_ready(t0 + timeout)
            self.ready_s = time.monotonic() - t1
            self.startup_s = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        assert self.proc is not None
        log.info("embedded Apache Kafka %s ready on %s in %.1f s (format %.1f s, broker %.1f s), pid %d, dir %s",
                 KAFKA_VERSION, self.bootstrap, self.startup_s, self.format_s, self.ready_s, self.proc.pid,
                 self.workdir)

    def _restart(self, timeout: float) -> None:
        assert self.workdir is not None
        t0 = time.monotonic()
        try:
            self._launch(self.workdir / "server.properties")
            self._wait_ready(t0 + timeout)
        except BaseException:
            self.stop(keep_data=True)
            raise
        self.format_s, self.ready_s = 0.0, time.monotonic() - t0
        self.startup_s = self.ready_s
        log.info("embedded Apache Kafka %s restarted on %s (same data) in %.1f s, pid %d", KAFKA_VERSION,
                 self.bootstrap, self.startup_s, self.pid)

    def _launch(self, props_file: Path) -> None:
        assert self.workdir is not None
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self._java_command("kafka.Kafka", str(props_file), broker=True),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_set_pdeathsig, cwd=self.workdir)
        (self.workdir / "owner.pid").write_text(f"{os.getpid()} {self.proc.pid}\n")

    def _format(self, props_file: Path, timeout: float) -> None:
        """``kafka.tools.StorageTool format`` of this broker's storage (a short JVM, about 1 s)."""
        fmt = subprocess.run(
            self._java_command("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(props_file),
                               *self.format_arguments(), broker=False),
            capture_output=True, timeout=timeout, check=False)
        if fmt.returncode != 0:
            raise EmbeddedBrokerError(f"formatting the Kafka storage failed (exit {fmt.returncode}): "
                                      f"{(fmt.stderr or fmt.stdout).decode(errors='replace')[-2000:]}")

    def _template(self, timeout: float) -> Path:
        """A formatted storage to copy: ``<cache>/<version>/templates/<key>/data`` and its ``cluster.id``, formatted
        the first time (into a directory of its own, renamed into place: concurrent starts do not clash). The key is
        what the format depends on: the jars and the SCRAM users; the formatted files name no port or path."""
        assert self.workdir is not None
        lib = find_kafka_lib(self.lib_dir)
        stamp = lib.parent / "stamp"  # tools/install-kafka.sh's hash of the pom: new jars, a new template
        installed = stamp.read_text().strip() if stamp.is_file() else ""
        key = hashlib.sha256("\0".join([KAFKA_VERSION, str(lib.resolve()), installed,
                                         *self.format_arguments()]).encode())
        root = cache_dir() / KAFKA_VERSION / "templates"
        final = root / key.hexdigest()[:16]
        if (final / "cluster.id").is_file():
            return final
        root.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix="building-", dir=root))
        try:
            # the format reads this broker's properties with the template's directory as log.dirs
            props = {**self.server_properties(), "log.dirs": str(build / "data")}
            (build / "data").mkdir()
            (build / "server.properties").write_text(render_properties(props))
            (build / "server.properties").chmod(0o600)
            self._format(build / "server.properties", timeout)
            (build / "server.properties").unlink()
            (build / "cluster.id").write_text(self.cluster_id + "\n")
            try:
                build.rename(final)
            except OSError:  # another process put its template there first: use that one
                shutil.rmtree(build, ignore_errors=True)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        return final

    def _log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _wait_ready(self, deadline: float) -> None:
        while True:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise EmbeddedBrokerError(f"Apache Kafka exited with code {code} during start; its log:\n"
                                          + self._log_tail())
            left = deadline - time.monotonic()
            if left <= 0:
                raise EmbeddedBrokerError(f"Apache Kafka did not answer on {self.bootstrap} in time; its log:\n"
                                          + self._log_tail())
            cid = _probe_sync(self.bootstrap, min(2.0, max(left, 0.1)))
            if cid is not None:
                if cid and cid != self.cluster_id:
                    raise EmbeddedBrokerError(f"{self.bootstrap} answers with cluster id {cid}, not ours "
                                              f"({self.cluster_id}): another broker holds the port")
                return
            time.sleep(0.1)  # readiness probe of an external process: nothing to await

    def stop(self, grace: float = 20.0, *, keep_data: bool | None = None) -> None:
        """SIGTERM (a clean shutdown: Kafka flushes and closes its logs), SIGKILL after ``grace`` seconds, then the
        directory is deleted, unless ``keep_data`` (default: the constructor's): then :meth:`start` starts the broker
        again on the same data and ports."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("embedded Kafka (pid %d) still running %.0f s after SIGTERM: killed", proc.pid, grace)
                proc.kill()
                proc.wait(10)
        self._cleanup(keep_data)

    def kill(self, *, keep_data: bool | None = None) -> None:
        """SIGKILL, as a crash would; the directory is deleted too, unless ``keep_data`` (default: the
        constructor's): ``kill(keep_data=True)`` then :meth:`start` is a crash and a restart on the same data."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._cleanup(keep_data)

    def _cleanup(self, keep_data: bool | None = None) -> None:
        keep = self.keep_data if keep_data is None else keep_data
        if self.workdir is not None and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> EmbeddedKafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def min_heap(heap: str) -> str:
    """-Xms: half of -Xmx ("256m" -> "128m"), so a small broker does not grow its heap in steps at start."""
    digits = "".join(ch for ch in heap if ch.isdigit())
    unit = heap[len(digits):] or "m"
    return f"{max(1, int(digits) // 2)}{unit}" if digits else heap
