"""The one mapping from errors to the Flight statuses a client sees.

pyarrow turns ``ArrowInvalid`` into INVALID_ARGUMENT and ``ArrowKeyError`` into
NOT_FOUND on the wire; the Flight error classes carry the other statuses.

A client sees the message and the status, nothing of the server's insides:

- in every message, INTERNAL ones included, the paths of the state directory
  and the caches are replaced by names, and any other absolute path by
  ``<path>`` (`Redactor`); every message is cut to
  `MAX_MESSAGE_CHARS` (gRPC refuses larger trailers) and made valid UTF-8 (a
  lone surrogate from a request would not encode);
- pyarrow sends any non-Flight exception of a handler with its formatted
  traceback ("Detail: Python exception: Traceback ... File ..."; the traceback
  always has pyarrow's own ``_flight.pyx`` frame at least), and it has no other
  way to send INVALID_ARGUMENT or NOT_FOUND. So those two are raised as
  `InvalidArgument` and `NotFound`, and `hide_tracebacks` makes
  ``traceback.format_exception`` (which pyarrow calls for that detail) answer
  just the status name and the error's class for them. Every other exception formats as before, and
  the server's log keeps the whole error.

A client also learns which class of `dataset_rt.errors` an error is
(`error_class`), so that `flight_client` raises the library's own classes: a
JSON object ``{"class": "InvalidPopulationError", ...}`` (with ``column``,
``row`` and ``count`` when the error has them) goes in the Flight error's
``extra_info`` for the Flight statuses, and after the status in the detail of
INVALID_ARGUMENT and NOT_FOUND, which carry no ``extra_info`` in pyarrow
(``"<message>. Detail: Python exception: INVALID_ARGUMENT {"class": ...}"``).
Every INVALID_ARGUMENT and NOT_FOUND names a class (a malformed request is an
`InvalidArgumentError`); a bug, a stream limit or an auth refusal names none.
"""

from __future__ import annotations

import functools
import json
import re
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.flight as flight

import dataset_rt as drt

#: Messages longer than this are cut (gRPC drops trailers over 16 KiB).
MAX_MESSAGE_CHARS = 2000
#: An error's class for the client (`error_class`) longer than this is sent
#: without its fields.
MAX_CLASS_CHARS = 500


class ProtocolError(ValueError):
    """A command, ticket or action body that does not follow the protocol."""


class ClientError:
    """Mixin of the exceptions a handler raises for the client's mistakes."""

    status = "UNKNOWN"
    #: The error's class for the client (`error_class`), JSON; "" for none.
    error_class = ""

    @property
    def detail(self) -> str:
        """What pyarrow sends after "Detail: Python exception: "."""
        return f"{self.status} {self.error_class}" if self.error_class else self.status


class InvalidArgument(ClientError, pa.ArrowInvalid):  # type: ignore[misc]
    """Sent as INVALID_ARGUMENT, without the server's traceback."""

    status = "INVALID_ARGUMENT"


class NotFound(ClientError, pa.ArrowKeyError):  # type: ignore[misc]
    """Sent as NOT_FOUND, without the server's traceback."""

    status = "NOT_FOUND"


class Redactor:
    """Replaces the server's own paths in messages by names (``<state>``, ...),
    and any other absolute path by ``<path>``.

    A path is replaced where it stands as a path, not where its text is part of
    a word or of a longer path: a state directory given as ``state`` (relative,
    one part) is named in ``state/runs/x.json``, never in the words "cannot
    save its state" (a one-part relative path is replaced only where a path goes
    on from it). One pass over the message: what follows a name
    (``<state>/runs/x.json``) is not taken for another path.
    """

    def __init__(self, names: Mapping[Path, str] | None = None) -> None:
        pairs: dict[str, str] = {}
        for path, name in (names or {}).items():
            for form in (str(path), str(path.absolute()), str(path.resolve())):
                if form not in ("", "."):
                    pairs.setdefault(form, name)
        # Longest first, so that a cache inside the state directory keeps its name.
        ordered = sorted(pairs.items(), key=lambda pair: -len(pair[0]))
        self._names = [name for _, name in ordered]
        alternatives = [f"(?P<n{i}>{_path_pattern(text)})" for i, (text, _) in enumerate(ordered)]
        self._pattern = re.compile("|".join([*alternatives, f"(?P<other>{_ABSOLUTE_PATH})"]))

    def __call__(self, message: str) -> str:
        return self._pattern.sub(self._name_of, message)

    def _name_of(self, match: re.Match[str]) -> str:
        group = match.lastgroup
        if group is None or group == "other":
            # Any other absolute path (a temporary file, a system file) is the
            # server's business too.
            return "<path>"
        return self._names[int(group[1:])]


def _path_pattern(text: str) -> str:
    """Where ``text`` (a path) stands as a path in a message: not inside a word
    or a longer path, and, for a one-part relative path (a bare word), only
    with a path going on from it."""
    bare_word = not text.startswith("/") and "/" not in text.rstrip("/")
    return _PATH_START + re.escape(text) + ("(?=/)" if bare_word else _PATH_END)


