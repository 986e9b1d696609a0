"""An asyncio client of the Confluent Schema Registry REST API (the subset the gateway needs).

Schema by id (``GET /schemas/ids/{id}``), a subject's versions and its latest or a given version, register
(``POST /subjects/{s}/versions``) and lookup (``POST /subjects/{s}``); basic or bearer auth, TLS, one
wall-clock timeout per request. Schemas are immutable, so schemas by id and the ids of registered schemas
are kept in bounded LRU caches; subject answers (versions, latest) only for a short TTL. Concurrent
requests for one schema id share one HTTP request.

The parsing of answers and the mapping of error answers to the typed errors are pure functions
(:func:`parse_schema`, :func:`parse_registered`, :func:`error_from_response`); :class:`RegistryClient` is the
thin I/O around them.

Errors: :class:`RegistryUnavailable` (no connection, timeout, 5xx, 429: retryable, with a retry-after hint),
:class:`SchemaNotFound` (404 with the registry's 40401 / 40402 / 40403), :class:`RegistryRequestError` (any
other 4xx, with the registry's ``error_code`` and ``message``).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import orjson

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json; qs=0.9, application/json; qs=0.5"
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")
#: the registry's 404 codes: subject not found, version not found, schema not found
NOT_FOUND_CODES = (40401, 40402, 40403)
DEFAULT_RETRY_AFTER_S = 1.0


class RegistryError(Exception):
    """Base of the registry client's errors."""


class RegistryUnavailable(RegistryError):
    """The registry could not answer (connection refused, timeout, 5xx, 429): retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: float = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RegistryRequestError(RegistryError):
    """The registry refused the request (4xx): its HTTP status, ``error_code`` and ``message``."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(f"schema registry answered {status} / {error_code}: {message}")
        self.status = status
        self.error_code = error_code
        self.message = message


class SchemaNotFound(RegistryRequestError):
    """No such schema id, subject, version, or schema under the subject (the registry's 40401/40402/40403)."""


class SchemaTooLarge(RegistryRequestError):
    """A schema (with its references) or a registry answer over the gateway's size limit: never parsed,
    compiled or cached."""

    def __init__(self, message: str, size: int, limit: int) -> None:
        RegistryError.__init__(self, message)  # the message alone: it is the gateway's, not the registry's
        self.status = 413
        self.error_code = 41302
        self.message = message
        self.size = size
        self.limit = limit


#: the default bound of a schema's text, references included (GATEWAY_SCHEMA_MAX_BYTES)
DEFAULT_MAX_SCHEMA_BYTES = 256 * 1024
#: the default byte budget of one registry's schema caches (GATEWAY_SCHEMA_CACHE_MAX_BYTES)
DEFAULT_CACHE_MAX_BYTES = 128 * 1024 * 1024
#: the default bound of concurrent HTTP requests to one registry (GATEWAY_SCHEMA_REGISTRY_MAX_CONCURRENT_REQUESTS)
DEFAULT_MAX_CONCURRENT_REQUESTS = 8


def answer_limit(max_schema_bytes: int) -> int:
    """The largest registry answer read: a schema at the limit JSON-escaped (``\\u00XX`` is 6 bytes a
    character at worst) plus its envelope. Anything longer is refused while it is read."""
    return 6 * max_schema_bytes + 64 * 1024


