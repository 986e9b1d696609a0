"""Typed errors of the client layer. Every error says whether retrying may succeed."""

from __future__ import annotations

from service.protocol.error_codes import describe


class KafkaError(Exception):
    """Base class. ``retriable`` tells a caller whether the same request may succeed later."""

    retriable: bool = False
    code: int | None = None

    def __init__(self, message: str, *, retriable: bool | None = None, code: int | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable
        if code is not None:
            self.code = code


class BrokerResponseError(KafkaError):
    """The broker answered with a non-zero error code."""

    def __init__(self, code: int, context: str = "", message: str | None = None) -> None:
        info = describe(code)
        self.name = info.name
        self.context = context  # the gateway's words; the broker's message may name hosts
        self.broker_message = message
        text = f"{info.name} ({code})"
        if context:
            text = f"{context}: {text}"
        if message:
            text = f"{text}: {message}"
        super().__init__(text, retriable=info.retriable, code=code)

    @property
    def public_message(self) -> str:
        """Without the broker's text (what clients are told): the context, the error's name and code."""
        text = f"Kafka error {self.name} ({self.code})"
        return f"{self.context}: {text}" if self.context else text


class KafkaConnectionError(KafkaError):
    """Could not connect, or the connection was lost with requests in flight."""

    retriable = True


class RequestTimeoutError(KafkaError):
    """No response within the request timeout."""

    retriable = True


class FrameTooLargeError(KafkaError):
    """A response frame exceeded the configured guard (a misbehaving peer or a non-Kafka port)."""

    retriable = False


class AuthenticationError(KafkaError):
    """SASL or TLS authentication failed; retrying with the same credentials will not help."""

    retriable = False


class NoCommonVersionError(KafkaError):
    """The broker and this client share no version of an API this client needs."""

    retriable = False


class NoBrokersAvailableError(KafkaError):
    """None of the bootstrap or known brokers could be reached."""

    retriable = True


def raise_for_code(code: int, context: str = "", message: str | None = None) -> None:
    if code:
        raise BrokerResponseError(code, context, message)