#: Before a path: not a path character (a path inside a longer one is not it).
_PATH_START = r"(?<![\w.@+/-])"
#: After a path: its end (a sentence's full stop included), or a separator and
#: more of it.
_PATH_END = r"(?![\w@+-]|\.[\w.@+-])"
#: An absolute path of two or more parts, not inside a word or URL.
_ABSOLUTE_PATH = r"(?<![\w:/<.])/(?:[\w.@+-]+/)+[\w.@+-]*"


#: What a client is told when the server's volume is full (the error's own
#: message names a server path).
STORAGE_FULL = (
    "the server's state volume is full, so it cannot store what this call needs; retry on "
    "another replica, or once the server's operator has freed space"
)


def to_flight_error(
    error: Exception, redact: Callable[[str], str] | None = None, *, dataset: str | None = None
) -> Exception:
    """The exception a handler raises for ``error`` (the client sees its status).

    ``redact`` replaces the server's paths by names in every message (a damaged
    file is named by its cache and file name: the server's log has the path);
    ``dataset``, the dataset the call was about, is named in damage messages."""
    if isinstance(error, flight.FlightError):
        return cast(Exception, error)  # already a status
    message = (redact or Redactor())(str(error))
    status: type[Exception]
    match error:
        case (
            ProtocolError()
            | drt.InvalidPopulationError()
            | drt.InvalidArgumentError()
            | drt.SchemaMismatchError()
            | pa.ArrowInvalid()
        ):
            status = InvalidArgument
        case drt.NotFoundError() | pa.ArrowKeyError():
            status = NotFound
        case drt.StorageFullError():
            # Not damage and not the client's fault: another replica may have room.
            status, message = flight.FlightUnavailableError, STORAGE_FULL
        case drt.StoreUnavailableError():
            # The object store is down or unreachable: retry later or elsewhere.
            status = flight.FlightUnavailableError
        case drt.CorruptCacheError() | drt.CacheIOError():
            where = f" (dataset {dataset!r})" if dataset else ""
            status = flight.FlightInternalError
            message = f"the server's data is damaged{where}: {message}"
        case drt.InternalError():
            status = flight.FlightInternalError
        case drt.FencedError():
            # The run was resumed elsewhere: this loader must stop, never retry.
            status = flight.FlightCancelledError
        case drt.DatasetRTError():
            status = flight.FlightServerError
        case _:
            # A bug: its message may hold anything; the server's log has it all.
            status = flight.FlightServerError
            message = (
                f"the server failed to answer ({type(error).__name__}); its log has the details"
            )
    kind = error_class(error)
    if issubclass(status, flight.FlightError):
        return status(_sendable(message), kind.encode())
    refused = status(_sendable(message))
    cast(ClientError, refused).error_class = kind
    return refused


def error_class(error: Exception) -> str:
    """The class of `dataset_rt.errors` that ``error`` is for a client, as JSON
    (``{"class": NAME}``, with ``column``, ``row`` and ``count`` when set), or
    "" when it is none of them (a bug).

    A malformed request (`ProtocolError`, or Arrow's own refusal of what the
    client sent) is an `InvalidArgumentError`, and Arrow's missing key a
    `NotFoundError`: each INVALID_ARGUMENT and NOT_FOUND names a class."""
    fields: dict[str, object] = {}
    match error:
        case drt.DatasetRTError():
            # The exported class itself (the extension creates no subclasses of
            # its own, but a subclass of one would be sent as that one).
            name = next(
                c.__name__ for c in type(error).__mro__ if c.__module__ == drt.errors.__name__
            )
            for attribute in ("column", "row", "count"):
                if getattr(error, attribute, None) is not None:
                    fields[attribute] = getattr(error, attribute)
        case ProtocolError() | pa.ArrowInvalid():
            name = "InvalidArgumentError"
        case pa.ArrowKeyError():
            name = "NotFoundError"
        case _:
            return ""
    kind = json.dumps({"class": name, **fields})
    # A column's name comes from the client: the class is what matters.
    return kind if len(kind) <= MAX_CLASS_CHARS else json.dumps({"class": name})


def _sendable(message: str) -> str:
    """At most `MAX_MESSAGE_CHARS` characters of valid UTF-8."""
    if len(message) > MAX_MESSAGE_CHARS:
        cut = len(message) - MAX_MESSAGE_CHARS
        message = f"{message[:MAX_MESSAGE_CHARS]}... ({cut} more characters)"
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def hide_tracebacks() -> None:
    """Make pyarrow send `ClientError`s without the server's traceback (idempotent).

    pyarrow formats the detail of a Python exception with
    ``traceback.format_exception(type, value, tb)``; for a `ClientError` this
    answers its status name and class instead, so the client reads
    ``"<message>. Detail: Python exception: INVALID_ARGUMENT {"class": ...}"``.
    """
    original = traceback.format_exception
    if getattr(original, "hides_client_errors", False):
        return

    @functools.wraps(original)
    def format_exception(exc: Any, /, *args: Any, **kwargs: Any) -> list[str]:
        value = args[0] if args else kwargs.get("value", exc)
        if isinstance(value, ClientError):
            return [value.detail]
        return original(exc, *args, **kwargs)

    format_exception.hides_client_errors = True  # type: ignore[attr-defined]
    traceback.format_exception = format_exception
