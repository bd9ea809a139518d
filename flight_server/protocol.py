"""``do_put`` commands and action bodies: UTF-8 JSON objects with known keys and types.

Every parser rejects malformed JSON, unknown keys, missing keys and wrong types
with a `ProtocolError` that names the key (the server answers INVALID_ARGUMENT).
Stream commands and tickets are the engine's own type, parsed in Rust:
``dataset_rt.service.StreamRequest`` and ``parse_ticket``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from dataset_rt import service as engine
from dataset_rt.service import MAX_MESSAGE_BYTES
from flight_server.errors import ProtocolError

T = TypeVar("T")

U64 = 2**64
MAX_INTEGER_DIGITS = len(str(U64 - 1))


def _decode(raw: bytes, what: str) -> dict[str, Any]:
    """A JSON object of at most `MAX_MESSAGE_BYTES`, flat enough, with integers
    of at most `MAX_INTEGER_DIGITS` digits, checked before anything big is built."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"the {what} is {len(raw)} bytes; at most {MAX_MESSAGE_BYTES} allowed")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProtocolError(
            f"the {what} is not UTF-8: byte {error.start} is invalid; send UTF-8 JSON"
        ) from None
    try:
        value = json.loads(text, parse_int=functools.partial(_integer, what=what))
    except json.JSONDecodeError as error:
        raise ProtocolError(f"the {what} is not JSON: {error}") from None
    except RecursionError:
        raise ProtocolError(
            f"the {what} nests too deeply; it must be a JSON object of plain values"
        ) from None
    if not isinstance(value, dict):
        raise ProtocolError(f"the {what} must be a JSON object, got {type(value).__name__}")
    return value


def _integer(digits: str, *, what: str) -> int:
    """A JSON integer, refused before Python converts a huge one."""
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ProtocolError(
            f"the {what} has an integer of {len(digits.lstrip('-'))} digits; integers here "
            f"are at most {U64 - 1} ({MAX_INTEGER_DIGITS} digits)"
        )
    return int(digits)


class _Fields:
    """Typed access to a decoded JSON object that tracks which keys were read."""

    def __init__(self, value: dict[str, Any], what: str) -> None:
        self._value = value
        self._what = what
        self._read: set[str] = set()

    def _get(self, key: str, required: bool) -> Any:
        self._read.add(key)
        if required and key not in self._value:
            raise ProtocolError(f"the {self._what} is missing the key '{key}'")
        if required and self._value[key] is None:
            raise ProtocolError(f"'{key}' must not be null in the {self._what}")
        return self._value.get(key)

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self._get(key, required)
        if value is not None and not isinstance(value, str):
            raise ProtocolError(f"'{key}' must be a string, got {json.dumps(value)}")
        if value is not None and not _is_unicode(value):
            raise ProtocolError(f"'{key}' is not valid Unicode (it has a lone surrogate)")
        return value

    def integer(
        self, key: str, *, required: bool = False, minimum: int = 0, maximum: int = U64 - 1
    ) -> int | None:
        value = self._get(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"'{key}' must be an integer, got {json.dumps(value)}")
        if not minimum <= value <= maximum:
            raise ProtocolError(f"'{key}' must be between {minimum} and {maximum}, got {value}")
        return value

    def boolean(self, key: str, *, required: bool = False) -> bool | None:
        value = self._get(key, required)
        if value is not None and not isinstance(value, bool):
            raise ProtocolError(f"'{key}' must be true or false, got {json.dumps(value)}")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self._value) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read))
            raise ProtocolError(
                f"unknown key '{unknown[0]}' in the {self._what}; the keys are: {known}"
            )


@dataclass(frozen=True)
class PutCommand:
    """``do_put`` command: validate a metadata table and (by default) activate it."""

    dataset: str
    activate: bool = True

    @classmethod
    def parse(cls, raw: bytes) -> PutCommand:
        fields = _Fields(_decode(raw, "command"), "command")
        command = cls(
            dataset=_required(fields.string("dataset", required=True)),
            activate=_default(fields.boolean("activate"), True),
        )
        fields.finish()
        return command


@dataclass(frozen=True)
class ActionBody:
    """The body of an action: ``{"dataset"?, "epoch_len"?, "population"?}``."""

    dataset: str | None = None
    epoch_len: int | None = None
    population: str | None = None

    @classmethod
    def parse(
        cls, raw: bytes, *, dataset: bool, epoch_len: bool, population: bool = False
    ) -> ActionBody:
        if not raw and not dataset:
            return cls()
        fields = _Fields(_decode(raw, "action body"), "action body")
        body = cls(
            dataset=fields.string("dataset", required=True) if dataset else None,
            epoch_len=fields.integer("epoch_len", required=True) if epoch_len else None,
            population=fields.string("population", required=True) if population else None,
        )
        fields.finish()
        return body


@dataclass(frozen=True)
class RunAction:
    """The body of ``claim_run`` (``{"dataset", "run", "after", "epoch",
    "position", "fresh"?}``) or ``check_run`` (``{"dataset", "run",
    "generation"}``): fencing a training run (docs/training.md, "Fencing").
    The contract is the engine's (``native/src/run/action.rs``), parsed there."""

    @staticmethod
    def parse(raw: bytes, *, claim: bool) -> engine.RunAction:
        return engine.parse_run_action(raw, claim=claim)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _required(value: T | None) -> T:
    if value is None:  # pragma: no cover - `required=True` raised already
        raise ProtocolError("a required key is missing")
    return value


def _default(value: T | None, default: T) -> T:
    return default if value is None else value
