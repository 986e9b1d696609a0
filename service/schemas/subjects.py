"""Which schema subjects and ids a tenant may use when it produces with a schema (no tenant import: the
tenant's rule comes in as a predicate, ``Tenant.allows_subject``).

* a schema given as text is registered under the subject the subject-name strategy makes of it
  (:func:`spec_subject`, the same computation :func:`~service.schemas.produce.resolve_encoder` does): that
  subject must be the tenant's, checked before the registry is asked;
* a schema given by id is the tenant's when one of the subjects it is registered under is (the registry's
  ``GET /schemas/ids/{id}/versions``). The subjects of an id are cached per registry (:class:`IdSubjects`);
  an id that passed is trusted for :data:`ALLOWED_TTL_S`, a refusal is asked again of the registry at most
  every :data:`REFUSED_TTL_S` (the same schema may since have been registered under one of the tenant's
  subjects, which gives it the same id).

Both checks run before the schema is resolved or any record encoded, so a refused id's schema is never
fetched for the request and no error message can carry its field names.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from service.schemas.produce import TOPIC_NAME, SchemaSpec, record_name, subject_name
from service.schemas.registry import LRUCache, RegistryClient, SchemaNotFound

#: how long the subjects of an id a tenant was allowed to use are reused
ALLOWED_TTL_S = 300.0
#: how long a refusal stands before the registry is asked again
REFUSED_TTL_S = 5.0
#: ids whose subjects are kept, per registry
CACHE_SIZE = 1000


class SubjectForbidden(Exception):
    """A subject or schema id that is not the tenant's (403, 40304); the message names no foreign subject."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def spec_subject(codecs: Any, fmt: str, spec: SchemaSpec, topic: str, strategy: str) -> str:
    """The subject a schema given as text is registered under (raises ProduceSchemaError 42205 when the
    strategy needs a record name and the schema has none, or it does not compile)."""
    assert spec.schema is not None
    name = record_name(fmt, spec.schema, codecs) if strategy != TOPIC_NAME or fmt != "protobuf" else None
    return subject_name(strategy, topic, spec.is_key, name)


class IdSubjects:
    """The subjects each schema id of one registry is registered under, cached (see the module docstring)."""

    def __init__(self, client: RegistryClient, *, size: int = CACHE_SIZE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._clock = clock
        self._cache: LRUCache[int, tuple[float, tuple[str, ...]]] = LRUCache(size)

    async def _fetch(self, schema_id: int) -> tuple[str, ...]:
        subjects = tuple(dict.fromkeys(s for s, _ in await self.client.get_id_versions(schema_id)))
        if not subjects:  # Karapace answers [] for an unknown id (Confluent 404/40403): the same here
            raise SchemaNotFound(404, 40403, f"schema id {schema_id} is registered under no subject")
        self._cache.put(schema_id, (self._clock(), subjects))
        return subjects

    async def allowed(self, schema_id: int, allows: Callable[[str], bool]) -> bool:
        """Whether one of the subjects of ``schema_id`` passes ``allows``; raises SchemaNotFound (no such id)
        or RegistryUnavailable."""
        hit = self._cache.get(schema_id)
        if hit is not None:
            at, subjects = hit
            ok = any(allows(s) for s in subjects)
            age = self._clock() - at
            if age < (ALLOWED_TTL_S if ok else REFUSED_TTL_S):
                return ok
        return any(allows(s) for s in await self._fetch(schema_id))


_BY_CLIENT: weakref.WeakKeyDictionary[RegistryClient, IdSubjects] = weakref.WeakKeyDictionary()


def id_subjects(client: RegistryClient) -> IdSubjects:
    """The :class:`IdSubjects` of a registry client (one per client, as long as the client lives)."""
    found = _BY_CLIENT.get(client)
    if found is None:
        found = _BY_CLIENT[client] = IdSubjects(client)
    return found


async def require_spec_subject(resolver: Any, fmt: str, spec: SchemaSpec, topic: str, strategy: str,
                               allows: Callable[[str], bool]) -> None:
    """Raise :class:`SubjectForbidden` unless the schema ``spec`` names is the tenant's: the subject of a
    schema text passes ``allows``, or one of the subjects of a schema id does. Raises ProduceSchemaError
    (42205), SchemaNotFound (an unknown id) or RegistryUnavailable as the produce path would."""
    if spec.schema_id is None:
        subject = spec_subject(resolver.codecs, fmt, spec, topic, strategy)
        if not allows(subject):
            raise SubjectForbidden(f"{spec.field}_schema: the subject {subject!r} ({strategy}) is not one of this "
                                   "tenant's schema subjects")
        return
    try:
        ok = await id_subjects(resolver.client).allowed(spec.schema_id, allows)
    except SchemaNotFound:
        raise SchemaNotFound(404, 40403, f"{spec.field}_schema_id {spec.schema_id}: no such schema in the "
                                         "schema registry") from None
    if not ok:
        raise SubjectForbidden(f"{spec.field}_schema_id {spec.schema_id} is not registered under any of this "
                               "tenant's schema subjects")
