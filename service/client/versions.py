"""API version negotiation (pure): pick the highest version both sides support."""

from __future__ import annotations

from service.client.errors import NoCommonVersionError
from service.protocol.messages import REQUESTS

VersionRange = tuple[int, int]


def our_versions() -> dict[int, VersionRange]:
    return {k: cm.schema.versions for k, cm in REQUESTS.items()}


def api_name(api_key: int) -> str:
    cm = REQUESTS.get(api_key)
    return cm.schema.name.removesuffix("Request") if cm else f"api {api_key}"


class NegotiatedVersions:
    """What a broker supports, intersected with what we implement.

    Features are decided from ranges (``supports(FETCH, 13)`` means "some version >= 13 is usable"),
    never from one exact version.
    """

    def __init__(self, broker: dict[int, VersionRange], ours: dict[int, VersionRange] | None = None) -> None:
        self.broker = dict(broker)
        self.ours = ours if ours is not None else our_versions()
        self._chosen: dict[int, int] = {}
        for key, (lo, hi) in self.ours.items():
            theirs = self.broker.get(key)
            if theirs is None:
                continue
            top = min(hi, theirs[1])
            if top >= max(lo, theirs[0]):
                self._chosen[key] = top

    def version(self, api_key: int) -> int:
        v = self._chosen.get(api_key)
        if v is None:
            ours = self.ours.get(api_key)
            theirs = self.broker.get(api_key)
            name = api_name(api_key)
            if theirs is None:
                raise NoCommonVersionError(f"the broker does not support {name} (api key {api_key})")
            raise NoCommonVersionError(
                f"no common version of {name}: broker supports v{theirs[0]}-v{theirs[1]}, "
                f"this gateway implements v{ours[0]}-v{ours[1]}" if ours else f"{name} is not implemented"
            )
        return v

    def has(self, api_key: int) -> bool:
        return api_key in self._chosen

    def supports(self, api_key: int, min_version: int) -> bool:
        v = self._chosen.get(api_key)
        return v is not None and v >= min_version

    def __repr__(self) -> str:
        return f"NegotiatedVersions({self._chosen})"
