"""Developer tool: emit the declarative message definitions in service/protocol/definitions.py.

It reads Apache Kafka's JSON message schemas (wire facts only: names, types, version ranges,
nullability, tags, defaults) and writes our compact DSL for the versions this project implements.
The JSON files are never copied into the repository; tests/unit/protocol/test_conformance.py re-reads them
and fails when a definition drifts.

Usage: python tools/gen_protocol.py SCHEMA_DIR > service/protocol/definitions.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# message -> (our lowest version, our highest version)
IMPLEMENTED: dict[str, tuple[int, int]] = {
    "ApiVersions": (0, 4),
    "Metadata": (1, 12),
    "FindCoordinator": (0, 6),
    "JoinGroup": (0, 9),
    "SyncGroup": (0, 5),
    "Heartbeat": (0, 4),
    "LeaveGroup": (0, 5),
    "OffsetCommit": (2, 9),
    "OffsetFetch": (1, 9),
    "ListOffsets": (1, 9),
    "Fetch": (4, 17),
    "DescribeGroups": (0, 5),
    "ListGroups": (0, 5),
    "SaslHandshake": (0, 1),
    "SaslAuthenticate": (0, 2),
    "Produce": (3, 11),
    "InitProducerId": (0, 5),
    "CreateTopics": (2, 7),
    "DeleteTopics": (1, 6),
    "AddPartitionsToTxn": (0, 3),
    "EndTxn": (0, 3),
    "TxnOffsetCommit": (0, 3),
    "DescribeConfigs": (1, 4),
    # -- share groups (KIP-932): the versions Kafka 4.4 supports --
    "ShareGroupHeartbeat": (1, 1),
    "ShareGroupDescribe": (1, 1),
    "ShareFetch": (1, 2),
    "ShareAcknowledge": (1, 2),
    "DescribeShareGroupOffsets": (0, 1),
    "AlterShareGroupOffsets": (0, 0),
    "DeleteShareGroupOffsets": (0, 0),
    "IncrementalAlterConfigs": (0, 1),  # share-group configs (resource type GROUP)
    # -- end of share groups --
    # -- the consumer group protocol (KIP-848) --
    "ConsumerGroupHeartbeat": (0, 1),
    "ConsumerGroupDescribe": (0, 1),
}
DATA: dict[str, tuple[int, int]] = {
    "ConsumerProtocolSubscription": (0, 3),
    "ConsumerProtocolAssignment": (0, 3),
}


def load(path: Path) -> dict:
    text = re.sub(r"^\s*//.*$", "", path.read_text(), flags=re.M)
    return json.loads(text)


def snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    return s.lower()


def vrange(spec: str | None) -> tuple[int, int] | None:
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return (int(spec[:-1]), 99)
    if "-" in spec:
        a, b = spec.split("-")
        return (int(a), int(b))
    return (int(spec), int(spec))


def overlaps(spec: str | None, lo: int, hi: int) -> bool:
    r = vrange(spec)
    return r is not None and r[0] <= hi and r[1] >= lo


STRUCTS: dict[str, list[dict]] = {}


def collect_structs(d: dict) -> None:
    STRUCTS.clear()
    for c in d.get("commonStructs", []):
        STRUCTS[c["name"]] = c["fields"]

    def walk(fields: list[dict]) -> None:
        for f in fields:
            if "fields" in f:
                STRUCTS[f["type"].removeprefix("[]")] = f["fields"]
                walk(f["fields"])

    walk(d["fields"])


def emit_fields(fields: list[dict], lo: int, hi: int, indent: int) -> list[str]:
    out = []
    pad = " " * indent
    for f in fields:
        if not overlaps(f.get("versions"), lo, hi) and not overlaps(f.get("taggedVersions"), lo, hi):
            continue
        args = [repr(snake(f["name"])), repr(f["type"]), repr(f["versions"])]
        if f.get("nullableVersions"):
            args.append(f"nullable={f['nullableVersions']!r}")
        if "tag" in f:
            args.append(f"tag={f['tag']}")
            args.append(f"tagged={f['taggedVersions']!r}")
        if "default" in f:
            args.append(f"default={f['default']!r}")
        if f.get("ignorable"):
            args.append("ignorable=True")
        sub = f.get("fields") or STRUCTS.get(f["type"].removeprefix("[]"))
        if sub:
            out.append(f"{pad}F({', '.join(args)}, fields=(")
            out.extend(emit_fields(sub, lo, hi, indent + 4))
            out.append(f"{pad})),")
        else:
            out.append(f"{pad}F({', '.join(args)}),")
    return out


def main() -> None:
    src = Path(sys.argv[1])
    lines = [
        '"""Declarative definitions of the Kafka messages this gateway speaks (one per message).',
        "",
        "Generated once by tools/gen_protocol.py from Apache Kafka's wire facts, then maintained here;",
        "tests/unit/protocol/test_conformance.py checks every field of every implemented version against Kafka's",
        "JSON schemas. Field names are snake_case forms of Kafka's names.",
        '"""',
        "",
        "from service.protocol.dsl import F, MessageSchema",
        "",
    ]
    names = []
    for base, (lo, hi) in IMPLEMENTED.items():
        for kind in ("Request", "Response"):
            d = load(src / f"{base}{kind}.json")
            collect_structs(d)
            var = snake(base + kind).upper()
            names.append(var)
            lines.append(
                f"{var} = MessageSchema({base + kind!r}, api_key={d['apiKey']}, kind={kind.lower()!r}, "
                f"versions=({lo}, {hi}), flexible={d['flexibleVersions']!r}, fields=("
            )
            lines.extend(emit_fields(d["fields"], lo, hi, 4))
            lines.append("))")
            lines.append("")
    for base, (lo, hi) in DATA.items():
        d = load(src / f"{base}.json")
        collect_structs(d)
        var = snake(base).upper()
        names.append(var)
        lines.append(
            f"{var} = MessageSchema({base!r}, api_key=None, kind='data', "
            f"versions=({lo}, {hi}), flexible={d['flexibleVersions']!r}, fields=("
        )
        lines.extend(emit_fields(d["fields"], lo, hi, 4))
        lines.append("))")
        lines.append("")
    lines.append("ALL_SCHEMAS = (")
    lines.extend(f"    {n}," for n in names)
    lines.append(")")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
