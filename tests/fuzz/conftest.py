"""The fuzz tier needs the three C extensions: it fails (``KCG_REQUIRE_CEXT=1``, as ``make test`` and
``make fuzz`` set) or skips without them."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import require_cext

MODULES = {"_crecords": "service.protocol._crecords", "_cavro": "service.schemas._cavro",
           "_cproduce": "service.producer._cproduce"}


def missing_extensions() -> list[str]:
    out = []
    for dotted in MODULES.values():
        try:
            importlib.import_module(dotted)
        except ImportError as exc:
            out.append(f"{dotted}: {exc}")
    return out


@pytest.fixture(autouse=True)
def _need_the_c_extensions() -> None:
    missing = missing_extensions()
    if missing:
        if require_cext():
            pytest.fail(f"C extensions not importable (KCG_REQUIRE_CEXT=1): {'; '.join(missing)}")
        pytest.skip(f"C extensions not built: {'; '.join(missing)}")
