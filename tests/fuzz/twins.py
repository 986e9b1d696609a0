"""The fuzz tier's one list: every public name of the three C extensions, its Python twin, and the settings
the property tests run with.

``TWINS`` maps ``<module>.<name>`` to the Python code the C one must agree with (or, where the C function has
no twin of its own, to what it is checked against). Every fuzz test says which names it covers with
:func:`covers`; ``test_coverage.py`` fails when a public name of a C module has no entry here or no test.

Profiles (``KCG_FUZZ_PROFILE``): ``default`` (``make test``: a few hundred examples per test, the whole tier
in one to two minutes on two cores) and ``long`` (``make fuzz``, under ASan/UBSan builds: 2,000).
``KCG_FUZZ_EXAMPLES=N`` overrides the number of examples of either.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings

PROFILES = {"default": 200, "long": 2000}
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
    "_crecords.render": "api.v2.render.render_binary_chunk_py / render_json_chunk_py",
    "_crecords.render_framed": "api.v2.render.render_array_py / render_ndjson_py",
    "_crecords.json_valid": "orjson.loads (the json format's Python path, api.v2.render._embedded)",
    "_crecords.frame_buffer": "bytearray(n)",
    "_crecords.RecordRun": "a list of the Records decode_records makes of the same batches",
    "_crecords.RecordRun.add": "service.protocol.records.decode_records (batch by batch)",
    "_crecords.RecordRun.offset": "list[Record][i].offset",
    "_crecords.RecordRun.payload": "service.fetch.fetcher._payload_from on a list",
    # service/schemas/_cavro.c
    "_cavro.compile": "service.schemas.avro_fast.program_nodes (what it compiles; garbage node lists refused)",
    "_cavro.render_value": "orjson.dumps(AvroCodec(schema, rendering).decode(payload))",
    "_cavro.render_chunk": "api.v2.render.render_decoded_chunk over SchemaResolver.decode",
    "_cavro.schema_ids": "service.schemas.formats.SchemaResolver.schema_ids",
    "_cavro.scan": "service.schemas.avro_limits.scan_py",
    "_cavro.scan_many": "service.schemas.avro_limits.scan_py of each payload (AvroCodec.refusals without C)",
    # service/producer/_cproduce.c
    "_cproduce.encode_runs": "service.producer.encoding._encode_runs_py",
    "_cproduce.parse_binary": "api.v2.produce.parse_records without the C helpers",
    "_cproduce.parse_body_binary": "orjson.loads + api.v2.produce.parse_records without the C helpers",
    "_cproduce.metas": "service.producer.encoding._metas_py",
    "_cproduce.plain_sizes": "service.producer.encoding._plain_sizes_py",
    "_cproduce.render_offsets": "api.v2.produce.render without the C helpers",
    "_cproduce.render_offset_runs": "_cproduce.render_offsets of one RecordMetadata per record",
}

# The older example-based differential tests of the same entry points (tests/unit, fixed seeds and hand-picked
# edge cases); test_coverage.py checks that each still exists.
UNIT_TESTS: dict[str, list[str]] = {
    "_crecords.decode_records": ["tests/unit/protocol/test_records.py::test_c_and_python_decoders_agree",
                                 "tests/unit/protocol/test_records.py::test_property_garbage_never_crashes_and_paths_agree"],
    "_crecords.take_budget": ["tests/unit/protocol/test_take_budget.py::test_c_matches_python_on_random_records"],
    "_crecords.render": ["tests/unit/api/test_render.py::test_c_and_python_give_identical_bytes",
                         "tests/unit/api/test_render.py::test_c_json_render_never_loses_a_record",
                         "tests/unit/api/test_render_framed.py::test_base64_every_length_and_byte"],
    "_crecords.render_framed": [
        "tests/unit/api/test_render_framed.py::test_framed_binary_equals_joined_chunks_and_python",
        "tests/unit/api/test_render_framed.py::test_ndjson_with_resume_equals_python"],
    "_crecords.json_valid": ["tests/unit/api/test_render.py::test_json_validator_examples",
                             "tests/unit/api/test_render.py::test_json_validator_agrees_with_a_strict_parser"],
    "_crecords.RecordRun": [
        "tests/unit/protocol/test_record_run.py::test_run_holds_the_decoded_records_and_renders_the_same_bytes",
        "tests/unit/protocol/test_record_run.py::test_run_path_agrees_with_decode_and_filter"],
    "_crecords.RecordRun.add": [
        "tests/unit/protocol/test_record_run.py::test_run_refuses_corrupt_sections_and_growth_after_slicing"],
    "_cavro.render_value": ["tests/unit/schemas/test_cavro.py::test_random_values_render_as_the_python_path",
                            "tests/unit/schemas/test_cavro.py::test_malformed_payloads_bail_never_crash",
                            "tests/unit/schemas/test_cavro.py::test_deep_nesting_bails"],
    "_cavro.render_chunk": ["tests/unit/schemas/test_cavro.py::test_chunks_render_as_render_decoded"],
    "_cavro.schema_ids": ["tests/unit/schemas/test_cavro.py::test_schema_ids_in_c_and_python_agree"],
    "_cavro.scan": ["tests/unit/schemas/test_avro_limits.py::test_the_c_scan_and_its_python_twin_agree",
                    "tests/unit/schemas/test_avro_limits.py::test_hostile_values_are_refused_by_both_scans_quickly"],
    "_cavro.scan_many": ["tests/unit/schemas/test_avro_limits.py::test_scan_many_is_scan_of_each"],
    "_cproduce.encode_runs": ["tests/unit/producer/test_producer_runs.py::test_c_encoder_matches_python_and_decodes"],
    "_cproduce.parse_binary": ["tests/unit/producer/test_producer_runs.py::test_parse_binary_in_c_is_the_python_parse"],
    "_cproduce.parse_body_binary": [
        "tests/unit/producer/test_producer_runs.py::test_parse_body_binary_in_c_is_orjson_and_parse_records",
        "tests/unit/producer/test_producer_runs.py::test_parse_body_binary_declines_every_corrupted_base64_value"],
    "_cproduce.metas": ["tests/unit/producer/test_producer_runs.py::test_metas_in_c_are_record_metadata_counting_up"],
    "_cproduce.plain_sizes": ["tests/unit/producer/test_producer_runs.py::test_plain_sizes_in_c_is_the_python_check"],
    "_cproduce.render_offsets": [
        "tests/unit/producer/test_producer_runs.py::test_render_offsets_in_c_is_the_python_render"],
    "_cproduce.render_offset_runs": [
        "tests/unit/producer/test_producer_runs.py::test_render_offset_runs_is_render_offsets_of_the_same_records"],
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
