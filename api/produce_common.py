"""What the v2 and v3 produce endpoints share: JSON data as stored bytes, exact big integers, and the
error code of a record the producer could not deliver.

- :func:`json_bytes`: a JSON value as the bytes stored in Kafka (compact JSON text, UTF-8; integers
  beyond 64 bits exactly; at most :data:`JSON_MAX_DEPTH` levels deep, else :class:`JsonTooDeep`);
- :data:`LONG_DIGITS`: a number that might not fit 64 bits (orjson would read it as a float): such JSON
  text is parsed again with the standard library;
- :func:`failure_code`: the REST error code of a :class:`~service.producer.ProduceFailure` (Confluent's
  codes: 40301 authorization, 40101 authentication, 50003 retriable Kafka error, 50002 other);
- :func:`partitions_or_create` / :func:`may_create_topic`: a topic's partitions, creating a missing one when
  ``GATEWAY_AUTO_CREATE_TOPICS`` allows it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from service.producer import ProduceFailure, Producer, UnknownTopicError
from service.schemas.jsonschema_format import value_depth

LONG_DIGITS = re.compile(rb"\d{19}")  # a number orjson might turn into a float (beyond 64 bits)
_AUTHZ_CODES = frozenset({29, 30, 31, 53})  # TOPIC/GROUP/CLUSTER/TRANSACTIONAL_ID_AUTHORIZATION_FAILED
_AUTHN_CODES = frozenset({58})  # SASL_AUTHENTICATION_FAILED


#: the deepest nesting of arrays and objects in a json-format key or value: what the consume side renders as
#: JSON (service/protocol/_crecords.c JSON_MAX_DEPTH, api/v2/render.py); request bodies themselves stop at
#: orjson's 1024 levels
JSON_MAX_DEPTH = 512


class JsonTooDeep(ValueError):
    """A json-format key or value nests arrays and objects deeper than :data:`JSON_MAX_DEPTH` levels."""

    def __init__(self) -> None:
        super().__init__(f"arrays and objects nested deeper than {JSON_MAX_DEPTH} levels")


def json_bytes(v: Any) -> bytes | None:
    """``v`` as compact JSON text (UTF-8); None (a null key or value) for a JSON null. Raises
    :class:`JsonTooDeep` past :data:`JSON_MAX_DEPTH` levels (orjson writes 254 at most; the rest goes
    through the standard library, which would recurse until the interpreter's limit)."""
    if v is None:
        return None
    try:
        return orjson.dumps(v)
    except TypeError:  # an integer beyond 64 bits, or deeper than orjson writes
        if value_depth(v, JSON_MAX_DEPTH):
            raise JsonTooDeep() from None
        try:
            return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()
        except RecursionError:
            raise JsonTooDeep() from None


def loads_exact(raw: bytes | str) -> Any:
    """JSON text parsed with the standard library (exact integers beyond 64 bits); :class:`JsonTooDeep` where
    it would exhaust the interpreter's stack (orjson, which parsed ``raw`` first, allows 1024 levels)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise JsonTooDeep() from None


def failure_code(f: ProduceFailure) -> int:
    if f.code in _AUTHZ_CODES:
        return 40301
    if f.code in _AUTHN_CODES:
        return 40101
    return 50003 if f.retriable else 50002


def may_create_topic(settings: Any, topic: str, tenant: Any = None) -> bool:
    """Whether produce creates ``topic`` when it is missing (``GATEWAY_AUTO_CREATE_TOPICS``; never ``__*``;
    and only a topic one of the ``tenant``'s ``admin_topics`` patterns matches: creating a topic is topic
    administration, whichever route does it)."""
    return (bool(settings.auto_create_topics_enabled()) and not topic.startswith("__")
            and (tenant is None or tenant.allows_topic_admin(topic)))


def missing_topic(settings: Any, topic: str, tenant: Any = None) -> str:
    """The message of 404/40401 for a missing topic; it says why when auto-creation is on and only the tenant's
    ``admin_topics`` kept the topic from being created."""
    if tenant is not None and settings.auto_create_topics_enabled() and not topic.startswith("__") \
            and tenant.allows_topic(topic) and not tenant.allows_topic_admin(topic):
        return (f"topic {topic!r} not found (produce creates missing topics only of the tenant's admin_topics "
                "patterns)")
    return f"topic {topic!r} not found"


async def partitions_or_create(settings: Any, producer: Producer, topic: str, catalog: Any = None,
                               tenant: Any = None) -> set[int]:
    """The partitions of ``topic``; a missing one is created when ``GATEWAY_AUTO_CREATE_TOPICS`` is on
    (never a name starting with ``__``: internal topics; only one of the ``tenant``'s ``admin_topics``).
    Raises UnknownTopicError otherwise.

    ``catalog``: the tenant's :class:`~service.cluster.topics.TopicCatalog` (or None), which forgets what it
    cached about the topic once it was created, so ``GET /topics`` lists it at once."""
    try:
        return set(await producer.partitions(topic))
    except UnknownTopicError:
        if not may_create_topic(settings, topic, tenant):
            raise
        created = set(await producer.create_topic(topic, settings.auto_create_partitions,
                                                  settings.auto_create_replication_factor))
        if catalog is not None:
            catalog.forget(topic)
        return created
