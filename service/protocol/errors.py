"""Typed errors of the protocol layer and Kafka's error codes."""

from __future__ import annotations


class KafkaProtocolError(Exception):
    """Base of every error raised by the sans-io protocol layer."""


class ProtocolDecodeError(KafkaProtocolError):
    """Bytes from the wire do not form a valid message."""


class UnsupportedVersionError(KafkaProtocolError):
    """A message version outside what we implement (or no version common with the broker)."""


class UnsupportedMessageFormatError(KafkaProtocolError):
    """A record set in magic 0/1 format (pre-0.11 message sets), which this gateway does not read."""


class CorruptRecordError(KafkaProtocolError):
    """A record batch failed its CRC or structure checks; names where it was found."""

    def __init__(self, message: str, *, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None) -> None:
        where = []
        if topic is not None:
            where.append(f"topic={topic}")
        if partition is not None:
            where.append(f"partition={partition}")
        if offset is not None:
            where.append(f"offset={offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
