"""Which schema subjects and ids a tenant may use when it produces with a schema (no tenant import: the
tenant's rule comes in as a predicate, ``Tenant.allows_subject``).

* a schema given as text is registered under the subject the subject-name strategy makes of it
  (:func:`spec_subject`, the same computation :func:`~service.schemas.produce.resolve_encoder` does): that
  subject must be the tenant's, checked before the registry is asked;
* a schema given by id is the tenant's when one of the subjects it is registered under is (the registry's
  ``GET /schemas/ids/{id}/versions``). The subjects of an id are cached per registry (:class:`IdSubjects`),
  charged to the registry's schema-cache byte budget (a registry may list thousands of long subjects for one
  id); an id that passed is trusted for :data:`ALLOWED_TTL_S`, a refusal is asked again of the registry at most
  every :data:`REFUSED_TTL_S` (the same schema may since have been registered under one of the tenant's
  subjects, which gives it the same id).

Both checks run before the schema is resolved or any record encoded, so a refused id's schema is never
fetched for the request and no error message can carry its field names.

Consuming, :func:`tenant_view` wraps the resolver a tenant's polls, streams and typed range reads use
(:class:`TenantSchemaView`): a key or value framed with an id none of whose subjects is the tenant's becomes a
per-record error instead of JSON (or Arrow columns) with that schema's field names.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from service.schemas.codecs import DecodeError
from service.schemas.produce import TOPIC_NAME, SchemaSpec, record_name, subject_name
from service.schemas.registry import CacheBudget, LRUCache, RegistryClient, SchemaNotFound

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


def subjects_cost(subjects: tuple[str, ...]) -> int:
    """The bytes a cached tuple of subjects holds (the tuple, its strings, the timestamp beside it)."""
    return sys.getsizeof(subjects) + sum(map(sys.getsizeof, subjects)) + 64


class IdSubjects:
    """The subjects each schema id of one registry is registered under, cached (see the module docstring):
    at most ``size`` ids and, charged :func:`subjects_cost` each, within ``budget`` -- by default the
    registry client's, the byte budget every schema cache of that registry shares (the least recently used
    entry of any of them goes first; an id whose subjects cost more than the whole budget is not kept)."""

    def __init__(self, client: RegistryClient, *, size: int = CACHE_SIZE, budget: CacheBudget | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self._clock = clock
        if budget is None:
            budget = getattr(client, "budget", None)
        self._cache: LRUCache[int, tuple[float, tuple[str, ...]]] = LRUCache(size, budget)

    def __len__(self) -> int:
        return len(self._cache)

    async def _fetch(self, schema_id: int) -> tuple[str, ...]:
        try:
            subjects = tuple(dict.fromkeys(s for s, _ in await self.client.get_id_versions(schema_id)))
        except SchemaNotFound:
            subjects = ()
        # an unknown id too: not asked again at once
        self._cache.put(schema_id, (self._clock(), subjects), subjects_cost(subjects))
        return subjects

    async def allowed(self, schema_id: int, allows: Callable[[str], bool]) -> bool:
        """Whether one of the subjects of ``schema_id`` passes ``allows``; raises SchemaNotFound (no such id:
        Confluent's 404, Karapace's ``[]``) or RegistryUnavailable."""
        hit = self._cache.get(schema_id)
        subjects: tuple[str, ...] | None = None
        if hit is not None:
            at, cached = hit
            ok = any(allows(s) for s in cached)
            if self._clock() - at < (ALLOWED_TTL_S if ok else REFUSED_TTL_S):
                subjects = cached
        if subjects is None:
            subjects = await self._fetch(schema_id)
        if not subjects:
            raise SchemaNotFound(404, 40403, f"schema id {schema_id} is registered under no subject")
        return any(allows(s) for s in subjects)


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


# -- consuming: what a tenant may decode -------------------------------------------------------------------------
#: the message of a key or value framed with a schema id that is not the tenant's (a per-record error)
NOT_READABLE = "schema id {} is not readable by this tenant"
#: decisions remembered per tenant view (ids; a forgotten one is asked again at the next prepare)
DECISIONS = 10_000


def framed_schema_ids(payloads: Any) -> set[int]:
    """The schema ids of the framed payloads (as ``SchemaResolver.schema_ids``)."""
    ids: set[int] = set()
    for p in payloads:
        if p is not None and len(p) >= 5 and p[0] == 0:
            ids.add(int.from_bytes(p[1:5], "big"))
    return ids


class TenantSchemaView:
    """A :class:`~service.schemas.formats.SchemaResolver` as one tenant sees it when consuming: a schema id none
    of whose subjects is the tenant's is as good as unknown (:meth:`cached` says ``None``, so neither the C
    renderer nor the typed readers use it) and its keys and values become per-record errors
    (:data:`NOT_READABLE`) instead of JSON rendered with its field names. The records of a topic the tenant
    may read were written by tenants allowed to: their schemas are under subjects of that topic and pass;
    only a record framed with a foreign id (bytes written by a binary produce, say) is refused.

    :meth:`prepare` resolves as the resolver does, then asks the registry for the subjects of each newly seen
    id (:class:`IdSubjects`, cached per registry); nothing else differs, so the caches stay the resolver's.
    It has only the methods the consume paths call; a new one must filter as these do (there is deliberately
    no delegation of unknown attributes: a path that bypassed the check would fail loudly, not leak)."""

    def __init__(self, inner: Any, allows: Callable[[str], bool]) -> None:
        self.inner = inner
        self.client = inner.client
        self.codecs = inner.codecs
        self.avro_rendering = inner.avro_rendering
        self.budget = getattr(inner, "budget", None)
        self._allows = allows
        self._readable: LRUCache[int, bool] = LRUCache(DECISIONS)

    schema_ids = staticmethod(framed_schema_ids)

    async def prepare(self, schema_ids: Any, *args: Any, **kwargs: Any) -> None:
        ids = set(schema_ids)
        await self.inner.prepare(ids, *args, **kwargs)
        subjects = id_subjects(self.client)
        for sid in ids:
            if self.inner.cached(sid) is None:
                continue  # unknown to the registry: the resolver's own per-record error
            try:
                ok = await subjects.allowed(sid, self._allows)
            except SchemaNotFound:  # its subjects are gone (deleted): nobody can show it is theirs
                ok = False
            self._readable.put(sid, ok)

    async def resolve(self, schema_id: int) -> Any:
        """The resolved schema of an id the tenant may read, else ``None`` (as for an unknown id)."""
        await self.prepare((schema_id,))
        return self.cached(schema_id)

    def readable(self, schema_id: int) -> bool:
        return self._readable.get(schema_id) is True

    def cached(self, schema_id: int) -> Any:
        return self.inner.cached(schema_id) if self.readable(schema_id) else None

    def avro_program(self, schema_id: int, rendering: str | None = None, **kwargs: Any) -> Any:
        return self.inner.avro_program(schema_id, rendering, **kwargs) if self.readable(schema_id) else None

    def decode(self, fmt: str, payloads: Any, *, rendering: str | None = None, **kwargs: Any) -> list[Any]:
        refused: dict[int, Any] = {}
        keep: list[int] = []
        for i, p in enumerate(payloads):
            if p is not None and len(p) >= 5 and p[0] == 0:
                sid = int.from_bytes(p[1:5], "big")
                if self.inner.cached(sid) is not None and not self.readable(sid):
                    refused[i] = DecodeError(fmt, sid, NOT_READABLE.format(sid))
                    continue
            keep.append(i)
        if not refused:
            return list(self.inner.decode(fmt, payloads, rendering=rendering, **kwargs))
        decoded = self.inner.decode(fmt, [payloads[i] for i in keep], rendering=rendering, **kwargs) if keep else []
        out: list[Any] = [None] * len(payloads)
        for i, v in zip(keep, decoded, strict=True):
            out[i] = v
        for i, err in refused.items():
            out[i] = err
        return out

    async def decode_all(self, fmt: str, payloads: Any, *, rendering: str | None = None, **kwargs: Any) -> list[Any]:
        await self.prepare(self.schema_ids(payloads))
        return self.decode(fmt, payloads, rendering=rendering, **kwargs)

    async def close(self) -> None:  # the resolver is the service's: it closes it
        return None


_VIEWS: weakref.WeakKeyDictionary[Any, dict[str, TenantSchemaView]] = weakref.WeakKeyDictionary()


def tenant_view(resolver: Any, tenant: Any) -> Any:
    """The resolver as ``tenant`` may use it when consuming: the resolver itself for a tenant without subject
    patterns (open mode, a registry of its own), else its :class:`TenantSchemaView` (one per tenant and
    resolver, so per-resolver caches keyed by it, the typed readers', stay put)."""
    if resolver is None or tenant.subject_patterns is None:
        return resolver
    views = _VIEWS.get(resolver)
    if views is None:
        views = _VIEWS[resolver] = {}
    view = views.get(tenant.id)
    if view is None:
        view = views[tenant.id] = TenantSchemaView(resolver, tenant.allows_subject)
    return view


class TenantSchemas:
    """The gateway's ``SchemaService`` as ``tenant`` consumes through it: :meth:`resolver` answers
    :func:`tenant_view` of the service's resolver (typed range reads take a service)."""

    def __init__(self, service: Any, tenant: Any) -> None:
        self.service = service
        self.tenant = tenant

    def resolver(self, tenant_config: Any, fmt: str = "avro") -> Any:
        return tenant_view(self.service.resolver(tenant_config, fmt), self.tenant)
