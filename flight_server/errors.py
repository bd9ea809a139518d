"""The one mapping from DatasetRT errors to Flight statuses.

pyarrow turns ``ArrowInvalid`` into INVALID_ARGUMENT and ``ArrowKeyError`` into
NOT_FOUND on the wire; the Flight error classes carry the other statuses.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight

import dataset_rt as drt


class ProtocolError(ValueError):
    """A command, ticket or action body that does not follow the protocol."""


def to_flight_error(error: Exception) -> Exception:
    """The exception a handler raises for ``error`` (the client sees its status)."""
    message = str(error)
    status: type[Exception]
    match error:
        case (
            ProtocolError()
            | drt.InvalidPopulationError()
            | drt.InvalidArgumentError()
            | drt.SchemaMismatchError()
        ):
            status = pa.ArrowInvalid  # INVALID_ARGUMENT
        case drt.NotFoundError():
            status = pa.ArrowKeyError  # NOT_FOUND
        case drt.CorruptCacheError() | drt.CacheIOError():
            status, message = flight.FlightInternalError, f"the server's data is damaged: {message}"
        case drt.InternalError():
            status = flight.FlightInternalError
        case _:
            status = flight.FlightServerError
    return status(message)
