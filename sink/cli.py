"""``consumer-gateway sink``: a Spark Structured Streaming job from the gateway into a table, exactly once.

    consumer-gateway sink --gateway URL --topics t1,t2 --table PATH --checkpoint PATH
        [--format parquet|delta] [--trigger available-now|interval=10s] [--api-key-file PATH]
        [--commit-group NAME] [--max-records-per-trigger N] [--max-offsets-per-task N]
        [--starting-offsets earliest|latest] [--response-format arrow|json]
        [--value-format avro|protobuf|jsonschema [--value-schema-id latest|ID]]

``parquet`` (default) is Spark's file sink: its ``_spark_metadata`` log plus the checkpoint make the table
exactly-once for Spark readers. ``delta`` appends each micro-batch with delta-rs and the transaction
``(query id, batch id)``, skipping a replayed batch: exactly-once for every reader. Progress (batch, rows,
rows/s, lag in offsets behind the last stable offsets) is printed per micro-batch; the exit status is 0 when
the query ended normally, 1 on a failure (the message names the cause), 2 on bad arguments.

``--value-format avro`` (or ``protobuf`` / ``jsonschema``) writes a typed table: the values decoded with the
Schema Registry into a ``value`` struct column (plus ``value_schema_id``, ``error`` and ``value_raw`` per
row; see :mod:`sink.source`), read with one reader schema pinned at the start (``--value-schema-id``,
default the latest of ``{topic}-value``); without it the table holds the binary values, as before.

The API key: from the environment (``GATEWAY_API_KEY``) or a file (``--api-key-file PATH``: its first line),
never from the command line, which every user of the machine can read (``ps``, ``/proc/PID/cmdline``);
``--api-key KEY`` still works for existing scripts but warns on stderr. Spark gets it as the data source
option ``apiToken``, a name Spark's default ``spark.redaction.regex`` hides in plans, the UI and logs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

from sink.http import GatewayError, GatewayHTTP, quote

API_KEY_ENV = "GATEWAY_API_KEY"
API_KEY_OPTION = "apiToken"  # matches Spark's default spark.redaction.regex: (?i)secret|password|token|access[.]?key
ARGV_KEY_WARNING = (f"warning: --api-key puts the key on the command line, where other users of this machine can "
                    f"read it (ps, /proc/PID/cmdline); set {API_KEY_ENV} or use --api-key-file PATH instead")
ERROR_RE = re.compile(r"(?:sink\.http\.)?(Gateway(?:Unavailable|HTTPError|Error)|ValueError): (.+)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="consumer-gateway sink", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", required=True, help="the gateway's base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("--topics", required=True, help="comma-separated topic names")
    ap.add_argument("--table", required=True, help="output table directory")
    ap.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (the source of truth)")
    ap.add_argument("--format", choices=("parquet", "delta"), default="parquet")
    ap.add_argument("--trigger", default="available-now", help="available-now (default) or interval=10s")
    keys = ap.add_mutually_exclusive_group()
    keys.add_argument("--api-key-file", metavar="PATH",
                      help=f"read the API key from this file (its first line); default: the {API_KEY_ENV} variable")
    keys.add_argument("--api-key",
                      help=f"deprecated: visible to other users in ps; use {API_KEY_ENV} or --api-key-file")
    ap.add_argument("--commit-group", help="also commit each batch's end offsets to this consumer group")
    ap.add_argument("--starting-offsets", default="earliest", help="earliest (default) or latest")
    ap.add_argument("--max-records-per-trigger", type=int)
    ap.add_argument("--max-offsets-per-task", type=int)
    ap.add_argument("--response-format", choices=("arrow", "json"), default="arrow",
                    help="how the gateway answers range reads: arrow (default, columnar) or json (slower)")
    ap.add_argument("--value-format", choices=("binary", "avro", "protobuf", "jsonschema"), default="binary",
                    help="binary (default: value bytes) or a Schema Registry format: a typed value column")
    ap.add_argument("--value-schema-id", default="latest",
                    help="with --value-format: the reader schema, latest (of {topic}-value, default) or an id")
    ap.add_argument("--master", default=os.environ.get("SINK_SPARK_MASTER", "local[2]"))
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    args = ap.parse_args(argv)
    if args.trigger != "available-now" and not re.fullmatch(r"interval=\d+(ms|s|m)", args.trigger):
        ap.error("--trigger: available-now or interval=<n>(ms|s|m)")
    if args.value_schema_id != "latest" and not args.value_schema_id.isdigit():
        ap.error("--value-schema-id: latest or a schema id")
    if args.api_key is not None:
        print(ARGV_KEY_WARNING, file=sys.stderr, flush=True)
    elif args.api_key_file is not None:
        try:
            args.api_key = read_key_file(args.api_key_file)
        except (OSError, ValueError) as e:
            ap.error(f"--api-key-file: {e}")
    else:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    return args


def read_key_file(path: str) -> str:
    """The first line of ``path``, without surrounding whitespace (a trailing newline is usual)."""
    with open(path, encoding="utf-8") as f:
        key = f.readline().strip()
    if not key:
        raise ValueError(f"{path}: the first line is empty")
    return key


def build_session(master: str = "local[2]", driver_memory: str = "2g", app_name: str = "kafka-gateway-sink",
                  conf: dict[str, str] | None = None) -> Any:
    """A Spark session for the sink (``kafka_gateway`` registered); ``conf``: extra Spark settings, e.g.
    ``spark.jars`` (they must be set before the JVM starts)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if master.startswith("local") and not os.environ.get("PYSPARK_SUBMIT_ARGS"):
        from sink.jvm import java_options

        opts = java_options()  # a class-data-sharing archive: faster JVM start and first batch
        if opts:
            builder = builder.config("spark.driver.extraJavaOptions", opts)
    builder = (builder.master(master).appName(app_name)
               .config("spark.driver.memory", driver_memory)
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
               .config("spark.python.worker.reuse", "true"))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from sink.source import register

    register(spark)
    return spark


