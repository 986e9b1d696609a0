"""Process entry point: production event loop and HTTP parser choices."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from gateway.main import _http_protocol, _loop_factory


def test_uvloop_by_default_and_asyncio_on_request() -> None:
    factory = _loop_factory("auto")
    assert factory is uvloop.new_event_loop
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    assert _loop_factory("asyncio") is None  # asyncio.Runner's default loop
    assert _loop_factory("uvloop") is uvloop.new_event_loop


def test_httptools_by_default_and_h11_on_request() -> None:
    assert _http_protocol("auto") == "httptools"
    assert _http_protocol("h11") == "h11"


def test_missing_uvloop_is_a_clear_error_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_uvloop(name: str, *args: object, **kwargs: object) -> object:
        if name == "uvloop":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert _loop_factory("auto") is None
    with pytest.raises(SystemExit, match="uvloop is not installed"):
        _loop_factory("uvloop")
    assert asyncio.Runner(loop_factory=_loop_factory("auto"))  # falls back to asyncio's loop
