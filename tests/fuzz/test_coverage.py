"""Every public function of the three C extensions (and of their types) has a Python twin in
tests/fuzz/twins.py and at least one fuzz test: a new entry point without one fails here."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import tests.fuzz
from tests.fuzz.conftest import MODULES
from tests.fuzz.twins import COVERED, TWINS, UNIT_TESTS

ROOT = Path(__file__).resolve().parents[2]


def public_names() -> Iterator[str]:
    for short, dotted in MODULES.items():
        module = importlib.import_module(dotted)
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or not callable(obj):
                continue  # constants (_cavro.VERSION) are not entry points
            yield f"{short}.{name}"
            if isinstance(obj, type):
                yield from (f"{short}.{name}.{m}" for m in dir(obj) if not m.startswith("_"))


def _import_the_tier() -> None:
    for info in pkgutil.iter_modules(tests.fuzz.__path__):
        if info.name.startswith("test_"):
            importlib.import_module(f"tests.fuzz.{info.name}")


def test_every_public_c_function_has_a_twin_and_a_fuzz_test() -> None:
    _import_the_tier()
    names = set(public_names())
    assert len(names) >= 20  # the three modules were found
    assert sorted(names - TWINS.keys()) == [], "C entry points without a twin in tests/fuzz/twins.py"
    assert sorted(TWINS.keys() - names) == [], "twins.py names entry points the C modules no longer have"
    assert sorted(names - COVERED.keys()) == [], "C entry points no fuzz test covers (@covers)"


def test_the_tests_named_as_covering_are_property_tests_or_subprocess_cases() -> None:
    _import_the_tier()
    for name, tests_of in COVERED.items():
        for ref in tests_of:
            module, fn = ref.split(":")
            obj = getattr(importlib.import_module(module), fn)
            assert hasattr(obj, "hypothesis") or module.endswith("test_index_arguments"), (name, ref)
        assert any(hasattr(getattr(importlib.import_module(r.split(":")[0]), r.split(":")[1]), "hypothesis")
                   for r in tests_of), f"{name}: no property test"


def test_the_unit_tests_named_beside_the_twins_exist() -> None:
    assert UNIT_TESTS.keys() <= TWINS.keys()
    for name, refs in UNIT_TESTS.items():
        for ref in refs:
            path, fn = ref.split("::")
            text = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {fn}\(", text, re.M), f"{name}: {ref} is gone"
