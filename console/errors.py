"""Domain errors raised by services; the API maps each to one status code, pages to a message."""

from __future__ import annotations


class DomainError(Exception):
    status = 400
    retry_after: int | None = None  # seconds: the API sends a Retry-After header

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def details(self) -> dict:
        """Fields the API's error body carries besides `message` and `field`."""
        return {}


class Invalid(DomainError):
    """Input that is well-formed but not acceptable (422)."""

    status = 422


class NotFound(DomainError):
    status = 404


class Conflict(DomainError):
    """The request clashes with the current state (409), e.g. an illegal transition."""

    status = 409


class Forbidden(DomainError):
    status = 403
