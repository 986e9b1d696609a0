"""What a client is told about a Kafka error: the error's name and code, never the broker's own text.

A broker's ``error_message`` and the client layer's connection errors name broker host names, internal
addresses and listener details (``cannot connect to kafka-3.corp.internal:9093``, a CreateTopics refusal
quoting the controller...). Clients get a generic text that names the Kafka error (``Kafka error
TOPIC_AUTHORIZATION_FAILED (29)``), prefixed by the gateway's own context (the operation, topic, partition or
group the client asked about); the full text goes to the gateway's log (:func:`client_text` logs it once per
answer). Errors whose message the gateway writes itself (commit refusals, closed consumers, partition errors
naming only the error) keep it.
"""

from __future__ import annotations

import logging

from service.client.errors import (
    AuthenticationError,
    BrokerResponseError,
    FrameTooLargeError,
    KafkaConnectionError,
    KafkaError,
    NoBrokersAvailableError,
    NoCommonVersionError,
    RequestTimeoutError,
)
from service.consumer.consumer import ConsumerClosedError
from service.fetch.fetcher import FetchPartitionError, RecordTooLargeError
from service.group.coordinator import CommitFailedError
from service.producer.errors import ProduceFailure, ProducerClosedError
from service.protocol.error_codes import describe

log = logging.getLogger("api.kafka")

#: KafkaErrors whose message is the gateway's own words (no broker text, no address)
OWN_TEXT: tuple[type[KafkaError], ...] = (CommitFailedError, ConsumerClosedError, ProducerClosedError,
                                          FetchPartitionError, RecordTooLargeError)
#: what a client is told for errors without a Kafka error code (most specific class first)
GENERIC: tuple[tuple[type[KafkaError], str], ...] = (
    (NoBrokersAvailableError, "no Kafka broker reachable"),
    (AuthenticationError, "the gateway cannot authenticate to Kafka"),
    (RequestTimeoutError, "a Kafka broker did not answer in time"),
    (KafkaConnectionError, "the connection to a Kafka broker failed"),
    (FrameTooLargeError, "a Kafka broker sent a response larger than the gateway accepts"),
    (NoCommonVersionError, "the Kafka broker does not support a request version the gateway needs"),
)


def code_text(code: int) -> str:
    """``Kafka error TOPIC_AUTHORIZATION_FAILED (29)``."""
    return f"Kafka error {describe(code).name} ({code})"


def public_text(exc: KafkaError) -> str:
    """The client-facing text of ``exc`` (pure: no logging)."""
    if isinstance(exc, OWN_TEXT):
        return str(exc)
    if isinstance(exc, BrokerResponseError):
        return exc.public_message
    for cls, text in GENERIC:
        if isinstance(exc, cls):
            return text
    if exc.code is not None:
        return code_text(exc.code)
    return "Kafka error (the gateway logged the details)"


def client_text(exc: KafkaError) -> str:
    """:func:`public_text`, logging the full text when it hides something."""
    text = public_text(exc)
    full = str(exc)
    if full != text:
        log.warning("Kafka error answered as %r: %s", text, full)
    return text


def failure_text(f: ProduceFailure) -> str:
    """The client-facing text of a record the producer could not deliver (its message may hold the broker's
    text or a broker address: logged instead)."""
    text = code_text(f.code)
    if "may have been written" in f.message:
        text += "; the record may have been written"
    return text


def failure_texts(failures: list[ProduceFailure]) -> None:
    """Log the full text of each distinct failure of one answer once."""
    for message in dict.fromkeys(f.message for f in failures):
        log.warning("produce failure answered by its code: %s", message)
