"""Bearer-token authentication: read tokens may read, admin tokens may also write."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow.flight as flight

Role = Literal["read", "admin"]


@dataclass(frozen=True)
class TokenFile:
    """Tokens from a file of ``<role> <token>`` lines (``#`` starts a comment)."""

    tokens: tuple[tuple[str, Role], ...]

    @classmethod
    def load(cls, path: Path) -> TokenFile:
        tokens: list[tuple[str, Role]] = []
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or parts[0] not in ("read", "admin") or len(parts[1]) < 16:
                raise ValueError(
                    f"{path}:{number}: expected '<read|admin> <token of 16+ characters>'"
                )
            role: Role = "admin" if parts[0] == "admin" else "read"
            tokens.append((parts[1], role))
        if not tokens:
            raise ValueError(f"{path}: no tokens; add lines like 'admin <token>'")
        return cls(tuple(tokens))

    def role_of(self, token: str) -> Role | None:
        role: Role | None = None
        for known, known_role in self.tokens:  # compare all, in constant time each
            if hmac.compare_digest(known.encode(), token.encode()):
                role = known_role
        return role


def bearer_token(header: str) -> str | None:
    """The token of an ``authorization`` header value of the Bearer scheme,
    whatever its spelling (``Bearer``, ``bearer``, extra spaces), else None.
    The one parser of the header: Flight calls and the HTTP side port use it."""
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class AuthMiddleware(flight.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, role: Role) -> None:
        self.role = role


class BearerAuthFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Rejects every call without a valid ``authorization: Bearer <token>`` header."""

    def __init__(self, tokens: TokenFile) -> None:
        super().__init__()
        self._tokens = tokens

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> AuthMiddleware:
        values = headers.get("authorization", [])
        token = bearer_token(values[0]) if values else None
        role = self._tokens.role_of(token) if token is not None else None
        if role is None:
            raise flight.FlightUnauthenticatedError(
                "a valid 'authorization: Bearer <token>' header is required"
            )
        return AuthMiddleware(role)


def require_admin(context: Any, what: str) -> None:
    """Raise UNAUTHORIZED unless the call carries an admin token (or auth is off)."""
    middleware = context.get_middleware("auth")
    if middleware is not None and middleware.role != "admin":
        raise flight.FlightUnauthorizedError(f"{what} needs an admin token")