def stop_session(spark: Any) -> None:
    """Stop a session from :func:`build_session`; if its JVM recorded the class-data archive, end the JVM so
    that the archive is written and stored (``sink.jvm.finish_recording``; a no-op otherwise)."""
    spark.stop()
    from sink.jvm import finish_recording

    finish_recording()


def preflight(gateway: str, topics: list[str], api_key: str | None, value_format: str | None = None,
              value_schema: str = "latest") -> None:
    """Fail before Spark starts (nothing written) if the gateway or a topic is not there, or (typed) the
    value schema cannot be had (no registry, no such subject or id)."""
    http = GatewayHTTP(gateway, api_key)
    try:
        for t in topics:
            http.get_json(f"/topics/{quote(t)}/partitions", f"topic {t!r}")
        if value_format:
            from sink.source import fetch_typed_schema

            fetch_typed_schema(http, topics[0], value_format, value_schema)
    finally:
        http.close()


def lag_of(progress: Any) -> int | None:
    try:
        src = progress["sources"][0] if isinstance(progress, dict) else progress.sources[0]
        end = src["endOffset"] if isinstance(src, dict) else src.endOffset
        latest = src["latestOffset"] if isinstance(src, dict) else src.latestOffset
        end_d = json.loads(end) if isinstance(end, str) else end
        latest_d = json.loads(latest) if isinstance(latest, str) else latest
        if not latest_d:
            return None
        return sum(max(0, int(v) - int(end_d.get(k, 0))) for k, v in latest_d.items())
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return None


def end_offsets(progress: Any) -> dict[str, int]:
    end = progress["sources"][0]["endOffset"]
    d = json.loads(end) if isinstance(end, str) else end
    return {k: int(v) for k, v in (d or {}).items()}


