"""The PySpark Python data source ``kafka_gateway``: Kafka topics read through the gateway's HTTP API.

Batch (``spark.read.format("kafka_gateway")``) and streaming (``spark.readStream...``, with
``Trigger.AvailableNow`` support). Offsets are per-partition *next* offsets, ``{"topic:partition": offset}``
(JSON, string keys); the latest offset of a partition is its last stable offset (read_committed), taken from
``GET /topics/{t}/partitions/{p}/offsets``. A micro-batch ``[start, end)`` becomes one input partition per
Kafka partition, split into ranges of at most ``maxOffsetsPerTask`` offsets; ``read()`` pages through
``GET /topics/{t}/partitions/{p}/records`` with ``Accept: application/vnd.apache.arrow.stream`` and yields
Arrow record batches. Everything ``read()`` needs travels in the :class:`RangePartition` (readers are pickled).

Options (strings): ``gateway`` (URL, required), ``topics`` (comma list, required), ``apiToken`` (the gateway
API key; a name Spark's default ``spark.redaction.regex`` redacts in plans, the UI and logs; the older
``apiKey`` is still accepted but shown in clear),
``startingOffsets`` (``earliest`` (default) | ``latest`` | JSON ``{"topic:partition": offset}``),
``endingOffsets`` (batch only: ``latest`` | JSON), ``maxOffsetsPerTask`` (default 200000),
``maxRecordsPerTrigger`` (streaming: at most about this many offsets per micro-batch), ``maxBytesPerPage``,
``responseFormat`` (``arrow`` (default) | ``json``: the gateway's JSON answer, decoded record by record),
``valueFormat`` (``avro`` | ``protobuf`` | ``jsonschema``: typed values, below), ``valueSchemaId``
(``latest`` (default) | an id: the reader schema of typed values).

Typed values (``valueFormat``): the gateway decodes the Confluent wire format with the Schema Registry and
answers typed Arrow (``format=...`` on the range read); the table gets a ``value`` struct column (the fields
of the schema, as Spark's ``from_avro`` would give them) instead of bytes, plus ``value_schema_id`` (the
writer schema id per row), ``error`` (why a row's value is null although the record had one) and
``value_raw`` (the bytes of such rows). ONE reader schema is pinned when the query plans -- ``latest``:
the latest version of the subject ``{first topic}-value`` -- and every page of every task is read with it
(records of other writer schemas are resolved into it), so the table has one schema; a restarted query
picks the then latest schema (the Delta writer merges an added column into the table). All topics of a
typed query are read with that one schema. Keys stay binary.

Offsets are counted, not records: transaction markers and aborted or compacted records leave gaps, so a
range holds at most (usually slightly fewer) records than offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sink.http import ARROW, BINARY_JSON, GatewayError, GatewayHTTP, quote

NAME = "kafka_gateway"
DEFAULT_MAX_OFFSETS_PER_TASK = 200_000
DEFAULT_MAX_BYTES_PER_PAGE = 8 * 1024 * 1024
RESPONSE_FORMATS = ("arrow", "json")
VALUE_FORMATS = ("avro", "protobuf", "jsonschema")
STALL_PAGES = 50  # consecutive empty pages without progress before a read gives up

SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), True),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", ArrayType(StructType([StructField("key", StringType(), True),
                                                 StructField("value", BinaryType(), True)]), True), True),
])

Offsets = dict[str, int]


# -- pure planning ---------------------------------------------------------------------------------------
def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_key(key: str) -> tuple[str, int]:
    topic, _, p = key.rpartition(":")
    return topic, int(p)


def split_range(start: int, end: int, max_per_task: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into consecutive ranges of at most ``max_per_task`` offsets."""
    if max_per_task < 1:
        raise ValueError("maxOffsetsPerTask must be >= 1")
    return [(s, min(s + max_per_task, end)) for s in range(start, end, max_per_task)]


