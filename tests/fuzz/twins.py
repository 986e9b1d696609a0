"""The fuzz tier's one list: every public name of the three C extensions, its Python twin, and the settings
the property tests run with.

``TWINS`` maps ``<module>.<name>`` to the Python code the C one must agree with (or, where the C function has
no twin of its own, to what it is checked against). Every fuzz test says which names it covers with
:func:`covers`; ``test_coverage.py`` fails when a public name of a C module has no entry here or no test.

Profiles (``KCG_FUZZ_PROFILE``): ``default`` (``make test``: a few hundred examples per test, the whole tier
in about a minute on two cores) and ``long`` (``make fuzz``, under ASan/UBSan builds: thousands).
``KCG_FUZZ_EXAMPLES=N`` overrides the number of examples of either.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings

PROFILES = {"default": 200, "long": 5000}
PROFILE = os.environ.get("KCG_FUZZ_PROFILE") or "default"
if PROFILE not in PROFILES:
    raise ValueError(f"KCG_FUZZ_PROFILE={PROFILE!r}: expected one of {', '.join(PROFILES)}")
EXAMPLES = int(os.environ.get("KCG_FUZZ_EXAMPLES") or PROFILES[PROFILE])

settings.register_profile(
    "kcg-fuzz", max_examples=EXAMPLES, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture])
FUZZ = settings.get_profile("kcg-fuzz")


def fuzz(scale: float = 1.0) -> settings:
    """The tier's settings, with ``scale`` times its examples (expensive properties run fewer)."""
    return settings(FUZZ, max_examples=max(5, int(EXAMPLES * scale)))


# <module>.<public name> -> its Python twin (what the differential tests compare it with)
TWINS: dict[str, str] = {
    # service/protocol/_crecords.c
    "_crecords.decode_records": "service.protocol.records._decode_section_py",
    "_crecords.take_budget": "service.fetch.fetcher._take_budget_py",
    "_crecords.render": "api.render.render_binary_chunk_py / render_json_chunk_py",
    "_crecords.render_framed": "api.render.render_array_py / render_ndjson_py",
    "_crecords.json_valid": "orjson.loads (the json format's Python path, api.render._embedded)",
    "_crecords.frame_buffer": "bytearray(n)",
    "_crecords.RecordRun": "a list of the Records decode_records makes of the same batches",
    "_crecords.RecordRun.add": "service.protocol.records.decode_records (batch by batch)",
    "_crecords.RecordRun.offset": "list[Record][i].offset",
    "_crecords.RecordRun.payload": "service.fetch.fetcher._payload_from on a list",
    # service/schemas/_cavro.c
    "_cavro.compile": "service.schemas.avro_fast.program_nodes (what it compiles; garbage node lists refused)",
    "_cavro.render_value": "orjson.dumps(AvroCodec(schema, rendering).decode(payload))",
    "_cavro.render_chunk": "api.render.render_decoded_chunk over SchemaResolver.decode",
    "_cavro.schema_ids": "service.schemas.formats.SchemaResolver.schema_ids",
    # service/producer/_cproduce.c
    "_cproduce.encode_runs": "service.producer.encoding._encode_runs_py",
    "_cproduce.parse_binary": "api.produce.parse_records without the C helpers",
    "_cproduce.parse_body_binary": "orjson.loads + api.produce.parse_records without the C helpers",
    "_cproduce.metas": "service.producer.encoding._metas_py",
    "_cproduce.plain_sizes": "service.producer.encoding._plain_sizes_py",
    "_cproduce.render_offsets": "api.produce.render without the C helpers",
    "_cproduce.render_offset_runs": "_cproduce.render_offsets of one RecordMetadata per record",
}

#: name -> the fuzz tests (module:function) that cover it, filled by @covers at import time
COVERED: dict[str, list[str]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def covers(*names: str) -> Callable[[F], F]:
    """Mark a fuzz test as covering these C entry points (``<module>.<name>`` keys of TWINS)."""
    for name in names:
        if name not in TWINS:
            raise KeyError(f"{name} is not in tests/fuzz/twins.py TWINS")

    def mark(fn: F) -> F:
        for name in names:
            COVERED.setdefault(name, []).append(f"{fn.__module__}:{fn.__name__}")
        return fn
    return mark
