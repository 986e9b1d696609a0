"""The error kinds every format codec raises (avro, jsonschema_format, protobuf subclass them), so that
:mod:`service.schemas.codecs` maps them to its own errors once for all formats."""

from __future__ import annotations


class CodecSchemaError(ValueError):
    """The schema does not compile for its format."""


class CodecEncodeError(ValueError):
    """A JSON value does not fit its schema; ``path`` names the offending value (``$`` is the root)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = message


class CodecDecodeError(ValueError):
    """A payload could not be read with its schema."""
