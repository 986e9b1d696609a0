"""Schema'd records: everything about the Confluent Schema Registry formats has its home here.

* :mod:`service.schemas.wire` -- the Confluent wire framing (magic byte 0, 4-byte big-endian schema id, for
  Protobuf the message-index list, then the payload); sans-io.
* :mod:`service.schemas.registry` -- an asyncio client of the Schema Registry REST API (schema by id,
  subjects and versions, register, lookup) with a bounded cache by id, a short-lived cache per subject,
  coalesced concurrent look-ups and typed errors (``RegistryUnavailable`` is retryable).
* the per-format codecs (Avro, Protobuf, JSON Schema): records to JSON and back, validated against a schema.
* :mod:`service.schemas.arrow` -- the schema -> Arrow mapping and typed columns of the range reads and the
  Spark sink (:mod:`service.schemas.avro_columns`: Avro records read column-wise with numpy).

The HTTP layer and the sink only choose a format and call in here, so the wire format has one home.
"""
