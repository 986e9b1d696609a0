"""Typed outcomes and errors of the producer.

Each record of a ``send_many`` call ends as exactly one of:

- :class:`RecordMetadata`: the broker acknowledged it (acks=all) at ``offset`` of ``partition``
  (``offset`` is -1 for a retry the broker recognised as a duplicate of a batch it wrote earlier but no
  longer remembers the offset of: the record *is* stored once, its offset is unknown);
- :class:`ProduceFailure`: it was not acknowledged. ``code`` is the Kafka error code (or one of the
  codes below for failures that are not a broker's answer), ``retriable`` tells whether sending it again
  may succeed. A retriable failure after an attempt whose outcome is unknown (a lost connection, a
  timeout) says so in its message: the record may have been written.

Errors raised by ``send_many`` itself (the whole call failed before any record was queued) are
:class:`service.client.errors.KafkaError` subclasses.
"""

from __future__ import annotations

from typing import NamedTuple

from service.client.errors import BrokerResponseError, KafkaError
from service.protocol import error_codes as EC
from service.protocol.error_codes import describe

# Failures that are not a broker's error code use Kafka's closest code, so callers can classify every
# failure by code alone:
REQUEST_TIMED_OUT = 7  # delivery timeout expired (Java: TimeoutException "Expiring N record(s) ...")
NETWORK_EXCEPTION = 13  # the connection was lost; the outcome of the attempt is unknown
UNKNOWN_SERVER_ERROR = -1  # an unexpected error inside the producer (logged)


class RecordMetadata(NamedTuple):
    partition: int
    offset: int


class ProduceFailure(NamedTuple):
    code: int
    message: str
    retriable: bool
    partition: int | None = None

    @property
    def name(self) -> str:
        return describe(self.code).name


def failure(code: int, message: str = "", partition: int | None = None, retriable: bool | None = None
            ) -> ProduceFailure:
    info = describe(code)
    text = f"{info.name} ({code})" + (f": {message}" if message else "")
    return ProduceFailure(code, text, info.retriable if retriable is None else retriable, partition)


ProduceResult = RecordMetadata | ProduceFailure


class UnknownTopicError(BrokerResponseError):
    """The topic does not exist (or is not visible to these credentials)."""

    def __init__(self, topic: str, code: int = EC.UNKNOWN_TOPIC_OR_PARTITION) -> None:
        super().__init__(code, f"topic {topic!r}")
        self.topic = topic
        self.retriable = False  # as a request-level answer: creating the topic is up to someone else


class ProducerClosedError(KafkaError):
    """``send_many`` after ``close()``."""

    retriable = True
