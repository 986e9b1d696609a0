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
``responseFormat`` (``arrow`` (default) | ``json``: the gateway's JSON answer, decoded record by record).

Offsets are counted, not records: transaction markers and aborted or compacted records leave gaps, so a
range holds at most (usually slightly fewer) records than offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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
                   response_format=_format_option(o.get("responseformat", "arrow")))


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


# -- input partitions and read() -------------------------------------------------------------------------
class RangePartition(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition, with what is needed to read them."""

    def __init__(self, gateway: str, api_key: str | None, topic: str, partition: int, start: int, end: int,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_PAGE, response_format: str = "arrow") -> None:
        super().__init__((topic, partition, start, end))
        self.gateway, self.api_key, self.topic, self.partition = gateway, api_key, topic, partition
        self.start, self.end, self.max_bytes = start, end, max_bytes
        self.response_format = response_format

    def __repr__(self) -> str:
        return f"RangePartition({self.topic}-{self.partition} [{self.start}, {self.end}))"


def plan_partitions(s: Settings, start: Offsets, end: Offsets, beginnings: Offsets | None = None) -> list[RangePartition]:
    out = []
    for key in sorted(end, key=lambda k: parse_key(k)):
        topic, p = parse_key(key)
        lo = start.get(key, (beginnings or {}).get(key, 0))
        for a, b in split_range(lo, end[key], s.max_offsets_per_task):
            out.append(RangePartition(s.gateway, s.api_key, topic, p, a, b, s.max_bytes_per_page,
                                      s.response_format))
    return out


def _target_schema() -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


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
            pa.array([b64(r["key"]) for r in recs], pa.binary()), pa.array([b64(r["value"]) for r in recs], pa.binary()),
            pa.array([[{"key": h["key"], "value": b64(h["value"])} for h in r.get("headers") or []] for r in recs],
                     pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))]
    batch = pa.RecordBatch.from_arrays([c.cast(target.field(i).type) for i, c in enumerate(cols)], schema=target)
    return [batch], int(d["next_offset"]), int(d["end_offset"])


def read_range(part: RangePartition) -> Iterator[Any]:
    """Arrow record batches (Spark's schema for :data:`SCHEMA`) of ``[start, end)``, page by page. Fails,
    rather than returning less, if the partition no longer holds the whole range."""
    target = _target_schema()
    http = GatewayHTTP(part.gateway, part.api_key)
    path = f"/topics/{quote(part.topic)}/partitions/{part.partition}/records"
    fmt = getattr(part, "response_format", "arrow")
    accept, parse = (ARROW, _arrow_page) if fmt == "arrow" else (BINARY_JSON, _json_page)
    offset, stalls = part.start, 0
    try:
        while offset < part.end:
            _, body = http.call("GET", path, f"records of {part.topic}-{part.partition} at {offset}",
                                {"offset": offset, "end_offset": part.end, "max_bytes": part.max_bytes},
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
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaGatewayBatchReader(Settings.from_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaGatewayStreamReader(Settings.from_options(self.options))


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
