"""Gateway configuration from environment variables with the ``GATEWAY_`` prefix (pydantic-settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.client.connection import ConnectionConfig, SaslConfig
from service.lib.tls import build_ssl_context
from service.schemas.formats import SchemaLimits
from service.schemas.registry import RegistryConfig
from service.tenants.quotas import Quotas

# Tansu (the embedded broker) answers a parked fetch only when its wait ends: poll it briskly while a
# client waits for records.
EMBEDDED_LONG_POLL_FETCH_WAIT_MS = 10
# Tansu holds a JoinGroup for about half the group session timeout before it answers, so with Kafka's
# 45 s default a new user would wait ~23 s for a first record after subscribing. On the embedded broker
# (a development broker on this machine, heartbeats over loopback every 0.5 s) a 2 s session gets the first
# assignment in ~1 s (4 s: ~2 s, a third of the time to read 5M records as a user measures it, bench/user_view.py);
# external brokers keep Kafka's defaults.
EMBEDDED_SESSION_TIMEOUT_MS = 2000
# Tansu holds a static member's JoinGroup and SyncGroup about 3 s each whatever the session timeout, and expires
# a member whose held request outlasts its session: static members need a longer one (docs/groups.md)
EMBEDDED_STATIC_SESSION_TIMEOUT_MS = 10000
EMBEDDED_HEARTBEAT_INTERVAL_MS = 500
KAFKA_SESSION_TIMEOUT_MS = 45000
KAFKA_HEARTBEAT_INTERVAL_MS = 3000
#: service/schemas/produce.py STRATEGIES (Confluent's subject-name strategy class names)
SubjectNameStrategy = Literal["TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore")

    host: str = Field("127.0.0.1", description="HTTP listen address")
    port: int = Field(8080, ge=0, le=65535, description="HTTP listen port")
    kafka_bootstrap: str | None = Field(
        None, description="Kafka bootstrap servers (host:port,...). Unset: start an embedded Tansu broker"
    )
    embedded_broker_port: int = Field(0, ge=0, le=65535, description="Port of the embedded broker (0: a free port)")
    embedded_broker_storage: str | None = Field(None, description="Tansu storage URL (default memory://)")
    embedded_broker: Literal["tansu", "kafka"] = Field(
        "tansu", description="The broker started when GATEWAY_KAFKA_BOOTSTRAP is unset: 'tansu' (starts in "
        "milliseconds, in memory) or 'kafka' (Apache Kafka, single-node KRaft from Maven Central jars that "
        "tools/install-kafka.sh installs; starts in a few seconds, data in a temporary directory deleted at exit). "
        "See docs/brokers.md")
    embedded_kafka_lib: str | None = Field(
        None, description="Directory of the embedded Apache Kafka's jars (default: where tools/install-kafka.sh "
        "puts them, ~/.cache/kcg-kafka/<version>/lib)")
    client_id: str = "kafka-consumer-gateway"
    request_timeout_ms: int = Field(30000, gt=0)
    connect_timeout_ms: int = Field(10000, gt=0)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    tenants_file: str | None = Field(None, description="YAML file of tenants; unset: one 'default' tenant, no auth")
    denied_topics: str = Field(
        "", description="Comma-separated topic patterns (globs or re:<RE2>) no tenant may touch, added to the "
        "built-in internal topics __*, _schemas, _confluent*; checked before every tenant's own patterns")
    denied_topics_defaults: bool = Field(
        True, description="false: only GATEWAY_DENIED_TOPICS is denied, not the built-in internal topics")
    public_url: str | None = Field(None, description="External base URL used in base_uri (else from Forwarded headers)")
    allowed_hosts: str | None = Field(
        None, description="Comma-separated Host header values served (host: any port; host:port; [IPv6]; "
        "'.example.com': the domain and its subdomains; '*': no check); others get 421/42101 (/healthz, /readyz "
        "and peer-token requests exempt). Unset: in open mode (no tenants file) the bind address, localhost, "
        "127.0.0.1, [::1] and the hosts of GATEWAY_PEERS and GATEWAY_PUBLIC_URL; with a tenants file no check")
    forwarded_allow_ips: str = Field(
        "127.0.0.1", description="Comma-separated addresses or networks (CIDR) of proxies whose Forwarded / "
        "X-Forwarded-* headers are trusted (base_uri, client address); '*' trusts every client. Like uvicorn's")
    admin_token: SecretStr | None = Field(
        None, description="Bearer token for /metrics and the detailed /readyz (tenants, brokers, errors); "
        "unset: /metrics is open and /readyz answers only its status")
    auth_failures_per_minute: int = Field(
        20, ge=0, description="Wrong credentials (API keys, JWTs, admin and peer tokens) allowed per client address "
        "and minute; beyond that wrong ones answer 429/42901, valid ones always pass (0: no limit)")
    replica_id: str = Field(
        "r0", description="This replica's stable name (letters, digits, '-'; on Kubernetes the StatefulSet pod "
        "name): in generated instance ids, in the routing ring and in static group.instance.ids")
    static_membership: bool = Field(
        False, description="Instances created without group.instance.id get one derived from this replica's "
        "stable identity ('<replica_id>.<tenant>.<instance name>'), so a restarted pod whose clients recreate "
        "their instances within the session timeout rejoins without a rebalance (KIP-345)")
    group_protocol: Literal["classic", "consumer"] = Field(
        "classic", description="Group protocol of consumer instances whose create body sets no group.protocol: "
        "classic (JoinGroup/SyncGroup) or consumer (KIP-848: the broker assigns, joins and leaves move only the "
        "partitions that must move; needs Apache Kafka 4.0+, not Tansu). docs/consumer-protocol.md")
    durable_instances: bool = Field(
        False, description="Durable consumer instances: each instance has a descriptor in the tenant's cluster "
        "(instances_topic); an instance a replica is asked for but nobody holds (its replica died, stopped or "
        "restarted) is re-created from it with the same options, static member id and subscription, positions "
        "from the committed offsets (at-least-once from the last commit). Off for a bare process because it "
        "creates and writes a topic in every tenant's cluster; the Helm chart turns it on (docs/routing.md)")
    instances_topic: str = Field(
        "__kcg_instances", min_length=1, max_length=249,
        description="The compacted topic of the instance descriptors (created at first use)")
    move_instances: bool = Field(
        True, description="With durable instances and peers: when the replica set changes (scale-out, a replica "
        "back), an instance whose ring owner is now another replica is handed off to it between requests and "
        "re-created there (only those instances move). False: instances stay where they are")
    instance_move_after_s: float = Field(
        10.0, ge=0, description="With move_instances: how long a replica must have been up (answering probes, "
        "not draining, same process) before instances move to it, so that a flapping replica moves nothing")
    peers: str | None = Field(
        None, description="Routing: comma-separated base URLs of every gateway replica (this one included), "
        "e.g. http://10.0.0.5:8080. Requests for an instance another replica holds are forwarded to it")
    peer_dns: str | None = Field(
        None, description="Routing: 'host:port' of a headless Service; its addresses (re-resolved every "
        "peer_refresh_s) are the replica set. Used instead of GATEWAY_PEERS on Kubernetes")
    peer_refresh_s: float = Field(2.0, gt=0, description="How often the replica set is re-read and probed")
    peer_token: SecretStr | None = Field(
        None, description="Shared secret of the replicas: required on the /internal endpoints and marks "
        "forwarded requests. Required with peers (the gateway refuses to start without it)")
    resume_key: SecretStr | None = Field(
        None, description="Secret behind the MAC of stream resume tokens (SSE id, ndjson 'resume'); the same on "
        "every replica. Unset: derived from GATEWAY_PEER_TOKEN; neither: a random key per process (tokens then "
        "do not survive a restart and are refused with 400/40004)")
    tls_cert_file: str | None = Field(
        None, description="PEM certificate (chain) of this gateway's listener: with tls_key_file the port serves "
        "HTTPS only (clients, probes and peers). Unset: plain HTTP")
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file (unencrypted)")
    peer_tls_ca_file: str | None = Field(
        None, description="PEM CA bundle that verifies the replicas' certificates. Set (or with tls_cert_file): "
        "peers are reached over https (GATEWAY_PEERS entries without a scheme and GATEWAY_PEER_DNS addresses; "
        "http:// entries refuse to start); unset: the system CAs")
    peer_tls_server_name: str | None = Field(
        None, description="The name a peer's certificate must carry. Default: the GATEWAY_PEER_DNS host for "
        "discovered peers (they are reached by address), the URL's host for GATEWAY_PEERS entries")
    routing: Literal["forward", "redirect", "off"] = Field(
        "forward", description="With peers: 'forward' proxies requests for instances held elsewhere (streams "
        "and long polls included); 'redirect' answers 307 to the owner's address; 'off' serves locally only")
    instance_idle_timeout_s: float = Field(300.0, gt=0, description="Idle consumer instances expire after this")
    max_poll_timeout_ms: int = Field(30000, gt=0, description="Cap on a records request's timeout")
    prefetch_bytes_per_instance: int = Field(
        16 * 1024 * 1024, gt=0, description="No new fetch while an instance has this much buffered (fetched, not "
        "yet delivered); within the process budget memory_budget_bytes. 16 MB keeps a fast poller supplied while "
        "the broker prepares its next response (4 MB let the buffer run dry: poll p99 22-29 ms vs 16-19 ms)")
    memory_budget_bytes: int = Field(
        512 * 1024 * 1024, gt=0, description="One memory bound for the process: consumer prefetch and in-flight "
        "fetches (at most three quarters of it), offset-range pages being read and rendered (3 x max_bytes each) "
        "and request bodies being received (twice their size). A request that does not fit waits memory_wait_s, "
        "then 503/50305 with Retry-After")
    memory_wait_s: float = Field(
        2.0, ge=0, description="How long a range read or request body waits for room in memory_budget_bytes "
        "before 503/50305")
    max_batch_inflated_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest decompressed size of one record batch: a batch inflating "
        "past it (a decompression bomb) is refused with 422/42209 naming topic, partition and offset (range reads, "
        "polls, streams), never decompressed further")
    max_body_bytes: int = Field(1024 * 1024, gt=0, description="Largest accepted request body")
    max_instances: int | None = Field(None, description="Cap on consumer instances in this replica")
    # Per-tenant quotas: the defaults of every tenant (open mode's 'default' tenant too) where the tenants
    # file sets none; 0 = unlimited. See docs/security.md for the sizing.
    default_max_instances: int = Field(
        1000, ge=0, description="Consumer instances per tenant across all replicas (429/42901); 0 = unlimited")
    default_max_topics_per_subscription: int = Field(
        1000, ge=0, description="Topics one subscription or assignment may name (422/42206); 0 = unlimited")
    default_max_concurrent_polls: int = Field(
        1000, ge=0, description="Concurrent polls, streams and range reads per tenant (429/42901; each replica "
        "allows its share: ceil(limit / live replicas)); 0 = unlimited")
    default_max_streams: int = Field(
        100, ge=0, description="Concurrent ndjson/SSE streams per tenant (429/42901; per-replica share); "
        "0 = unlimited")
    default_max_range_reads: int = Field(
        16, ge=0, description="Concurrent offset-range reads per tenant (429/42901; per-replica share); "
        "0 = unlimited")
    default_requests_per_second: float = Field(
        0.0, ge=0, description="Requests per second per tenant, a token bucket (429/42901 with Retry-After; "
        "per-replica share); 0 = unlimited (shipped: a rate below what a replica serves throttles one heavy "
        "but well-behaved client, one above it protects nothing; set it per tenant for fairness, see "
        "docs/security.md)")
    default_burst: int = Field(
        0, ge=0, description="Token-bucket size of default_requests_per_second (per-replica share); "
        "0 = ceil(rate)")
    quota_sync_s: float = Field(
        10.0, gt=0, description="With peers: the owner of record of a tenant's instance count re-asks every "
        "replica for its instances this often (and before counting, when the replica set changed)")
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto", description="Event loop: uvloop when installed ('auto'), or the standard asyncio loop")
    http_parser: Literal["auto", "httptools", "h11"] = Field(
        "auto", description="uvicorn's HTTP/1.1 parser: httptools (C) when installed ('auto'), or h11")
    http_keep_alive_s: int = Field(
        65, gt=0, description="An idle HTTP keep-alive connection is closed after this (uvicorn's default is "
        "5 s; longer than the usual 60 s of load balancers, so the server never closes first under them)")
    http_max_header_bytes: int = Field(
        16 * 1024, ge=8 * 1024, le=64 * 1024, description="Largest request head (request line and header "
        "lines): 431 / 43101 above, before the rest is read")
    http_max_headers: int = Field(100, ge=1, le=1000, description="Most header fields in a request (431 / 43101)")
    http_header_timeout_s: float = Field(
        10.0, gt=0, description="A request head must be complete this long after its first byte (or after the "
        "connection opened): 408 / 40801 otherwise, and the connection is closed")
    http_max_connections: int = Field(
        10_000, ge=0, description="Open HTTP connections per replica (streams included); a connection over it "
        "gets 503 / 50304 and is closed; 0 = no limit")
    http_max_unsent_bytes: int = Field(
        1024 * 1024, ge=64 * 1024, description="Answer bytes a connection may have written but not yet sent "
        "(the client reads slower than the gateway writes) before writers wait for it to drain: answers are "
        "written in pieces of at most this size and a request's memory charge is held until its answer left "
        "the process")
    http_send_timeout_s: float = Field(
        30.0, gt=0, description="A connection whose unsent answer bytes stay above http_max_unsent_bytes for "
        "this long (the client stopped reading) is closed, and what it held is released")
    produce_max_records: int = Field(
        10_000, ge=1, description="Most records in one v2 produce request (413 / 41303 above, nothing written); "
        "a 1 MiB body of 100-byte values holds about 7,000")
    readyz_tenants: Literal["all", "any"] = Field(
        "all", description="/readyz and kcg_ready: 'all' ready only while the brokers of every tenant answer; "
        "'any' ready while those of at least one tenant answer, the failing tenants listed (status 'degraded'): "
        "with tenants on separate clusters, one cluster's outage or one tenant's refused credentials then does "
        "not take every tenant off the load balancer")
    readyz_cache_s: float = Field(
        1.0, ge=0, le=60, description="/readyz answers from its last broker check for this long (concurrent probes "
        "share one check)")
    gc_freeze_interval_s: float = Field(
        30.0, ge=0, description="Every this many seconds, freeze the objects that survived (gc.freeze) so the "
        "collector never re-walks thousands of long-lived instances; 0 = Python's default collector")
    shutdown_timeout_s: float = Field(
        10.0, gt=0, description="On shutdown, in-flight HTTP requests get this long to finish (streams are cut "
        "then); then instances close (final commit, LeaveGroup) within the same deadline, after which the "
        "remaining closes are cancelled and broker connections are closed hard")
    shutdown_drain_s: float = Field(
        1.5, ge=0, description="On SIGTERM, first stop handing out records (long polls return, streams end "
        "with a final 'shutting down' line) but keep the listener open this long for commits and other "
        "requests of existing instances (new instances: 503); ends early once no request is in flight")
    consumer_session_timeout_ms: int | None = Field(
        None, gt=0, description="Group session timeout of instances. Default: Kafka's 45000, or on the embedded broker "
        "2000 (Tansu holds a JoinGroup for half of it), 10000 with static membership (Tansu holds a static "
        "member's JoinGroup and SyncGroup about 3 s each and does not count a restarted one's JoinGroup as contact)")
    consumer_heartbeat_interval_ms: int | None = Field(
        None, gt=0, description="Heartbeat interval. Default: Kafka's 3000, or 500 on the embedded broker")
    consumer_max_poll_interval_ms: int = Field(300000, gt=0)
    consumer_fetch_max_wait_ms: int = Field(
        500, ge=0, description="Broker-side fetch wait (Kafka answers a parked fetch as soon as data arrives)")
    consumer_long_poll_fetch_max_wait_ms: int | None = Field(
        None, ge=0, description="Broker-side fetch wait while records flow to an instance an HTTP client is "
        "polling (within the last second). For brokers that answer a parked fetch only when its wait ends "
        "(Tansu): bounds produce-to-HTTP latency. Default: 10 on the embedded Tansu broker, else the same as "
        "consumer_fetch_max_wait_ms (off)")
    poll_linger_ms: float = Field(
        5.0, ge=0, le=1000, description="Once a records request has records to return, it gathers for at most "
        "this long while fetches that may bring records of other assigned partitions are outstanding, so one "
        "request returns what is waiting across the assignment (never once max_records / max_bytes are "
        "buffered, never past the request's timeout); 0: return as soon as anything is buffered. Streams "
        "do not linger")
    topic_metadata_ttl_s: float = Field(
        1.0, ge=0, description="GET /topics and topic/partition descriptions are answered from Metadata and "
        "DescribeConfigs responses at most this old (a topic not in the cache is looked up at once)")

    producer_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none", description="Compression of the record batches the produce endpoints write")
    producer_linger_ms: float = Field(
        0.0, ge=0, description="How long a partition's first queued record waits for more before its batch "
        "is sent (0: at once; records arriving while a batch is in flight form the next batch anyway)")
    producer_max_batch_bytes: int = Field(
        1_000_000, gt=0, description="Largest record batch (uncompressed bytes) the producer sends")
    producer_delivery_timeout_ms: int = Field(
        60000, gt=0, description="A produced record not acknowledged within this fails (retriable)")
    producer_idempotent: bool = Field(
        True, description="Idempotent producer (producer id + sequences: retries never duplicate)")
    producer_max_in_flight_per_broker: int = Field(
        1, ge=1, le=5, description="Produce requests in flight per broker (each partition has one batch in flight "
        "whatever this is). 1: the next request leaves when the previous one answered and carries every "
        "partition's queued records (fewer, larger requests: the least CPU for the gateway and the broker); more "
        "may lower latency for partitions queued behind a slow request on a high-latency network")
    max_partitions_per_topic: int = Field(
        1000, ge=1, le=2**31 - 1, description="Most partitions a v3 topic create may ask for (partitions_count or "
        "replicas_assignments); more is 422/42213, also with validate_only")
    topic_configs_allowed: str = Field(
        "cleanup.policy,compression.type,delete.retention.ms,max.compaction.lag.ms,message.timestamp.type,"
        "min.cleanable.dirty.ratio,min.compaction.lag.ms,min.insync.replicas,retention.bytes,retention.ms",
        description="Comma-separated topic configs a v3 topic create may set (a tenant's admin_topic_configs "
        "replaces it); another is 422/42214. '*': any. Left out by default: configs that can hurt the broker or "
        "other tenants (segment.*, flush.*, index.*, file.delete.delay.ms, preallocate, "
        "unclean.leader.election.enable, throttled replicas, tiered storage) or that only matter to writers "
        "other than the gateway (max.message.bytes)")
    auto_create_topics: bool | None = Field(
        None, description="Produce to a missing topic creates it (CreateTopics with auto_create_partitions and "
        "auto_create_replication_factor) instead of answering 404/40401; the tenant's topic patterns, its admin_topics "
        "(with a tenants file) and Kafka's topic-name rules still apply. Default: on with the embedded broker (make "
        "run), else off")
    auto_create_partitions: int = Field(
        1, ge=1, le=100_000, description="Partitions of a topic created by produce (Kafka's num.partitions default)")
    auto_create_replication_factor: int = Field(
        -1, ge=-1, le=32767, description="Replication factor of a topic created by produce; -1: the broker's "
        "default.replication.factor (CreateTopics v4+)")

    # Schema Registry; gateway-wide, a tenant may name its own in the tenants file
    schema_registry_url: str | None = Field(
        None, description="Base URL of the Confluent-compatible Schema Registry of the avro, protobuf and "
        "jsonschema formats (e.g. http://registry:8081)")
    # schema'd produce (service/schemas/produce.py): the subject a key_schema/value_schema
    # posted as text is registered under
    schema_subject_name_strategy: SubjectNameStrategy = Field(
        "TopicNameStrategy", description="Subject of a schema posted with produce: TopicNameStrategy "
        "(<topic>-key / <topic>-value), RecordNameStrategy (the record's fully-qualified name) or "
        "TopicRecordNameStrategy (<topic>-<record name>)")
    schema_key_subject_name_strategy: SubjectNameStrategy | None = Field(
        None, description="The strategy for key schemas (unset: GATEWAY_SCHEMA_SUBJECT_NAME_STRATEGY)")
    schema_value_subject_name_strategy: SubjectNameStrategy | None = Field(
        None, description="The strategy for value schemas (unset: GATEWAY_SCHEMA_SUBJECT_NAME_STRATEGY)")
    schema_registry_basic_auth: SecretStr | None = Field(
        None, description="'user:password' for the registry's HTTP basic auth (never logged)")
    schema_registry_bearer_token: SecretStr | None = Field(
        None, description="Bearer token for the registry (instead of basic auth)")
    schema_registry_ca_file: str | None = Field(
        None, description="PEM CA bundle verifying an https registry's certificate (unset: the system CAs)")
    schema_registry_tls_verify: bool = Field(
        True, description="false: do not verify the registry's certificate (tests only)")
    schema_registry_timeout_s: float = Field(
        5.0, gt=0, description="Connect timeout and wall-clock bound of one registry request; past it the "
        "registry counts as unavailable (retryable)")
    schema_registry_cache_size: int = Field(
        1000, ge=0, description="Schemas by id (immutable) and ids of registered schemas kept in memory (each)")
    schema_max_depth: int = Field(64, ge=8, le=1000, description="Deepest nesting the schema'd formats accept: "
        "JSON Schema subschemas and validated values, Protobuf and Avro values (objects/arrays/records). Past it a "
        "produce is refused (422) and a polled record is that record's error")
    # bounds of schemas and of what the registry costs (service/schemas/formats.py SchemaLimits)
    schema_max_bytes: int = Field(
        256 * 1024, ge=1024, description="Largest schema, in bytes of its text with its references, the gateway "
        "compiles: a key_schema/value_schema posted over it is refused 413/41302, the records of a schema id "
        "over it are per-record errors. A compile costs ~3 us and ~64 bytes of memory per schema byte (Avro), "
        "so 256 KiB is ~1 s of a worker thread and ~16 MiB at most")
    schema_cache_max_bytes: int = Field(
        128 * 1024 * 1024, ge=1024 * 1024, description="Byte budget of one registry's schema caches (schemas, "
        "registered ids, compiled codecs and Arrow readers charged 64x their text, C renderer programs 16x, the "
        "subjects of schema ids): "
        "past it the least recently used entry of any of them goes")
    schema_registry_max_concurrent_requests: int = Field(
        8, ge=1, description="HTTP requests in flight to one schema registry at most (the others wait, at most "
        "GATEWAY_SCHEMA_REGISTRY_TIMEOUT_S)")
    schema_registry_max_ids_per_poll: int = Field(
        100, ge=1, description="New schema ids one poll (or stream chunk) resolves at most; the records of "
        "the others are delivered as per-record errors with their bytes (value_base64), a later poll resolves "
        "them. A typed range read resolves all of its page's ids, this many at a time")
    # limits on one decoded Avro value (service/schemas/avro_limits.py): a value over them is its record's error
    schema_max_decoded_bytes: int = Field(
        16 << 20, ge=1024, description="The most bytes of JSON one Avro key or value may render to (whatever "
        "its payload); over it, that record's per-record error")
    schema_max_expansion: int = Field(
        64, ge=1, description="Rendered JSON bytes per payload byte one Avro key or value may produce above "
        "the first 64 KiB (so a poll answer stays within a multiple of its max_bytes); over it, that record's "
        "per-record error. Items (the value, each record field, array item and map value) are bounded to 4096 + 8 "
        "per payload byte")
    avro_json_rendering: Literal["confluent", "karapace"] = Field(
        "confluent", description="How avro records are rendered as JSON: confluent (Confluent REST Proxy v2: "
        "unions tagged by branch, {\"int\": 5}; bytes as one character per byte) or karapace (unions "
        "untagged; bytes base64). A consumer may choose its own with \"avro.json.rendering\" at creation")
    # the embedded registry of `make run` (service/embedded/registry.py)
    embedded_registry: Literal["auto"] | bool = Field(
        "auto", description="Start a Schema Registry (Karapace, from GATEWAY_REGISTRY_LAUNCHER) next to the "
        "embedded broker when GATEWAY_SCHEMA_REGISTRY_URL is unset: 'auto' when the launcher is found, true: "
        "required (refuse to start without the launcher), false: never")
    registry_launcher: str | None = Field(
        None, description="The registry launcher (`start --bootstrap HOST:PORT --port N`). Default: "
        "../shared/registry/start beside the repository")
    embedded_registry_port: int = Field(
        0, ge=0, le=65535, description="Port of the embedded registry on 127.0.0.1 (0: a free port)")

    def schema_registry_config(self) -> RegistryConfig | None:
        """The gateway-wide registry's client configuration (``None`` without GATEWAY_SCHEMA_REGISTRY_URL)."""
        if not self.schema_registry_url:
            return None
        basic, bearer = self.schema_registry_basic_auth, self.schema_registry_bearer_token
        return RegistryConfig(
            self.schema_registry_url,
            basic_auth=basic.get_secret_value() if basic else None,
            bearer_token=bearer.get_secret_value() if bearer else None,
            ca_file=self.schema_registry_ca_file, verify=self.schema_registry_tls_verify,
            timeout_s=self.schema_registry_timeout_s, cache_size=self.schema_registry_cache_size)

    def schema_limits(self) -> SchemaLimits:
        """The bounds every registry's client and resolver get."""
        return SchemaLimits(max_schema_bytes=self.schema_max_bytes, cache_max_bytes=self.schema_cache_max_bytes,
                            max_concurrent_requests=self.schema_registry_max_concurrent_requests,
                            max_ids_per_poll=self.schema_registry_max_ids_per_poll)

    def default_quotas(self) -> Quotas:
        """The tenants' default quotas from the ``default_*`` settings (0: unlimited)."""
        def cap(value: int) -> int | None:
            return value or None

        return Quotas(
            max_instances=cap(self.default_max_instances),
            max_concurrent_polls=cap(self.default_max_concurrent_polls),
            requests_per_second=self.default_requests_per_second or None,
            burst=cap(self.default_burst) if self.default_requests_per_second else None,
            max_streams=cap(self.default_max_streams),
            max_range_reads=cap(self.default_max_range_reads),
            max_topics_per_subscription=cap(self.default_max_topics_per_subscription),
        )

    def session_timeout_ms(self) -> int:
        if self.consumer_session_timeout_ms is not None:
            return self.consumer_session_timeout_ms
        if self.kafka_bootstrap:
            return KAFKA_SESSION_TIMEOUT_MS
        return EMBEDDED_STATIC_SESSION_TIMEOUT_MS if self.static_membership else EMBEDDED_SESSION_TIMEOUT_MS

    def heartbeat_interval_ms(self) -> int:
        if self.consumer_heartbeat_interval_ms is not None:
            return self.consumer_heartbeat_interval_ms
        return EMBEDDED_HEARTBEAT_INTERVAL_MS if not self.kafka_bootstrap else KAFKA_HEARTBEAT_INTERVAL_MS

    def long_poll_fetch_wait_ms(self) -> int | None:
        if self.consumer_long_poll_fetch_max_wait_ms is not None:
            return self.consumer_long_poll_fetch_max_wait_ms
        tansu = not self.kafka_bootstrap and self.embedded_broker == "tansu"
        return EMBEDDED_LONG_POLL_FETCH_WAIT_MS if tansu else None

    def topic_configs_allowed_set(self) -> frozenset[str]:
        """GATEWAY_TOPIC_CONFIGS_ALLOWED as a set of names (``*`` in it: any)."""
        return frozenset(n.strip() for n in self.topic_configs_allowed.split(",") if n.strip())

    def auto_create_topics_enabled(self) -> bool:
        if self.auto_create_topics is not None:
            return self.auto_create_topics
        return not self.kafka_bootstrap

    def connection_config(self) -> ConnectionConfig:
        ctx = None
        if self.security_protocol in ("SSL", "SASL_SSL"):
            ctx = build_ssl_context(
                self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile,
                self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
                self.ssl_check_hostname,
            )
        sasl = None
        if self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            if not self.sasl_username or self.sasl_password is None:
                raise ValueError("SASL needs GATEWAY_SASL_USERNAME and GATEWAY_SASL_PASSWORD")
            sasl = SaslConfig(self.sasl_mechanism, self.sasl_username, self.sasl_password.get_secret_value())
        return ConnectionConfig(
            client_id=self.client_id,
            request_timeout=self.request_timeout_ms / 1000,
            connect_timeout=self.connect_timeout_ms / 1000,
            ssl_context=ctx,
            sasl=sasl,
        )

