"""`DatasetFlightServer`: the Flight RPC surface over a `Catalog`.

The per-batch path of ``do_get`` runs without Python: the native stream is
handed to pyarrow as a ``RecordBatchReader`` inside ``RecordBatchStream``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.flight as flight

from dataset_rt import _native
from flight_server.auth import BearerAuthFactory, TokenFile, require_admin
from flight_server.catalog import Catalog
from flight_server.errors import ProtocolError, to_flight_error
from flight_server.protocol import (
    ActionBody,
    MetadataTicket,
    PutCommand,
    StreamCommand,
    StreamTicket,
    parse_ticket,
)

log = logging.getLogger("flight_server")

F = TypeVar("F", bound=Callable[..., Any])

ACTIONS = {
    "set_epoch_len": 'set the active epoch length: {"dataset", "epoch_len"} (admin)',
    "list_populations": 'the stored populations and the active one: {"dataset"}',
    "health": "liveness and the datasets served",
    "stats": "per dataset: rows, populations, streams served, rows and bytes sent",
}


def _flight_errors(handler: F) -> F:
    """Translate DatasetRT and protocol errors into Flight statuses (one place)."""

    @functools.wraps(handler)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        except (flight.FlightError, pa.ArrowException):
            raise
        except Exception as error:
            log.info("%s rejected: %s", handler.__name__, error)
            raise to_flight_error(error) from None

    return wrapped  # type: ignore[return-value]


class DatasetFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serves the datasets of ``catalog`` at ``location`` (``grpc://host:port``)."""

    def __init__(
        self,
        catalog: Catalog,
        location: str = "grpc://127.0.0.1:8815",
        *,
        tokens: TokenFile | None = None,
        tls_certificates: list[tuple[bytes, bytes]] | None = None,
        advertise: list[str] | None = None,
        batch_size: int = 1024,
        prefetch_size: int = 256,
    ) -> None:
        middleware = {"auth": BearerAuthFactory(tokens)} if tokens else None
        super().__init__(location, tls_certificates=tls_certificates or [], middleware=middleware)
        parts = urlsplit(location)
        self.location = f"{parts.scheme}://{parts.hostname}:{self.port}"
        if advertise:
            self.locations = list(advertise)
        elif parts.hostname in ("0.0.0.0", "::"):
            # A wildcard address is not reachable: advertise no location, which
            # in Flight means "the server you asked" (clients reuse their connection).
            self.locations = []
        else:
            self.locations = [self.location]
        self._catalog = catalog
        self._batch_size = batch_size
        self._prefetch_size = prefetch_size

    # -- discovery --------------------------------------------------------------

    @_flight_errors
    def list_flights(self, context: Any, criteria: bytes) -> list[flight.FlightInfo]:
        # A list, not a generator: errors must be raised inside the error mapping.
        return [self._dataset_info(name) for name in self._catalog.names()]

    @_flight_errors
    def get_flight_info(
        self, context: Any, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            if len(descriptor.path) != 1:
                raise ProtocolError("a path descriptor names one dataset: [NAME]")
            return self._dataset_info(descriptor.path[0].decode())
        command = self._resolve(StreamCommand.parse(descriptor.command))
        schema = self._schema(command)
        epoch_len = command.epoch_len or 0
        endpoints = [
            flight.FlightEndpoint(
                StreamTicket.from_command(command, rank=rank).encode(), self.locations
            )
            for rank in range(command.world_size)
        ]
        return flight.FlightInfo(schema, descriptor, endpoints, epoch_len, -1)

    def _dataset_info(self, name: str) -> flight.FlightInfo:
        service = self._catalog.get(name)
        active = service.active()
        command = StreamCommand(
            dataset=name,
            seed=0,
            epoch=0,
            population=active["population"],
            epoch_len=active["epoch_len"],
        )
        metadata_ticket = json.dumps({"dataset": name, "metadata": True}).encode()
        return flight.FlightInfo(
            self._schema(command),
            flight.FlightDescriptor.for_path(name),
            [flight.FlightEndpoint(metadata_ticket, self.locations)],
            active["rows"],
            -1,
        )

    def _resolve(self, command: StreamCommand) -> StreamCommand:
        """Pin the population and epoch length so that a ticket is self-contained."""
        if command.population is not None and command.epoch_len is not None:
            return command
        active = self._catalog.get(command.dataset).active()
        return replace(
            command,
            population=command.population or active["population"],
            epoch_len=command.epoch_len or active["epoch_len"],
        )

    def _native_stream(self, ticket: StreamTicket) -> _native.BatchStream:
        service = self._catalog.get(ticket.dataset)
        stream: _native.BatchStream = service.stream(
            **ticket.stream_arguments(),
            batch_size=self._batch_size,
            prefetch_size=self._prefetch_size,
        )
        return stream

    def _schema(self, command: StreamCommand) -> pa.Schema:
        """The stream schema, checking on the way that the request can be served."""
        ticket = StreamTicket.from_command(command, rank=0)
        service = self._catalog.get(ticket.dataset)
        empty = service.schema(**ticket.stream_arguments())
        return pa.table(empty).schema

    # -- data -------------------------------------------------------------------

    @_flight_errors
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        parsed = parse_ticket(ticket.ticket)
        if isinstance(parsed, MetadataTicket):
            service = self._catalog.get(parsed.dataset)
            return flight.RecordBatchStream(pa.table(service.metadata(parsed.population)))
        resolved = self._resolve(
            StreamCommand(**{k: getattr(parsed, k) for k in StreamCommand.__dataclass_fields__})
        )
        parsed = replace(parsed, population=resolved.population, epoch_len=resolved.epoch_len)
        reader = pa.RecordBatchReader.from_stream(self._native_stream(parsed))
        return flight.RecordBatchStream(reader)

    @_flight_errors
    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        require_admin(context, "do_put")
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise ProtocolError('do_put needs a command descriptor: {"dataset", "activate"?}')
        command = PutCommand.parse(descriptor.command)
        service = self._catalog.get(command.dataset)
        table = reader.read_all()
        population, rows = service.put(table, command.activate)
        epoch_len = service.active()["epoch_len"] if command.activate else rows
        log.info("%s: stored population %s (%d rows)", command.dataset, population, rows)
        answer = {"population": population, "rows": rows, "epoch_len": epoch_len}
        writer.write(pa.py_buffer(json.dumps(answer).encode()))

    # -- actions ----------------------------------------------------------------

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    @_flight_errors
    def do_action(self, context: Any, action: flight.Action) -> list[bytes]:
        # A list, not a generator: errors must be raised inside the error mapping.
        body = action.body.to_pybytes() if action.body is not None else b""
        match action.type:
            case "set_epoch_len":
                require_admin(context, "set_epoch_len")
                parsed = ActionBody.parse(body, dataset=True, epoch_len=True)
                service = self._catalog.require(parsed.dataset)
                epoch_len = service.set_epoch_len(parsed.epoch_len or 0)
                answer: Any = {"dataset": parsed.dataset, "epoch_len": epoch_len}
            case "list_populations":
                parsed = ActionBody.parse(body, dataset=True, epoch_len=False)
                service = self._catalog.require(parsed.dataset)
                answer = {
                    "dataset": parsed.dataset,
                    "active": service.active(),
                    "populations": service.populations(),
                }
            case "health":
                answer = {"status": "ok", "datasets": self._catalog.names()}
            case "stats":
                answer = {}
                for name in self._catalog.names():
                    service = self._catalog.get(name)
                    answer[name] = {
                        "rows": service.active()["rows"],
                        "populations": len(service.populations()),
                        **service.stats(),
                    }
            case other:
                raise ProtocolError(f"unknown action {other!r}; the actions are {sorted(ACTIONS)}")
        return [json.dumps(answer).encode()]
