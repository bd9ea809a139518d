"""Commands and tickets: UTF-8 JSON objects with known keys and types.

Every parser rejects malformed JSON, unknown keys, missing keys and wrong types
with a `ProtocolError` that names the key (the server answers INVALID_ARGUMENT).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from flight_server.errors import ProtocolError

T = TypeVar("T")

MAX_MESSAGE_BYTES = 64 * 1024
U64 = 2**64


def _decode(raw: bytes, what: str) -> dict[str, Any]:
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"the {what} is {len(raw)} bytes; at most {MAX_MESSAGE_BYTES} allowed")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProtocolError(f"the {what} is not UTF-8 JSON: {error}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"the {what} must be a JSON object, got {type(value).__name__}")
    return value


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

    def strings(self, key: str) -> list[str] | None:
        value = self._get(key, False)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ProtocolError(f"'{key}' must be a list of strings, got {json.dumps(value)}")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self._value) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read))
            raise ProtocolError(
                f"unknown key '{unknown[0]}' in the {self._what}; the keys are: {known}"
            )


@dataclass(frozen=True)
class StreamCommand:
    """``get_flight_info`` command: an epoch of a seed's stream, split into ranks."""

    dataset: str
    seed: int
    epoch: int
    epoch_len: int | None = None
    shuffle: bool = True
    world_size: int = 1
    population: str | None = None
    columns: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: bytes) -> StreamCommand:
        fields = _Fields(_decode(raw, "command"), "command")
        command = cls._read(fields)
        fields.finish()
        return command

    @classmethod
    def _read(cls, fields: _Fields) -> StreamCommand:
        return cls(
            dataset=_required(fields.string("dataset", required=True)),
            seed=_required(fields.integer("seed", required=True)),
            epoch=_required(fields.integer("epoch", required=True)),
            epoch_len=fields.integer("epoch_len", minimum=1),
            shuffle=_default(fields.boolean("shuffle"), True),
            world_size=_default(fields.integer("world_size", minimum=1, maximum=2**32), 1),
            population=fields.string("population"),
            columns=tuple(_default(fields.strings("columns"), [])),
        )


@dataclass(frozen=True)
class StreamTicket:
    """``do_get`` ticket: one rank's partition of an epoch, from ``offset`` on."""

    dataset: str
    seed: int
    epoch: int
    epoch_len: int | None = None
    shuffle: bool = True
    world_size: int = 1
    population: str | None = None
    columns: tuple[str, ...] = ()
    rank: int = 0
    offset: int = 0

    def encode(self) -> bytes:
        body = {k: v for k, v in asdict(self).items() if v is not None}
        body["columns"] = list(self.columns)
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    def stream_arguments(self) -> dict[str, Any]:
        """The keyword arguments of the native ``DatasetService.stream``/``schema``."""
        arguments = asdict(self)
        del arguments["dataset"]
        arguments["columns"] = list(self.columns)
        return arguments

    @classmethod
    def from_command(cls, command: StreamCommand, *, rank: int) -> StreamTicket:
        return cls(**asdict(command) | {"columns": command.columns}, rank=rank)


@dataclass(frozen=True)
class MetadataTicket:
    """``do_get`` ticket for a population's metadata table."""

    dataset: str
    population: str | None = None


def parse_ticket(raw: bytes) -> StreamTicket | MetadataTicket:
    fields = _Fields(_decode(raw, "ticket"), "ticket")
    if fields.boolean("metadata"):
        ticket: StreamTicket | MetadataTicket = MetadataTicket(
            dataset=_required(fields.string("dataset", required=True)),
            population=fields.string("population"),
        )
    else:
        command = StreamCommand._read(fields)
        ticket = StreamTicket(
            **asdict(command) | {"columns": command.columns},
            rank=_default(fields.integer("rank"), 0),
            offset=_default(fields.integer("offset"), 0),
        )
        if ticket.rank >= ticket.world_size:
            raise ProtocolError(
                f"'rank' must be < 'world_size' ({ticket.world_size}), got {ticket.rank}"
            )
    fields.finish()
    return ticket


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
    """The body of an action: ``{"dataset"?, "epoch_len"?}``."""

    dataset: str | None = None
    epoch_len: int | None = None
    keys: tuple[str, ...] = field(default=())

    @classmethod
    def parse(cls, raw: bytes, *, dataset: bool, epoch_len: bool) -> ActionBody:
        if not raw and not dataset:
            return cls()
        fields = _Fields(_decode(raw, "action body"), "action body")
        body = cls(
            dataset=fields.string("dataset", required=True) if dataset else None,
            epoch_len=fields.integer("epoch_len", required=True, minimum=1) if epoch_len else None,
        )
        fields.finish()
        return body


def _required(value: T | None) -> T:
    if value is None:  # pragma: no cover - `required=True` raised already
        raise ProtocolError("a required key is missing")
    return value


def _default(value: T | None, default: T) -> T:
    return default if value is None else value
