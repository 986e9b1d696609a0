"""The per-API handler registry of the test broker and the context a handler receives.

A handler is ``async def handler(ctx: RequestContext, request) -> response | None``: it gets the decoded
request and returns the response struct (encoded at the request's version), or ``None`` to send
nothing (e.g. Produce with acks=0). It may call ``ctx.close_after_response()`` or raise
:class:`CloseConnection` to close without answering.

Registering an API makes the brokers advertise it in ApiVersions (with the handler's version range,
by default everything our codecs implement). Extra subsystems (fetch sessions, groups, transactions)
add their handlers with :meth:`HandlerRegistry.register` on a registry of their own
(``default_registry().copy()``) or on the default one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.protocol.dsl import Struct
from service.protocol.frames import RequestHeader
from service.protocol.messages import REQUESTS, RESPONSES

if TYPE_CHECKING:
    from tests.fakes.broker.cluster import TestCluster
    from tests.fakes.broker.log import RequestLogEntry
    from tests.fakes.broker.server import BrokerServer, ClientConnection
    from tests.fakes.broker.state import ClusterState

VersionRange = tuple[int, int]
Handler = Callable[["RequestContext", Any], Awaitable[Any]]
# (ctx, request, error_code, depth) -> response carrying the error
ErrorResponder = Callable[["RequestContext", Any, int, "int | None"], Awaitable[Any]]
# (ctx) -> (response, response_version) to answer an unsupported version with, or None to close
UnsupportedVersionResponder = Callable[["RequestContext"], "tuple[Any, int] | None"]

ERROR_FIELDS = frozenset({"error_code", "partition_error_code"})


class CloseConnection(Exception):
    """Raised by a handler to close the connection without answering."""


@dataclass
class RequestContext:
    cluster: TestCluster
    broker: BrokerServer
    connection: ClientConnection
    header: RequestHeader
    entry: RequestLogEntry
    close_after: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> ClusterState:
        return self.cluster.state

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def api_key(self) -> int:
        return self.header.api_key

    def close_after_response(self) -> None:
        """Send the response, then close the connection (as Kafka does after an authentication failure)."""
        self.close_after = True


@dataclass(frozen=True)
class ApiEntry:
    api_key: int
    handler: Handler
    versions: VersionRange
    error_response: ErrorResponder | None = None
    unsupported_version: UnsupportedVersionResponder | None = None


class HandlerRegistry:
    def __init__(self) -> None:
        self._entries: dict[int, ApiEntry] = {}

    def register(
        self,
        api_key: int,
        handler: Handler,
        *,
        versions: VersionRange | None = None,
        error_response: ErrorResponder | None = None,
        unsupported_version: UnsupportedVersionResponder | None = None,
    ) -> None:
        """Handle ``api_key`` with ``handler`` for ``versions`` (default: the codec's whole range).

        ``error_response`` builds the answer for an injected error without side effects (default: run
        the handler and overwrite its error codes). ``unsupported_version`` answers a request whose
        version is above the advertised range instead of closing the connection (ApiVersions does).
        """
        cm = REQUESTS.get(api_key)
        if cm is None or api_key not in RESPONSES:
            raise ValueError(f"no codec for api key {api_key}")
        lo, hi = cm.schema.versions
        if versions is not None:
            if not (lo <= versions[0] <= versions[1] <= hi):
                raise ValueError(f"versions {versions} outside the codec range {lo}-{hi}")
            lo, hi = versions
        self._entries[api_key] = ApiEntry(api_key, handler, (lo, hi), error_response, unsupported_version)

    def handles(self, api_key: int, **kwargs: Any) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""

        def deco(fn: Handler) -> Handler:
            self.register(api_key, fn, **kwargs)
            return fn

        return deco

    def unregister(self, api_key: int) -> None:
        self._entries.pop(api_key, None)

    def get(self, api_key: int) -> ApiEntry | None:
        return self._entries.get(api_key)

    def keys(self) -> list[int]:
        return sorted(self._entries)

    def copy(self) -> HandlerRegistry:
        other = HandlerRegistry()
        other._entries = dict(self._entries)
        return other


# -- generic error responses -------------------------------------------------------------------------
def set_error_codes(obj: Any, code: int, depth: int | None = None, _level: int = 0) -> int:
    """Write ``code`` into the error-code fields of a response (``depth``: only that nesting level).
    Returns how many fields were set."""
    if not isinstance(obj, Struct):
        return 0
    n = 0
    for name in obj._fields:
        value = getattr(obj, name)
        if name in ERROR_FIELDS and isinstance(value, int) and (depth is None or depth == _level):
            setattr(obj, name, code)
            n += 1
        elif isinstance(value, list):
            for item in value:
                n += set_error_codes(item, code, depth, _level + 1)
        elif isinstance(value, Struct):
            n += set_error_codes(value, code, depth, _level + 1)
    return n


def empty_response(api_key: int, code: int) -> Any:
    """A default-valued response of ``api_key`` with ``code`` in its top-level error code (if any)."""
    resp = RESPONSES[api_key].cls()
    set_error_codes(resp, code, depth=0)
    return resp