def make_listener(args: argparse.Namespace, out: Any, committer: Any) -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = json.loads(event.progress.json)
            rows = int(p.get("numInputRows") or 0)
            if not args.quiet:
                rate = p.get("processedRowsPerSecond") or 0.0
                lag = lag_of(p)
                print(f"batch {p['batchId']}: {rows} rows, {rate:,.0f} rows/s, lag {lag if lag is not None else '?'}",
                      file=out, flush=True)
            if committer is not None and p.get("sources"):
                try:
                    committer.commit(end_offsets(p))
                except Exception as e:  # the checkpoint is the source of truth: report and go on
                    print(f"warning: consumer-group commit failed: {e}", file=out, flush=True)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return Progress()


def start_query(spark: Any, args: argparse.Namespace) -> Any:
    reader = (spark.readStream.format("kafka_gateway").option("gateway", args.gateway)
              .option("topics", args.topics).option("startingOffsets", args.starting_offsets))
    if args.api_key:
        reader = reader.option(API_KEY_OPTION, args.api_key)
    if args.max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(args.max_records_per_trigger))
    if args.max_offsets_per_task:
        reader = reader.option("maxOffsetsPerTask", str(args.max_offsets_per_task))
    if getattr(args, "response_format", "arrow") != "arrow":
        reader = reader.option("responseFormat", args.response_format)
    typed = getattr(args, "value_format", "binary") != "binary"
    if typed:
        reader = reader.option("valueFormat", args.value_format).option("valueSchemaId", args.value_schema_id)
    df = reader.load()
    w = df.writeStream.option("checkpointLocation", args.checkpoint)
    if args.trigger == "available-now":
        w = w.trigger(availableNow=True)
    else:
        n, unit = re.fullmatch(r"interval=(\d+)(ms|s|m)", args.trigger).groups()  # type: ignore[union-attr]
        w = w.trigger(processingTime=f"{n} {dict(ms='milliseconds', s='seconds', m='minutes')[unit]}")
    if args.format == "delta":
        from sink.delta import DeltaBatchWriter

        w = w.foreachBatch(DeltaBatchWriter(args.table, args.checkpoint, merge_schema=typed))
    else:
        w = w.format("parquet").option("path", args.table)
    return w.start()


def clean_error(e: BaseException) -> str:
    text = str(e)
    found = ERROR_RE.findall(text)
    if found:
        kind, msg = found[-1]
        return f"{kind}: {msg.strip()}"
    return text.strip().splitlines()[0] if text.strip() else repr(e)


def run(spark: Any, args: argparse.Namespace, out: Any = sys.stdout) -> dict[str, Any]:
    """Run the job on ``spark`` until the query ends (available-now) or is interrupted; a summary."""
    committer = None
    if args.commit_group:
        from sink.groups import GroupCommitter

        committer = GroupCommitter(args.gateway, args.commit_group, args.api_key)
    listener = make_listener(args, out, committer)
    spark.streams.addListener(listener)
    started = time.monotonic()
    q = start_query(spark, args)
    try:
        try:
            q.awaitTermination()
        except KeyboardInterrupt:
            q.stop()
        progress = [json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress]
        if committer is not None and progress and progress[-1].get("sources"):
            committer.commit(end_offsets(progress[-1]))  # the listener bus may lag behind the query's end
    finally:
        spark.streams.removeListener(listener)
        if committer is not None:
            committer.close()
    elapsed = time.monotonic() - started
    data = [p for p in progress if int(p.get("numInputRows") or 0) > 0]
    rows = sum(int(p["numInputRows"]) for p in data)
    summary = {"batches": len(data), "rows": rows, "seconds": round(elapsed, 3),
               "rows_per_s": round(rows / elapsed, 1) if elapsed > 0 else None,
               "lag": lag_of(progress[-1]) if progress else None, "query_id": str(q.id)}
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    try:
        preflight(args.gateway, topics, args.api_key,
                  None if args.value_format == "binary" else args.value_format, args.value_schema_id)
    except (GatewayError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    spark = build_session(args.master, args.driver_memory)
    try:
        summary = run(spark, args)
    except Exception as e:
        print(f"error: the sink failed: {clean_error(e)}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop_session(spark)
    print(f"done: {summary['batches']} batches, {summary['rows']} rows in {summary['seconds']} s "
          f"({summary['rows_per_s']} rows/s), lag {summary['lag']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