def text_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8, without encoding it when it is ASCII."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """A schema's import of another registered schema (Protobuf imports, Avro named types, JSON ``$ref``)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class Schema:
    """A schema as the registry stores it: its text, type (``AVRO``, ``PROTOBUF``, ``JSON``) and references."""

    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """A schema under a subject: its global id and its version in that subject."""

    schema_id: int
    subject: str
    version: int
    schema: Schema


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    url: str
    #: ``user:password`` (never logged)
    basic_auth: str | None = None
    bearer_token: str | None = None
    #: PEM CA bundle verifying the registry's certificate (unset: the system CAs)
    ca_file: str | None = None
    verify: bool = True
    #: connect timeout and the wall-clock bound of one request
    timeout_s: float = 5.0
    #: schemas by id and ids of registered schemas kept (each cache)
    cache_size: int = 1000
    #: how long a subject's versions and latest version are reused
    subject_ttl_s: float = 5.0

    def __post_init__(self) -> None:
        if self.basic_auth is not None and ":" not in self.basic_auth:
            raise ValueError("schema registry basic auth must be 'user:password'")
        if self.basic_auth and self.bearer_token:
            raise ValueError("schema registry: basic auth or a bearer token, not both")

    def __repr__(self) -> str:  # credentials stay out of logs and tracebacks
        return (f"RegistryConfig(url={redact_url(self.url)!r}, basic_auth={'***' if self.basic_auth else None}, "
                f"bearer_token={'***' if self.bearer_token else None}, ca_file={self.ca_file!r}, "
                f"verify={self.verify}, timeout_s={self.timeout_s}, cache_size={self.cache_size})")

    def headers(self) -> dict[str, str]:
        h = {"Accept": ACCEPT}
        if self.basic_auth:
            h["Authorization"] = "Basic " + base64.b64encode(self.basic_auth.encode()).decode("ascii")
        elif self.bearer_token:
            h["Authorization"] = f"Bearer {self.bearer_token}"
        return h


# --- sans-io: request bodies, answers, errors ---------------------------------------------------------------

def schema_body(schema: Schema) -> bytes:
    """The JSON body of register and lookup (``schemaType`` left out for Avro, as Confluent's clients do)."""
    body: dict[str, Any] = {"schema": schema.schema}
    if schema.schema_type != "AVRO":
        body["schemaType"] = schema.schema_type
    if schema.references:
        body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version}
                              for r in schema.references]
    return orjson.dumps(body)


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RegistryRequestError(200, 0, f"not a JSON answer: {body[:200]!r}") from exc


def _bad(what: str, doc: Any) -> RegistryRequestError:
    return RegistryRequestError(200, 0, f"unexpected {what} answer: {str(doc)[:200]}")


def parse_schema(body: bytes) -> Schema:
    """``GET /schemas/ids/{id}`` (also the schema fields of a subject version)."""
    return _schema_of(_json(body))


def _schema_of(doc: Any) -> Schema:
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
        raise _bad("schema", doc)
    try:
        refs = tuple(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
                     for r in doc.get("references") or ())
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad("schema references", doc) from exc
    return Schema(doc["schema"], str(doc.get("schemaType") or "AVRO"), refs)


def parse_registered(body: bytes, subject: str | None = None) -> RegisteredSchema:
    """A subject version (``GET /subjects/{s}/versions/{v}``, ``POST /subjects/{s}``)."""
    doc = _json(body)
    try:
        return RegisteredSchema(int(doc["id"]), str(doc.get("subject") or subject), int(doc["version"]),
                                _schema_of(doc))
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad("subject version", doc) from exc


def parse_id(body: bytes) -> int:
    """``POST /subjects/{s}/versions`` answers ``{"id": N}``."""
    doc = _json(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), int):
        raise _bad("register", doc)
    return doc["id"]


def parse_versions(body: bytes) -> list[int]:
    doc = _json(body)
    if not isinstance(doc, list) or not all(isinstance(v, int) for v in doc):
        raise _bad("versions", doc)
    return doc


def parse_retry_after(value: str | None, default: float = DEFAULT_RETRY_AFTER_S) -> float:
    """Seconds of a ``Retry-After`` header (delta-seconds only; an HTTP date or garbage: ``default``)."""
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
    return default


def error_from_response(status: int, body: bytes, retry_after: str | None = None) -> RegistryError:
    """The typed error of a non-2xx answer."""
    code, message = status, ""
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        if isinstance(doc.get("error_code"), int):
            code = doc["error_code"]
        message = str(doc.get("message") or "")
    if not message:
        message = body[:200].decode("utf-8", "replace") if body else f"HTTP {status}"
    if status >= 500 or status == 429:
        return RegistryUnavailable(f"schema registry answered {status} / {code}: {message}",
                                   parse_retry_after(retry_after))
    if status == 404 and code in NOT_FOUND_CODES:
        return SchemaNotFound(status, code, message)
    return RegistryRequestError(status, code, message)


