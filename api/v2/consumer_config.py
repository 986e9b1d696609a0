"""Kafka consumer properties in a create-consumer body: which are honoured, ignored or refused.

Clients written for other proxies (Confluent REST Proxy, Strimzi Kafka Bridge, Karapace) send Kafka
consumer properties when they create an instance. The gateway

- **honours** the ones it can apply per instance (:data:`HONOURED`: group timeouts, fetch sizes and waits,
  auto-commit, isolation, the default size of a records request, ...);
- **accepts and ignores** client-side-only properties of the Java client and of librdkafka
  (:data:`IGNORED`: deserializers, socket buffers, metric reporters, librdkafka queue sizes, ...), logging
  each key once per process;
- **refuses** (422/42204) the properties that only the gateway's operator may set (:data:`OPERATOR_ONLY`:
  brokers, security, group id) and any key that is not a Kafka consumer property at all, so that a typo
  such as ``auto.ofset.reset`` still fails loudly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,9}")


class ConfigError(ValueError):
    """A refused key (``code`` 42204) or an invalid value (``code`` 42206)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def to_int(key: str, v: Any, lo: int = 0, hi: int = INT32_MAX) -> int:
    if isinstance(v, str) and _DIGITS.fullmatch(v):
        v = int(v)
    elif isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}: must be an integer (a JSON number or a string of digits)", 42206)
    if not lo <= v <= hi:
        raise ConfigError(f"{key}: must be between {lo} and {hi}", 42206)
    return v


def to_bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ConfigError(f"{key}: must be true or false", 42206)


def _ms(lo: int = 0, hi: int = INT32_MAX) -> Callable[[str, Any], int]:
    """Any int32 >= 0 (a JSON number or a string of digits, as the schema says), clamped into [lo, hi]."""
    return lambda k, v: min(hi, max(lo, to_int(k, v)))


_ASSIGNORS = {
    "range": "range", "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "roundrobin": "roundrobin", "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "cooperative-sticky": "cooperative-sticky",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
}
_ASSIGNOR_RE = "|".join(re.escape(k) for k in _ASSIGNORS)


def _assignors(key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, str):
        raise ConfigError(f"{key}: must be a comma-separated string of assignor names", 42206)
    out = []
    for item in v.split(","):
        name = item.strip()
        got = _ASSIGNORS.get(name)
        if got is None:
            raise ConfigError(f"{key}: {name!r} is not supported; use range, roundrobin or cooperative-sticky "
                              "(or their Java class names)", 42206)
        if got not in out:
            out.append(got)
    return tuple(out)


def _group_protocol(key: str, v: Any) -> str:
    if not isinstance(v, str) or v.strip().lower() not in ("classic", "consumer"):
        raise ConfigError(f"{key}: must be classic or consumer", 42206)
    return v.strip().lower()


def _remote_assignor(key: str, v: Any) -> str:
    name = v.strip().lower() if isinstance(v, str) else None
    name = {"org.apache.kafka.coordinator.group.assignor.uniformassignor": "uniform",
            "org.apache.kafka.coordinator.group.assignor.rangeassignor": "range"}.get(name or "", name)
    if name not in ("uniform", "range"):
        raise ConfigError(f"{key}: must be uniform or range (the broker's assignors)", 42206)
    return name


#: Kafka's legal characters for names and ids (topics, group.instance.id): ASCII letters, digits, '.', '_', '-'
_KAFKA_ID = re.compile(r"[A-Za-z0-9._-]+")
MAX_CLIENT_ID_LENGTH = 200
MAX_GROUP_INSTANCE_ID_LENGTH = 249  # Kafka's limit (as on topic names and group ids)


def validate_kafka_id(key: str, v: Any, max_length: int) -> str:
    """``v`` if it is 1..max_length of Kafka's legal id characters and not '.' or '..' (Kafka refuses those
    as group.instance.id); else ConfigError 42206. No control character, newline or space reaches a broker."""
    if not isinstance(v, str) or not 1 <= len(v) <= max_length or not _KAFKA_ID.fullmatch(v) or v in (".", ".."):
        raise ConfigError(f"{key}: must be 1-{max_length} ASCII letters, digits, '.', '_' or '-' "
                          "(and not '.' or '..')", 42206)
    return v


def tenant_client_id(tenant_id: str, client_id: str) -> str:
    """The Kafka client.id an instance of ``tenant_id`` asking for ``client_id`` gets: ``kcg-<tenant>-<client.id>``,
    the same namespace as generated ids (``kcg-<tenant>-<instance name>``), so no tenant can pose as another
    (broker requests carry the tenant connection's own client id, GATEWAY_CLIENT_ID / the tenant's)."""
    return f"kcg-{tenant_id}-{client_id}"


