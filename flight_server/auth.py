"""Bearer-token authentication: read tokens may read, admin tokens may also write.

A token is an identity: its name in the token file (or a default name derived
from it) is who a call is, for the per-client stream limit
(`flight_server.limits.client_of`). The ``authorization`` header is parsed in
one place (`bearer_token`), so every spelling of one token is one client.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow.flight as flight

log = logging.getLogger("flight_server.auth")

Role = Literal["read", "admin"]

#: A token's name: what logs and limits call its client (never the secret).
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: The key of the middleware that carries a call's `Identity`.
MIDDLEWARE = "auth"


def default_name(token: str, role: Role) -> str:
    """The name of a token the file gives none: stable across restarts and
    replicas, and a digest, so it does not reveal the token."""
    return f"{role}-{hashlib.sha256(token.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Identity:
    """Who a call is: its token's role and name."""

    role: Role
    name: str


@dataclass(frozen=True)
class TokenFile:
    """Tokens from a file of ``<role> <token> [name]`` lines (``#`` starts a comment).

    ``names`` holds each token's name, in order; left empty, every token gets
    its `default_name`."""

    tokens: tuple[tuple[str, Role], ...]
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.names:
            names = tuple(default_name(token, role) for token, role in self.tokens)
            object.__setattr__(self, "names", names)
        if len(self.names) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.names)} names")
        for name in self.names:
            if not NAME.fullmatch(name):
                raise ValueError(f"token name {name!r} is not 1-64 of letters, digits, '-_.'")
        if len(set(self.names)) != len(self.names):
            raise ValueError("two tokens have one name; each token's name must be its own")

    @classmethod
    def load(cls, path: Path) -> TokenFile:
        tokens: list[tuple[str, Role]] = []
        names: list[str] = []
        lines: dict[str, int] = {}  # name -> its line, for the duplicate's message
        secrets: dict[str, int] = {}
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) not in (2, 3) or parts[0] not in ("read", "admin") or len(parts[1]) < 16:
                raise ValueError(
                    f"{path}:{number}: expected '<read|admin> <token of 16+ characters> [name]'"
                )
            role: Role = "admin" if parts[0] == "admin" else "read"
            token = parts[1]
            name = parts[2] if len(parts) == 3 else default_name(token, role)
            if not NAME.fullmatch(name):
                raise ValueError(
                    f"{path}:{number}: the token name {name!r} is not plain: use 1-64 "
                    "letters, digits, '-', '_' or '.'"
                )
            if name in lines:
                raise ValueError(
                    f"{path}:{number}: the token name {name!r} is already the name of the "
                    f"token on line {lines[name]}; each token needs a name of its own"
                )
            if token in secrets:
                raise ValueError(
                    f"{path}:{number}: this token is already on line {secrets[token]}; "
                    "give each token one line"
                )
            lines[name] = secrets[token] = number
            tokens.append((token, role))
            names.append(name)
        if not tokens:
            raise ValueError(f"{path}: no tokens; add lines like 'admin <token> [name]'")
        return cls(tuple(tokens), tuple(names))

    def identify(self, token: str) -> Identity | None:
        """The identity of ``token``, or None when the file does not hold it."""
        found: Identity | None = None
        offered = token.encode()
        for (known, role), name in zip(self.tokens, self.names, strict=True):
            # Compare all, in constant time each: the time says nothing of which matched.
            if hmac.compare_digest(known.encode(), offered):
                found = Identity(role, name)
        return found

    def role_of(self, token: str) -> Role | None:
        identity = self.identify(token)
        return identity.role if identity is not None else None


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
    """A call's `Identity` (``context.get_middleware("auth")``)."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    @property
    def role(self) -> Role:
        return self.identity.role

    @property
    def name(self) -> str:
        return self.identity.name


#: Told of each refused call: its method (``do_get``, ...), the error the client
#: gets, and why (never the offered token).
OnRefused = Callable[[str, flight.FlightError, str], None]

UNAUTHENTICATED = "a valid 'authorization: Bearer <token>' header is required"


class BearerAuthFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Rejects every call without a valid ``authorization: Bearer <token>`` header;
    the others carry their `Identity`. A refusal happens before any handler runs,
    so it is reported here, to ``on_refused`` (the server's metrics)."""

    def __init__(self, tokens: TokenFile, on_refused: OnRefused | None = None) -> None:
        super().__init__()
        self._tokens = tokens
        self._on_refused = on_refused

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> AuthMiddleware:
        values = headers.get("authorization", [])
        header = values[0] if values else None
        token = bearer_token(header) if isinstance(header, str) else None
        identity = self._tokens.identify(token) if token is not None else None
        if identity is not None:
            return AuthMiddleware(identity)
        if header is None:
            reason = "no authorization header"
        elif token is None:
            reason = "not a Bearer authorization header"
        else:
            reason = "unknown token"
        error = flight.FlightUnauthenticatedError(UNAUTHENTICATED)
        if self._on_refused is not None:
            method = info.method.name.lower()  # a fixed set: do_get, do_put, ...
            try:
                self._on_refused(method, error, reason)
            except Exception:  # the refusal stands; a broken report is the server's bug
                log.exception("reporting a refused call failed")
        raise error


def identity_of(context: Any) -> Identity | None:
    """The identity of a call (None when the server has no token file)."""
    middleware = context.get_middleware(MIDDLEWARE)
    return middleware.identity if middleware is not None else None


def require_admin(context: Any, what: str) -> None:
    """Raise UNAUTHORIZED unless the call carries an admin token (or auth is off)."""
    identity = identity_of(context)
    if identity is not None and identity.role != "admin":
        raise flight.FlightUnauthorizedError(f"{what} needs an admin token")