# --- caches -----------------------------------------------------------------------------------------------

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


#: what one cache entry costs beyond the bytes it is charged for (the key, the dict slot, small objects)
ENTRY_OVERHEAD = 256


class CacheBudget:
    """A byte budget shared by several :class:`LRUCache`: when the entries charged to it exceed ``max_bytes``,
    the least recently used entry of *any* of its caches is dropped, one at a time, until they fit. An entry
    costing more than the whole budget is not kept. Thread-safe (the codec cache is also used off the loop)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self.used = 0
        self.lock = threading.Lock()
        self._order: OrderedDict[tuple[int, Hashable], LRUCache[Any, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    # the callers hold self.lock
    def _charge(self, cache: LRUCache[Any, Any], key: Hashable, cost: int) -> None:
        self._order[(id(cache), key)] = cache
        self.used += cost
        while self.used > self.max_bytes and self._order:
            (_, victim_key), victim = self._order.popitem(last=False)
            hit = victim._data.pop(victim_key, None)
            if hit is not None:
                self.used -= hit[1]

    def _release(self, cache: LRUCache[Any, Any], key: Hashable, cost: int) -> None:
        if self._order.pop((id(cache), key), None) is not None:
            self.used -= cost


class LRUCache(Generic[K, V]):
    """A bounded mapping that drops the least recently used entry: at most ``size`` entries and, with a
    ``budget``, at most the budget's bytes over all the caches sharing it (each entry charged the ``cost``
    given to :meth:`put`, plus :data:`ENTRY_OVERHEAD`). Thread-safe."""

    def __init__(self, size: int, budget: CacheBudget | None = None) -> None:
        self._size = max(0, size)
        self._budget = budget
        self._lock = budget.lock if budget is not None else threading.Lock()
        self._order = budget._order if budget is not None else None  # the budget's LRU order, keyed by _key
        self._id = id(self)
        self._data: OrderedDict[K, tuple[V, int, tuple[int, K]]] = OrderedDict()

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            if self._order is not None:
                self._order.move_to_end(hit[2])
            return hit[0]

    def put(self, key: K, value: V, cost: int = 0) -> None:
        if not self._size:
            return
        cost += ENTRY_OVERHEAD
        budget = self._budget
        with self._lock:
            old = self._data.pop(key, None)
            if budget is not None:
                if old is not None:
                    budget._release(self, key, old[1])
                if cost > budget.max_bytes:
                    return
            while len(self._data) >= self._size:  # the count bound first: its room is this cache's own
                k, (_, c, _) = self._data.popitem(last=False)
                if budget is not None:
                    budget._release(self, k, c)
            self._data[key] = (value, cost, (self._id, key))
            if budget is not None:
                budget._charge(self, key, cost)

    def pop(self, key: K) -> V | None:
        with self._lock:
            hit = self._data.pop(key, None)
            if hit is None:
                return None
            if self._budget is not None:
                self._budget._release(self, key, hit[1])
            return hit[0]

    def clear(self) -> None:
        with self._lock:
            for key, (_, cost, _) in list(self._data.items()):
                if self._budget is not None:
                    self._budget._release(self, key, cost)
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data


class TTLCache(Generic[K, V]):
    """An :class:`LRUCache` whose entries also expire ``ttl`` seconds after they were put."""

    def __init__(self, ttl: float, size: int, budget: CacheBudget | None = None) -> None:
        self.ttl = ttl
        self._lru: LRUCache[K, tuple[float, V]] = LRUCache(size if ttl > 0 else 0, budget)

    def get(self, key: K) -> V | None:
        hit = self._lru.get(key)
        if hit is None:
            return None
        if time.monotonic() >= hit[0]:
            self._lru.pop(key)
            return None
        return hit[1]

    def put(self, key: K, value: V, cost: int = 0) -> None:
        self._lru.put(key, (time.monotonic() + self.ttl, value), cost)

    def drop(self, key: K) -> None:
        self._lru.pop(key)

    def __len__(self) -> int:
        return len(self._lru)


_TTLCache = TTLCache


def schema_cost(schema: Schema) -> int:
    """The bytes a cached :class:`Schema` holds (its text and its references' names)."""
    return len(schema.schema) + sum(len(r.name) + len(r.subject) + 64 for r in schema.references)


# --- I/O ----------------------------------------------------------------------------------------------------

class RegistryClient:
    """One Schema Registry (a gateway-wide one, later one per tenant). ``await close()`` when done.

    Identical concurrent requests (a schema id, a subject's versions or latest, a register or lookup of one
    schema under one subject) share one HTTP request; a waiter that is cancelled does not cancel it for the
    others. Errors are never cached. At most ``max_concurrent_requests`` HTTP requests are in flight (the
    others wait for a slot, at most ``timeout_s``); a schema longer than ``max_schema_bytes`` (an answer
    longer than :func:`answer_limit`) is :class:`SchemaTooLarge`, never kept. The caches are bounded by
    count (``cache_size`` each) and, with a ``budget``, by bytes over all of them.
    """

    def __init__(self, config: RegistryConfig, *, transport: httpx.AsyncBaseTransport | None = None,
                 budget: CacheBudget | None = None, max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
                 max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS) -> None:
        self.config = config
        self._base = config.url.rstrip("/")
        self._shown = redact_url(self._base)  # in messages: no credentials of the URL
        verify: ssl.SSLContext | bool = config.verify
        if config.verify and config.ca_file:
            verify = ssl.create_default_context(cafile=config.ca_file)
        self._http = httpx.AsyncClient(
            headers=config.headers(), verify=verify, transport=transport, follow_redirects=False,
            timeout=httpx.Timeout(config.timeout_s), trust_env=False)
        self.budget = budget if budget is not None else CacheBudget(DEFAULT_CACHE_MAX_BYTES)
        self.max_schema_bytes = max_schema_bytes
        self._answer_limit = answer_limit(max_schema_bytes)
        self._by_id: LRUCache[Hashable, Schema] = LRUCache(config.cache_size, self.budget)
        self._ids: LRUCache[tuple[str, Schema, bool], int] = LRUCache(config.cache_size, self.budget)
        self._lookups: LRUCache[tuple[str, Schema, bool], RegisteredSchema] = LRUCache(config.cache_size, self.budget)
        self._subjects: TTLCache[tuple[str, str], Any] = TTLCache(config.subject_ttl_s, config.cache_size, self.budget)
        self._inflight: dict[Hashable, asyncio.Future[Any]] = {}
        self._slots = asyncio.Semaphore(max(1, max_concurrent_requests))
        self.max_concurrent_requests = max(1, max_concurrent_requests)
        #: HTTP requests sent, in flight now, and the most ever in flight at once (tests and metrics)
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for fut in list(self._inflight.values()):
            fut.cancel()
        await self._http.aclose()

    async def _request(self, method: str, path: str, body: bytes | None = None,
                       params: dict[str, str] | None = None) -> bytes:
        url = self._base + path
        headers = {"Content-Type": CONTENT_TYPE} if body is not None else None
        try:
            async with asyncio.timeout(self.config.timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise RegistryUnavailable(
                f"schema registry {self._shown}: {self.max_concurrent_requests} requests in flight for "
                f"{self.config.timeout_s} s (no slot for {method} {path})") from None
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                status, content, retry_after = await self._send(method, url, body, headers, params)
        except TimeoutError:
            raise RegistryUnavailable(
                f"schema registry {self._shown}: no answer to {method} {path} within {self.config.timeout_s} s"
            ) from None
        except httpx.TimeoutException as exc:
            raise RegistryUnavailable(
                f"schema registry {self._shown}: {type(exc).__name__} on {method} {path}") from None
        except httpx.TransportError as exc:
            raise RegistryUnavailable(f"schema registry {self._shown} unreachable: {type(exc).__name__}: {exc}") \
                from None
        finally:
            self.in_flight -= 1
            self._slots.release()
        if status >= 300:
            raise error_from_response(status, content, retry_after)
        return content

    async def _send(self, method: str, url: str, body: bytes | None, headers: dict[str, str] | None,
                    params: dict[str, str] | None) -> tuple[int, bytes, str | None]:
        """One request, its answer read up to the answer limit (a longer one: SchemaTooLarge)."""
        limit = self._answer_limit
        async with self._http.stream(method, url, content=body, headers=headers, params=params) as r:
            declared = r.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise SchemaTooLarge(f"schema registry {self._shown}: the answer to {method} "
                                     f"{url[len(self._base):]} is {declared} bytes, over the gateway's limit of "
                                     f"{limit} (GATEWAY_SCHEMA_MAX_BYTES)", int(declared), limit)
            parts: list[bytes] = []
            size = 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise SchemaTooLarge(f"schema registry {self._shown}: the answer to {method} "
                                         f"{url[len(self._base):]} is over the gateway's limit of {limit} bytes "
                                         f"(GATEWAY_SCHEMA_MAX_BYTES)", size, limit)
                parts.append(chunk)
            return r.status_code, b"".join(parts), r.headers.get("retry-after")

    def _check_size(self, schema: Schema, what: str) -> None:
        size = text_size(schema.schema)
        if size > self.max_schema_bytes:
            raise SchemaTooLarge(f"{what} is {size} bytes, over the gateway's limit of {self.max_schema_bytes} "
                                 f"(GATEWAY_SCHEMA_MAX_BYTES)", size, self.max_schema_bytes)

    async def _once(self, key: Hashable, make: Callable[[], Awaitable[T]]) -> T:
        """``make()``, shared by every concurrent caller with the same ``key``."""
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(make())
            self._inflight[key] = fut
            fut.add_done_callback(functools.partial(self._settled, key))
        return await asyncio.shield(fut)

    def _settled(self, key: Hashable, fut: asyncio.Future[Any]) -> None:
        if self._inflight.get(key) is fut:
            del self._inflight[key]
        if not fut.cancelled():
            fut.exception()  # retrieved: every waiter may have been cancelled

    # -- by id (immutable: cached)

    async def get_schema(self, schema_id: int, *, fmt: str | None = None) -> Schema:
        """The schema with this global id (:class:`SchemaNotFound` if there is none). ``fmt="serialized"``
        asks for a Protobuf schema as the base64 of its ``FileDescriptorProto`` (the registry's
        ``?format=serialized``); each form is cached on its own."""
        key = schema_id if fmt is None else (schema_id, fmt)
        cached = self._by_id.get(key)
        if cached is not None:
            return cached
        return await self._once(("id", schema_id, fmt), lambda: self._fetch_schema(schema_id, fmt))

    async def _fetch_schema(self, schema_id: int, fmt: str | None = None) -> Schema:
        params = {"format": fmt} if fmt else None
        schema = parse_schema(await self._request("GET", f"/schemas/ids/{int(schema_id)}", params=params))
        self._check_size(schema, f"schema id {schema_id}")
        self._by_id.put(schema_id if fmt is None else (schema_id, fmt), schema, schema_cost(schema))
        return schema

    def cached_schema(self, schema_id: int) -> Schema | None:
        """The schema if it is in the cache (no request)."""
        return self._by_id.get(schema_id)

    # -- subjects (short TTL)

    async def get_versions(self, subject: str) -> list[int]:
        key = ("versions", subject)
        hit = self._subjects.get(key)
        versions: tuple[int, ...] = hit if hit is not None else await self._once(
            key, lambda: self._fetch_versions(subject))
        return list(versions)

    async def _fetch_versions(self, subject: str) -> tuple[int, ...]:
        versions = tuple(parse_versions(await self._request("GET", f"/subjects/{_q(subject)}/versions")))
        self._subjects.put(("versions", subject), versions, len(subject) + 32 * len(versions))
        return versions

    async def get_latest(self, subject: str) -> RegisteredSchema:
        key = ("latest", subject)
        hit = self._subjects.get(key)
        if hit is not None:
            return hit
        return await self._once(key, lambda: self._fetch_latest(subject))

    async def _fetch_latest(self, subject: str) -> RegisteredSchema:
        reg = await self.get_version(subject, "latest")
        self._subjects.put(("latest", subject), reg, len(subject) + schema_cost(reg.schema))
        return reg

    async def get_version(self, subject: str, version: int | str, *, fmt: str | None = None) -> RegisteredSchema:
        """A subject's version (a number or ``"latest"``); the schema is cached by its id too.
        ``fmt="serialized"``: a Protobuf schema as its descriptor (see :meth:`get_schema`)."""
        params = {"format": fmt} if fmt else None
        reg = parse_registered(
            await self._request("GET", f"/subjects/{_q(subject)}/versions/{_q(str(version))}", params=params),
            subject)
        self._check_size(reg.schema, f"schema id {reg.schema_id} ({subject} version {reg.version})")
        self._by_id.put(reg.schema_id if fmt is None else (reg.schema_id, fmt), reg.schema, schema_cost(reg.schema))
        return reg

    # -- writes

    async def register(self, subject: str, schema: Schema, *, normalize: bool = False) -> int:
        """Register ``schema`` under ``subject`` (idempotent in the registry: an existing one keeps its id)."""
        self._check_size(schema, "the schema")
        key = (subject, schema, normalize)
        cached = self._ids.get(key)
        if cached is not None:
            return cached
        return await self._once(("register", *key), lambda: self._register(subject, schema, normalize))

    async def _register(self, subject: str, schema: Schema, normalize: bool) -> int:
        params = {"normalize": "true"} if normalize else None
        schema_id = parse_id(await self._request("POST", f"/subjects/{_q(subject)}/versions",
                                                 schema_body(schema), params))
        cost = len(subject) + schema_cost(schema)
        self._ids.put((subject, schema, normalize), schema_id, cost)
        if not normalize:
            self._by_id.put(schema_id, schema, schema_cost(schema))
        self._subjects.drop(("versions", subject))
        self._subjects.drop(("latest", subject))
        return schema_id

    async def lookup(self, subject: str, schema: Schema, *, normalize: bool = False) -> RegisteredSchema:
        """The id and version of ``schema`` under ``subject`` (:class:`SchemaNotFound` if it is not there)."""
        self._check_size(schema, "the schema")
        key = (subject, schema, normalize)
        cached = self._lookups.get(key)
        if cached is not None:
            return cached
        return await self._once(("lookup", *key), lambda: self._lookup(subject, schema, normalize))

    async def _lookup(self, subject: str, schema: Schema, normalize: bool) -> RegisteredSchema:
        params = {"normalize": "true"} if normalize else None
        reg = parse_registered(await self._request("POST", f"/subjects/{_q(subject)}", schema_body(schema), params),
                               subject)
        cost = len(subject) + schema_cost(schema)
        self._lookups.put((subject, schema, normalize), reg, cost + schema_cost(reg.schema))
        self._ids.put((subject, schema, normalize), reg.schema_id, cost)
        return reg

    # -- the subjects of an id (not cached here: service/schemas/subjects.py keeps them with a TTL)

    async def get_id_versions(self, schema_id: int) -> list[tuple[str, int]]:
        """``GET /schemas/ids/{id}/versions``: the (subject, version) pairs the schema with this id is registered
        under (:class:`SchemaNotFound` if there is no such id)."""
        return await self._once(("id-versions", schema_id), lambda: self._fetch_id_versions(schema_id))

    async def _fetch_id_versions(self, schema_id: int) -> list[tuple[str, int]]:
        return parse_id_versions(await self._request("GET", f"/schemas/ids/{int(schema_id)}/versions"))


def parse_id_versions(body: bytes) -> list[tuple[str, int]]:
    """``[{"subject": s, "version": v}, ...]`` as (subject, version) pairs."""
    doc = _json(body)
    if not isinstance(doc, list) or not all(
            isinstance(d, dict) and isinstance(d.get("subject"), str) and isinstance(d.get("version"), int)
            for d in doc):
        raise _bad("schema id versions", doc)
    return [(d["subject"], d["version"]) for d in doc]


def _q(segment: str) -> str:
    return quote(segment, safe="")


def redact_url(url: str) -> str:
    """``url`` without a password in its userinfo (``https://user:***@host``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