def _client_id(key: str, v: Any) -> str:
    return validate_kafka_id(key, v, MAX_CLIENT_ID_LENGTH)


def _rack(key: str, v: Any) -> str:
    if not isinstance(v, str) or len(v) > 200 or any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ConfigError(f"{key}: must be a string of at most 200 printable characters", 42206)
    return v


#: The documented maxima of client-provided fetch sizes (larger values are clamped, not refused): Kafka's
#: default fetch.max.bytes (50 MiB) and 16 MiB per partition. Every fetch is further bounded by the process
#: memory budget (service/instances/budget.py: its max_bytes is a grant of GATEWAY_MEMORY_BUDGET_BYTES).
MAX_FETCH_MAX_BYTES = 52428800
MAX_PARTITION_FETCH_BYTES = 16 * 1024 * 1024

#: Kafka property → (ConsumerConfig field, parser). Applied to the instance's consumer.
#: Numbers are clamped into a sane range (e.g. a fetch wait of at most 30 s) rather than refused.
HONOURED: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "heartbeat.interval.ms": ("heartbeat_interval_ms", _ms(1)),
    "max.poll.interval.ms": ("max_poll_interval_ms", _ms(1000)),
    "auto.commit.interval.ms": ("auto_commit_interval_ms", _ms(1)),
    "fetch.max.bytes": ("fetch_max_bytes", _ms(1, MAX_FETCH_MAX_BYTES)),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", _ms(1, MAX_PARTITION_FETCH_BYTES)),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", _ms(0, 30_000)),
    "fetch.wait.max.ms": ("fetch_max_wait_ms", _ms(0, 30_000)),  # librdkafka's name
    "metadata.max.age.ms": ("metadata_max_age_ms", _ms(1000)),
    "topic.metadata.refresh.interval.ms": ("metadata_max_age_ms", _ms(1000)),  # librdkafka's name
    "retry.backoff.ms": ("retry_backoff_ms", _ms(1, 60_000)),
    "partition.assignment.strategy": ("assignment_strategies", _assignors),
    "client.id": ("client_id", _client_id),
    "client.rack": ("client_rack", _rack),
    # the group membership protocol (docs/consumer-protocol.md); default: GATEWAY_GROUP_PROTOCOL
    "group.protocol": ("group_protocol", _group_protocol),
    "group.remote.assignor": ("group_remote_assignor", _remote_assignor),
}

#: Properties the create body has as first-class fields (see api/consumers.CreateConsumer).
FIELDS = frozenset({
    "name", "id", "format", "auto.offset.reset", "auto.commit.enable", "enable.auto.commit", "fetch.min.bytes",
    "consumer.request.timeout.ms", "consumer.request.max.bytes", "max.poll.records", "isolation.level",
    "group.instance.id", "session.timeout.ms",
})

#: Client-side-only properties (Java consumer, common client configs, librdkafka): accepted, ignored.
IGNORED = frozenset({
    # Java consumer / common client configs that only shape the client process
    "key.deserializer", "value.deserializer", "check.crcs", "connections.max.idle.ms", "default.api.timeout.ms",
    "request.timeout.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms", "retry.backoff.max.ms",
    "receive.buffer.bytes", "send.buffer.bytes", "exclude.internal.topics", "allow.auto.create.topics",
    "interceptor.classes", "metric.reporters", "metrics.num.samples", "metrics.recording.level",
    "metrics.sample.window.ms", "auto.include.jmx.reporter", "enable.metrics.push", "client.dns.lookup",
    "socket.connection.setup.timeout.ms", "socket.connection.setup.timeout.max.ms",
    "internal.leave.group.on.close", "internal.throw.on.fetch.stable.offset.unsupported",
    "consumer.id", "security.providers", "metadata.recovery.strategy", "metadata.recovery.rebootstrap.trigger.ms",
    "share.acknowledgement.mode",
    # librdkafka consumer properties
    "queued.min.messages", "queued.max.messages.kbytes", "fetch.message.max.bytes", "fetch.error.backoff.ms",
    "fetch.queue.backoff.ms", "enable.partition.eof", "enable.auto.offset.store", "statistics.interval.ms",
    "socket.timeout.ms", "socket.keepalive.enable", "socket.nagle.disable", "socket.max.fails",
    "socket.send.buffer.bytes", "socket.receive.buffer.bytes", "api.version.request",
    "api.version.request.timeout.ms", "api.version.fallback.ms", "broker.version.fallback",
    "broker.address.ttl", "broker.address.family", "log.connection.close", "log.queue", "log.thread.name",
    "log_level", "debug", "coordinator.query.interval.ms", "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.refresh.sparse", "topic.metadata.propagation.max.ms", "topic.blacklist",
    "message.max.bytes", "message.copy.max.bytes", "receive.message.max.bytes", "max.in.flight",
    "max.in.flight.requests.per.connection", "consume.callback.max.messages", "enable.random.seed",
    "internal.termination.signal", "offset.store.method", "auto.commit.interval", "reconnect.backoff.jitter.ms",
    "resolve.canonical.bootstrap.servers.only",
    "enable.sparse.connections", "client.software.name", "client.software.version",
})

