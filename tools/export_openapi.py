"""Print the gateway's OpenAPI contract as YAML: ``.venv/bin/python tools/export_openapi.py > openapi.yaml``.

The document is the app's own generated schema (``app.openapi()``, enriched by :mod:`api.openapi`), so the
committed ``openapi.yaml`` and the running gateway's ``/openapi.json`` are the same contract;
``tests/integration/test_openapi.py`` fails when they drift apart. Keys keep the schema's order.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api.contract import app_schema

HEADER = ("# The kafka-consumer-gateway HTTP API contract, generated from the app: do not edit by hand.\n"
          "# Regenerate with: .venv/bin/python tools/export_openapi.py > openapi.yaml\n")


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the descriptions) as literal blocks and no anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(schema: dict[str, Any]) -> str:
    return HEADER + yaml.dump(schema, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


def main() -> None:
    sys.stdout.write(to_yaml(app_schema()))


if __name__ == "__main__":
    main()
