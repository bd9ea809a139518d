"""The library's exception classes for the errors a server sends.

A DatasetRT server names the class of `dataset_rt.errors` of each error it
sends (``flight_server/errors.py``): in the Flight error's ``extra_info`` for
the Flight statuses, and after the status in pyarrow's detail for
INVALID_ARGUMENT and NOT_FOUND, as ``{"class": "InvalidPopulationError", ...}``.
`server_error` turns the pyarrow exception a call raised into the class below of
that name: a subclass of both the library's class and the pyarrow class the
status arrives as, so ``except drt.InvalidPopulationError`` catches a refusal
from a server as it does in-process, and an ``except pa.ArrowInvalid`` written
for plain pyarrow keeps catching it. Its message is the server's own, one line:
pyarrow's "Detail: ..." and "gRPC client debug context: ..." tails are cut.

The classes are plain classes of this module (not made per call), so an error
pickles by reference: a DataLoader worker hands its exception to the trainer
that way. Multiple inheritance is safe here: pyarrow's exceptions are Python
classes over ``Exception`` (``KeyError`` and ``ValueError`` at most), so no two
bases of a class below have conflicting instance layouts, ``OSError`` included.
See docs/errors.md for what each class means and whether to retry.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

import pyarrow as pa
import pyarrow.flight as flight

import dataset_rt.errors as library


class DatasetRTError(library.DatasetRTError, flight.FlightServerError):  # type: ignore[misc]
    """`dataset_rt.DatasetRTError` sent as UNKNOWN (an Arrow error of the engine)."""


class CorruptCacheError(
    library.CorruptCacheError,
    flight.FlightInternalError,  # type: ignore[misc]
):
    """`dataset_rt.CorruptCacheError` sent as INTERNAL: the server's data is damaged."""


class CacheIOError(library.CacheIOError, flight.FlightInternalError):  # type: ignore[misc]
    """`dataset_rt.CacheIOError` sent as INTERNAL: the server's disk refused a read."""


class StorageFullError(
    library.StorageFullError,
    flight.FlightUnavailableError,  # type: ignore[misc]
):
    """`dataset_rt.StorageFullError` sent as UNAVAILABLE: the server's state volume is full."""


class StoreUnavailableError(
    library.StoreUnavailableError,
    flight.FlightUnavailableError,  # type: ignore[misc]
):
    """`dataset_rt.StoreUnavailableError` sent as UNAVAILABLE: the object store is down."""


class SchemaMismatchError(library.SchemaMismatchError, pa.ArrowInvalid):  # type: ignore[misc]
    """`dataset_rt.SchemaMismatchError` sent as INVALID_ARGUMENT."""


class InvalidPopulationError(
    library.InvalidPopulationError,
    pa.ArrowInvalid,  # type: ignore[misc]
):
    """`dataset_rt.InvalidPopulationError` sent as INVALID_ARGUMENT: a put's table was
    refused (``column``, ``row`` and ``count`` as the server set them)."""


class InvalidArgumentError(library.InvalidArgumentError, pa.ArrowInvalid):  # type: ignore[misc]
    """`dataset_rt.InvalidArgumentError` sent as INVALID_ARGUMENT: a request the server
    refuses (a malformed ticket, an unknown column, a put past a limit, ...)."""


class NotFoundError(library.NotFoundError, pa.ArrowKeyError):  # type: ignore[misc]
    """`dataset_rt.NotFoundError` sent as NOT_FOUND: an unknown dataset or population."""


class SourceError(library.SourceError, flight.FlightServerError):  # type: ignore[misc]
    """`dataset_rt.SourceError` sent as UNKNOWN."""


class InternalError(library.InternalError, flight.FlightInternalError):  # type: ignore[misc]
    """`dataset_rt.InternalError` sent as INTERNAL: something broke in the server's engine."""


class FencedError(library.FencedError, flight.FlightCancelledError):  # type: ignore[misc]
    """`dataset_rt.FencedError` sent as CANCELLED: the run was resumed elsewhere."""


#: The class of each name a server sends, by its library class's name.
CLASSES: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        DatasetRTError,
        CorruptCacheError,
        CacheIOError,
        StorageFullError,
        StoreUnavailableError,
        SchemaMismatchError,
        InvalidPopulationError,
        InvalidArgumentError,
        NotFoundError,
        SourceError,
        InternalError,
        FencedError,
    )
}

#: What pyarrow appends to a server's message: its detail (a server in Python
#: sends "Detail: Python exception: ..."), then, in some calls, the gRPC client's
#: debug context (the whole message again, and the client's own context).
_DEBUG_CONTEXT = re.compile(r"\.? ?gRPC client debug context:.*", flags=re.DOTALL)
_DETAIL = ". Detail: "
_PYTHON_DETAIL = ". Detail: Python exception: "


def server_message(error: BaseException) -> str:
    """The server's message of ``error``, without pyarrow's detail and debug context."""
    text = _DEBUG_CONTEXT.sub("", str(error))
    return text.split(_DETAIL, 1)[0]


def server_error(error: BaseException) -> BaseException:
    """The exception to raise for ``error``, which a pyarrow Flight call raised.

    When the server named a class of `dataset_rt.errors`, an instance of this
    module's class of that name (a subclass of the library's class and of
    ``type(error)``), with the server's message and, for the Flight statuses,
    ``extra_info``. Any other pyarrow error (a refused token, a server past its
    stream limits, a lost connection) is ``error`` itself with its message cut
    to the server's; anything else is ``error`` unchanged."""
    if not isinstance(error, flight.FlightError | pa.ArrowException) or isinstance(
        error, library.DatasetRTError
    ):
        return error
    error = cast(Exception, error)
    message = server_message(error)
    fields = _error_class(error)
    named = fields.pop("class", None)
    if not isinstance(named, str) or named not in CLASSES:
        if message != str(error):
            error.args = (message,)
        return error
    translated = _class_for(CLASSES[named], type(error))(message)
    translated.extra_info = getattr(error, "extra_info", b"")  # type: ignore[attr-defined]
    if isinstance(translated, library.InvalidPopulationError):
        for attribute in ("column", "row", "count"):
            setattr(translated, attribute, fields.get(attribute))
    return translated


def _error_class(error: BaseException) -> dict[str, Any]:
    """The ``{"class": NAME, ...}`` the server sent with ``error``, or {}."""
    extra = getattr(error, "extra_info", b"") or b""
    if extra:
        text = extra.decode("utf-8", "replace") if isinstance(extra, bytes) else str(extra)
    else:
        before_context = _DEBUG_CONTEXT.sub("", str(error))
        if _PYTHON_DETAIL not in before_context:
            return {}
        # "INVALID_ARGUMENT {...}" (the status, then the class).
        text = before_context.rpartition(_PYTHON_DETAIL)[2].partition(" ")[2]
    try:
        fields, _ = json.JSONDecoder().raw_decode(text.strip())
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


#: Classes made for a library class sent with another status than ``CLASSES``'.
_MADE: dict[tuple[str, type[BaseException]], type[Exception]] = {}


def _class_for(named: type[Exception], arrived: type[BaseException]) -> type[Exception]:
    """``named`` if it derives from the pyarrow class the error ``arrived`` as;
    else (a server that sends it with another status) a class of both, made
    once: it does not pickle, a rare cost that keeps both ``except`` clauses."""
    if issubclass(named, arrived):
        return named
    key = (named.__name__, arrived)
    if key not in _MADE:
        bases = (named.__mro__[1], arrived)  # the library's class, the pyarrow one
        _MADE[key] = type(named.__name__, bases, {"__module__": __name__})
    return _MADE[key]