#: Kafka consumer properties only the gateway's operator sets (per tenant): refused per instance.
OPERATOR_ONLY_PREFIXES = ("ssl.", "sasl.", "security.", "ssl_", "sasl_")
OPERATOR_ONLY = frozenset({
    "bootstrap.servers", "metadata.broker.list", "group.id", "security.protocol", "enable.ssl.certificate.verification",
})

_INT_SCHEMA = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": INT32_MAX},
                         {"type": "string", "pattern": "^[0-9]{1,9}$"}]}
_STRING_SCHEMAS: dict[str, dict[str, Any]] = {
    "partition.assignment.strategy": {
        "type": "string", "pattern": rf"^\s*({_ASSIGNOR_RE})(\s*,\s*({_ASSIGNOR_RE}))*\s*$",
        "description": "range, roundrobin, cooperative-sticky or their Java class names, comma-separated"},
    "client.id": {"type": "string", "pattern": "^(?!\\.\\.?$)[A-Za-z0-9._-]{1,200}$"},
    "client.rack": {"type": "string", "maxLength": 200, "pattern": "^[^\\x00-\\x1f\\x7f]*$"},
    "group.protocol": {
        "type": "string", "enum": ["classic", "consumer"],
        "description": "classic (JoinGroup/SyncGroup) or consumer (KIP-848: the broker assigns and a member "
                       "joining or leaving moves only the partitions that must move; Apache Kafka 4.0+). "
                       "Default: GATEWAY_GROUP_PROTOCOL"},
    "group.remote.assignor": {
        "type": "string", "enum": ["uniform", "range"],
        "description": "group.protocol consumer: the broker-side assignor (default: the broker's first, uniform)"},
}


def property_schemas() -> dict[str, dict[str, Any]]:
    """JSON schemas of the Kafka properties a create body may carry besides its fields (for OpenAPI)."""
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(HONOURED):
        out[key] = dict(_STRING_SCHEMAS.get(key, _INT_SCHEMA))
        out[key].setdefault("description", f"Kafka consumer property, applied to the instance ({HONOURED[key][0]})")
    for key in sorted(IGNORED):
        out[key] = {"description": "client-side Kafka consumer property: accepted and ignored"}
    return out


#: The wait of a records request without ``timeout`` on an instance without ``consumer.request.timeout.ms``
#: (Confluent's default of that config).
DEFAULT_POLL_TIMEOUT_MS = 1000


def poll_timeout_ms(timeout: int | None, request_timeout_ms: int | None) -> int:
    """How long one records request may wait (ms), before the gateway's cap (``GATEWAY_MAX_POLL_TIMEOUT_MS``).

    ``timeout``: the request's query parameter; ``request_timeout_ms``: the instance's
    ``consumer.request.timeout.ms``, None when the client did not set it. Set, it has Confluent's meaning
    (kafka-rest's read task): the wait of a request without a timeout or with ``timeout <= 0``, and the
    cap of any other. Unset, a request waits its ``timeout`` (0: answer at once), else 1000 ms."""
    if request_timeout_ms is None:
        return DEFAULT_POLL_TIMEOUT_MS if timeout is None else timeout
    if timeout is None or timeout <= 0:
        return request_timeout_ms
    return min(timeout, request_timeout_ms)


_logged: set[str] = set()


@dataclass
class ConsumerProperties:
    overrides: dict[str, Any] = field(default_factory=dict)  # ConsumerConfig field → value
    ignored: list[str] = field(default_factory=list)


def parse_properties(extra: dict[str, Any]) -> ConsumerProperties:
    """Sort the keys of a create body that are not first-class fields; raise :class:`ConfigError`."""
    out = ConsumerProperties()
    for key, value in extra.items():
        if key in HONOURED:
            name, parse = HONOURED[key]
            out.overrides[name] = parse(key, value)
        elif key in IGNORED:
            out.ignored.append(key)
        elif key in OPERATOR_ONLY or key.startswith(OPERATOR_ONLY_PREFIXES):
            raise ConfigError(f"{key!r} cannot be set per consumer instance: the gateway's operator configures "
                              "the Kafka connection and the group comes from the URL", 42204)
        else:
            raise ConfigError(f"unknown consumer configuration key {key!r}", 42204)
    for key in out.ignored:
        if key not in _logged:
            _logged.add(key)
            log.info("ignoring the client-side Kafka consumer property %r (it has no effect in the gateway)", key)
    return out