def cap_offsets(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """The end offsets of a micro-batch of at most ``max_rows`` offsets from ``start`` towards ``latest``,
    shared fairly between partitions (each gets an equal share, what one cannot use goes to the others)."""
    avail = {k: max(0, latest[k] - start.get(k, latest[k])) for k in latest}
    take = dict.fromkeys(avail, 0)
    budget = max_rows
    pending = sorted((k for k, a in avail.items() if a > 0), key=lambda k: (avail[k], k))
    while budget > 0 and pending:
        share = max(1, budget // len(pending))
        nxt = []
        for k in pending:
            if budget <= 0:
                break
            n = min(share, avail[k] - take[k], budget)
            take[k] += n
            budget -= n
            if take[k] < avail[k]:
                nxt.append(k)
        pending = nxt
    return {k: (start[k] + take[k] if k in start else latest[k]) for k in latest} | {
        k: v for k, v in start.items() if k not in latest}


def parse_topics(value: str | None) -> list[str]:
    topics = [t.strip() for t in (value or "").split(",") if t.strip()]
    if not topics:
        raise ValueError("option 'topics' is required (a comma-separated list of topic names)")
    return topics


def _int_option(options: dict[str, str], name: str, default: int | None) -> int | None:
    v = options.get(name)
    if v is None or v == "":
        return default
    n = int(v)
    if n < 1:
        raise ValueError(f"option {name!r} must be >= 1")
    return n


def _format_option(v: str) -> str:
    v = v.strip().lower()
    if v not in RESPONSE_FORMATS:
        raise ValueError(f"option 'responseFormat' must be one of {sorted(RESPONSE_FORMATS)}")
    return v


def _value_format_option(v: str | None) -> str | None:
    if v is None or v.strip().lower() in ("", "binary"):
        return None
    v = v.strip().lower()
    if v not in VALUE_FORMATS:
        raise ValueError(f"option 'valueFormat' must be one of {list(VALUE_FORMATS)} (or binary)")
    return v


def _schema_id_option(v: str | None) -> str:
    v = (v or "latest").strip().lower()
    if v != "latest" and not (v.isdigit() and 0 <= int(v) < 2**32):
        raise ValueError("option 'valueSchemaId' must be 'latest' or a schema id")
    return v


@dataclass(frozen=True)
class Settings:
    gateway: str
    topics: tuple[str, ...]
    api_key: str | None = field(repr=False)  # never in a log line or an error message
    starting: str
    ending: str
    max_offsets_per_task: int
    max_records_per_trigger: int | None
    max_bytes_per_page: int
    response_format: str = "arrow"
    value_format: str | None = None  # typed values (avro, protobuf, jsonschema); None: binary
    value_schema: str = "latest"  # the reader schema asked for: latest or an id
    value_schema_id: int | None = None  # the reader schema pinned for a query (resolved by typed())
    spark_schema: str | None = None  # the typed Spark schema (JSON) the pinned reader schema gives

    @property
    def typed(self) -> bool:
        return self.value_format is not None

    @classmethod
    def from_options(cls, options: Any) -> Settings:
        o = {str(k).lower(): str(v) for k, v in dict(options).items()}
        gateway = o.get("gateway")
        if not gateway:
            raise ValueError("option 'gateway' is required (the gateway's base URL)")
        return cls(gateway=gateway.rstrip("/"), topics=tuple(parse_topics(o.get("topics"))),
                   api_key=o.get("apitoken") or o.get("apikey") or None, starting=o.get("startingoffsets", "earliest"),
                   ending=o.get("endingoffsets", "latest"),
                   max_offsets_per_task=_int_option(o, "maxoffsetspertask", DEFAULT_MAX_OFFSETS_PER_TASK) or 1,
                   max_records_per_trigger=_int_option(o, "maxrecordspertrigger", None),
                   max_bytes_per_page=_int_option(o, "maxbytesperpage", DEFAULT_MAX_BYTES_PER_PAGE) or 1,
                   response_format=_format_option(o.get("responseformat", "arrow")),
                   value_format=_value_format_option(o.get("valueformat")),
                   value_schema=_schema_id_option(o.get("valueschemaid")))


# -- the gateway, planner side ---------------------------------------------------------------------------
def partition_offsets(http: GatewayHTTP, topics: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{"topic:p": {"beginning_offset", "end_offset", "last_stable_offset"}}`` for every partition."""
    out: dict[str, dict[str, int]] = {}
    for topic in topics:
        parts = http.get_json(f"/topics/{quote(topic)}/partitions", f"partitions of topic {topic!r}")
        for p in sorted(int(x["partition"]) for x in parts):
            out[tp_key(topic, p)] = http.get_json(f"/topics/{quote(topic)}/partitions/{p}/offsets",
                                                  f"offsets of {topic}-{p}")
    return out


def resolve_offsets(spec: str, offsets: dict[str, dict[str, int]], what: str) -> Offsets:
    if spec == "earliest":
        return {k: int(v["beginning_offset"]) for k, v in offsets.items()}
    if spec == "latest":
        return {k: int(v["last_stable_offset"]) for k, v in offsets.items()}
    try:
        given = {str(k): int(v) for k, v in json.loads(spec).items()}
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{what}: expected 'earliest', 'latest' or JSON {{\"topic:partition\": offset}}") from e
    unknown = sorted(set(given) - set(offsets))
    if unknown:
        raise ValueError(f"{what}: unknown partitions {unknown}")
    return {k: given.get(k, int(v["beginning_offset"])) for k, v in offsets.items()}


# -- typed values ----------------------------------------------------------------------------------------
def typed_params(fmt: str, schema_id: int | str) -> dict[str, Any]:
    return {"format": fmt, "value_schema_id": schema_id}


def fetch_typed_schema(http: GatewayHTTP, topic: str, fmt: str, schema: str | int) -> tuple[int, Any]:
    """The pinned reader schema id and the typed Arrow schema of ``topic``'s values: an empty typed range
    read (``end_offset`` = ``offset``: the gateway answers the schema alone, without asking the broker)."""
    import pyarrow as pa

    _, body = http.call("GET", f"/topics/{quote(topic)}/partitions/0/records",
                        f"the {fmt} value schema of topic {topic!r}",
                        {"offset": 0, "end_offset": 0, **typed_params(fmt, schema)}, accept=ARROW)
    arrow_schema = pa.ipc.open_stream(body).schema
    sid = (arrow_schema.metadata or {}).get(b"value_schema_id", b"")
    if not sid:
        raise GatewayError(f"topic {topic!r}: the gateway named no {fmt} value schema")
    return int(sid), arrow_schema


def typed_spark_schema(arrow_schema: Any) -> StructType:
    """The Spark schema of a typed page: the fixed columns, ``value`` from the reader schema's Arrow type."""
    from pyspark.sql.pandas.types import from_arrow_type

    value = from_arrow_type(arrow_schema.field("value").type)
    return StructType([*SCHEMA.fields[:5], StructField("value", value, True), SCHEMA.fields[6],
                       StructField("value_schema_id", IntegerType(), True), StructField("error", StringType(), True),
                       StructField("value_raw", BinaryType(), True)])


def typed(s: Settings) -> Settings:
    """``s`` with the reader schema pinned (asked from the gateway once) and the Spark schema it gives."""
    if not s.typed or s.spark_schema is not None:
        return s
    assert s.value_format is not None
    http = GatewayHTTP(s.gateway, s.api_key)
    try:
        sid, arrow_schema = fetch_typed_schema(http, s.topics[0], s.value_format, s.value_schema)
    finally:
        http.close()
    return replace(s, value_schema_id=sid, spark_schema=typed_spark_schema(arrow_schema).json())


def spark_schema(s: Settings) -> StructType:
    if not s.typed:
        return SCHEMA
    s = typed(s)
    assert s.spark_schema is not None
    return StructType.fromJson(json.loads(s.spark_schema))


def with_schema(s: Settings, schema: StructType) -> Settings:
    """Settings for a reader of ``schema`` (Spark's, from :meth:`KafkaGatewayDataSource.schema`)."""
    if not s.typed:
        return s
    s = typed(s)
    return replace(s, spark_schema=schema.json())


# -- input partitions and read() -------------------------------------------------------------------------
class RangePartition(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition, with what is needed to read them."""

    def __init__(self, gateway: str, api_key: str | None, topic: str, partition: int, start: int, end: int,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_PAGE, response_format: str = "arrow",
                 value_format: str | None = None, value_schema_id: int | None = None,
                 spark_schema: str | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.gateway, self.api_key, self.topic, self.partition = gateway, api_key, topic, partition
        self.start, self.end, self.max_bytes = start, end, max_bytes
        self.response_format = response_format
        self.value_format, self.value_schema_id, self.spark_schema = value_format, value_schema_id, spark_schema

    def __repr__(self) -> str:
        return f"RangePartition({self.topic}-{self.partition} [{self.start}, {self.end}))"


def plan_partitions(s: Settings, start: Offsets, end: Offsets,
                    beginnings: Offsets | None = None) -> list[RangePartition]:
    out = []
    for key in sorted(end, key=lambda k: parse_key(k)):
        topic, p = parse_key(key)
        lo = start.get(key, (beginnings or {}).get(key, 0))
        for a, b in split_range(lo, end[key], s.max_offsets_per_task):
            out.append(RangePartition(s.gateway, s.api_key, topic, p, a, b, s.max_bytes_per_page,
                                      s.response_format, s.value_format, s.value_schema_id, s.spark_schema))
    return out


def _target_schema(schema: StructType = SCHEMA) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _arrow_page(body: bytes, target: Any) -> tuple[list[Any], int, int]:
    """An Arrow IPC page: its record batches cast to ``target``, next_offset, end_offset."""
    import pyarrow as pa

    reader = pa.ipc.open_stream(body)
    meta = reader.schema.metadata or {}
    batches = [pa.RecordBatch.from_arrays([b.column(i).cast(target.field(i).type) for i in range(len(target))],
                                          schema=target) for b in reader if b.num_rows]
    return batches, int(meta[b"next_offset"]), int(meta[b"end_offset"])


def _json_page(body: bytes, target: Any) -> tuple[list[Any], int, int]:
    """A JSON page (``application/vnd.kafka.binary.v2+json``: base64 keys, values and header values) as one
    record batch of ``target``, next_offset, end_offset. Python objects per record: the slow path, for
    comparison with Arrow and for gateways without it."""
    import base64

    import pyarrow as pa

    d = json.loads(body)
    recs = d["records"]
    if not recs:
        return [], int(d["next_offset"]), int(d["end_offset"])

    def b64(v: str | None) -> bytes | None:
        return None if v is None else base64.b64decode(v)

    cols = [pa.array([d["topic"]] * len(recs), pa.string()), pa.array([d["partition"]] * len(recs), pa.int32()),
            pa.array([r["offset"] for r in recs], pa.int64()),
            pa.array([r["timestamp"] for r in recs], pa.int64()).cast(pa.timestamp("ms")),
            pa.array([b64(r["key"]) for r in recs], pa.binary()),
            pa.array([b64(r["value"]) for r in recs], pa.binary()),
            pa.array([[{"key": h["key"], "value": b64(h["value"])} for h in r.get("headers") or []] for r in recs],
                     pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))]
    batch = pa.RecordBatch.from_arrays([c.cast(target.field(i).type) for i, c in enumerate(cols)], schema=target)
    return [batch], int(d["next_offset"]), int(d["end_offset"])


def read_range(part: RangePartition) -> Iterator[Any]:
    """Arrow record batches (Spark's schema for :data:`SCHEMA`) of ``[start, end)``, page by page. Fails,
    rather than returning less, if the partition no longer holds the whole range."""
    value_format = getattr(part, "value_format", None)
    extra: dict[str, Any] = {}
    if value_format:  # typed: Arrow with the query's pinned reader schema, cast to the query's Spark schema
        assert part.spark_schema is not None and part.value_schema_id is not None
        target = _target_schema(StructType.fromJson(json.loads(part.spark_schema)))
        extra = typed_params(value_format, part.value_schema_id)
    else:
        target = _target_schema()
    http = GatewayHTTP(part.gateway, part.api_key)
    path = f"/topics/{quote(part.topic)}/partitions/{part.partition}/records"
    fmt = getattr(part, "response_format", "arrow")
    accept, parse = (ARROW, _arrow_page) if fmt == "arrow" or value_format else (BINARY_JSON, _json_page)
    offset, stalls = part.start, 0
    try:
        while offset < part.end:
            _, body = http.call("GET", path, f"records of {part.topic}-{part.partition} at {offset}",
                                {"offset": offset, "end_offset": part.end, "max_bytes": part.max_bytes, **extra},
                                accept=accept)
            batches, nxt, page_end = parse(body, target)
            rows = sum(b.num_rows for b in batches)
            yield from batches
            if nxt >= page_end and page_end < part.end:
                raise GatewayError(f"{part.topic}-{part.partition}: the range [{part.start}, {part.end}) is no "
                                   f"longer readable (the partition now ends at {page_end})")
            if nxt <= offset and not rows:
                stalls += 1
                if stalls >= STALL_PAGES:
                    raise GatewayError(f"{part.topic}-{part.partition}: no progress at offset {offset}")
            else:
                stalls = 0
            offset = max(offset, nxt)
    finally:
        http.close()


# -- the data source -------------------------------------------------------------------------------------
class KafkaGatewayDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return spark_schema(Settings.from_options(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaGatewayBatchReader(with_schema(Settings.from_options(self.options), schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaGatewayStreamReader(with_schema(Settings.from_options(self.options), schema))


def current_offsets(s: Settings) -> dict[str, dict[str, int]]:
    """Every partition's offsets (beginning, end, LSO) of the configured topics, from the gateway."""
    http = GatewayHTTP(s.gateway, s.api_key)
    try:
        return partition_offsets(http, s.topics)
    finally:
        http.close()


class KafkaGatewayBatchReader(DataSourceReader):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def partitions(self) -> Sequence[InputPartition]:
        s = self.settings
        offsets = current_offsets(s)
        start = resolve_offsets(s.starting, offsets, "startingOffsets")
        end = resolve_offsets(s.ending, offsets, "endingOffsets")
        parts: list[InputPartition] = list(plan_partitions(s, start, end))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        return read_range(partition)


class KafkaGatewayStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Planner-side state (the available-now target, the last LSOs seen) lives only in the long-lived
    planner process; ``read()`` uses nothing but its input partition."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.target: Offsets | None = None
        self.latest: Offsets | None = None
        self.beginnings: Offsets = {}

    def _offsets(self) -> dict[str, dict[str, int]]:
        s = self.settings
        offsets = current_offsets(s)
        self.beginnings = {k: int(v["beginning_offset"]) for k, v in offsets.items()}
        self.latest = {k: int(v["last_stable_offset"]) for k, v in offsets.items()}
        return offsets

    def initialOffset(self) -> dict:
        return resolve_offsets(self.settings.starting, self._offsets(), "startingOffsets")

    def prepareForTriggerAvailableNow(self) -> None:
        self._offsets()
        self.target = dict(self.latest or {})

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.settings.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._offsets()
        latest = dict(self.latest or {})
        if self.target is not None:  # available-now: never past what was there when the query started
            latest = {k: min(v, self.target.get(k, self.beginnings.get(k, 0))) for k, v in latest.items()}
        begin = {k: int(v) for k, v in start.items()}
        for k in latest:  # partitions that appeared since: from their beginning
            begin.setdefault(k, self.beginnings.get(k, 0))
        latest = {k: max(v, begin[k]) for k, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = cap_offsets(begin, latest, limit.max_rows)
        return {**begin, **latest}

    def reportLatestOffset(self) -> dict | None:
        return dict(self.latest) if self.latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        parts: list[InputPartition] = list(plan_partitions(self.settings, {k: int(v) for k, v in start.items()},
                                                           {k: int(v) for k, v in end.items()}, self.beginnings))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        return read_range(partition)

    def commit(self, end: dict) -> None:
        pass


def register(spark: Any) -> None:
    spark.dataSource.register(KafkaGatewayDataSource)
