"""Hostile inputs get a clean status and a message without the server's insides
(issue 10): inputs that got UNKNOWN once, and bad requests on every RPC whose
answers carried tracebacks and the state directory.

After every test the server answers and the active population is the one it
started with.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flight_server import Catalog, DatasetFlightServer
from flight_server.auth import TokenFile

from .conftest import DATASET, act, active, command, message, populations, serve, ticket

VALID = {"dataset": DATASET, "seed": 7, "epoch": 0, "epoch_len": 20}


def raw_json(value: Any) -> bytes:
    """JSON as a hostile client writes it (lone surrogates kept, as escapes)."""
    return json.dumps(value).encode()


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


HUGE_INTEGER = b'{"dataset": "toy", "seed": ' + b"9" * 5000 + b', "epoch": 0}'
HUGE_BODY = b'{"dataset": "toy", "epoch_len": ' + b"9" * 5000 + b"}"

#: Request bodies that once got UNKNOWN (or worse): each is INVALID_ARGUMENT on
#: every surface that parses it.
HOSTILE = {
    "an integer of 5000 digits": HUGE_INTEGER,
    "an integer of 5000 digits in a body": HUGE_BODY,
    "JSON nested 30000 deep": deep(30_000),
    "a lone surrogate": raw_json(VALID | {"dataset": "\ud800"}),
    "a lone surrogate in a body": raw_json({"dataset": "\ud800", "epoch_len": 5}),
    "a lone surrogate as a key": raw_json({"dataset": DATASET, "\ud800": 1}),
    "invalid UTF-8": b'{"dataset": "\xff\xfe"}',
    "epoch_len 2^64": raw_json(VALID | {"epoch_len": 2**64}),
    "an empty body": b"",
}


@pytest.fixture
def target(server: DatasetFlightServer) -> Iterator[flight.FlightClient]:
    """A client; afterwards the server answers and nothing changed."""
    with flight.connect(server.location) as client:
        before = (active(client), populations(client))
        yield client
        assert act(client, "health")["status"] == "ok"
        assert (active(client), populations(client)) == before


def put_command(client: flight.FlightClient, body: bytes, table: pa.Table | None = None) -> None:
    table = pa.table({"cache_id": pa.array([1], pa.uint64())}) if table is None else table
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(body), table.schema)
    try:
        writer.write_table(table)
        writer.done_writing()
        reader.read()
    finally:
        writer.close()


def surfaces(client: flight.FlightClient, body: bytes) -> dict[str, Callable[[], Any]]:
    """Every call that parses ``body``: as a command, a ticket, action bodies, a put."""
    return {
        "get_flight_info": lambda: client.get_flight_info(
            flight.FlightDescriptor.for_command(body)
        ),
        "do_get": lambda: client.do_get(flight.Ticket(body)).read_chunk(),
        "list_populations": lambda: list(client.do_action(flight.Action("list_populations", body))),
        "set_epoch_len": lambda: list(client.do_action(flight.Action("set_epoch_len", body))),
        "do_put": lambda: put_command(client, body),
    }


@pytest.mark.parametrize("body", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_inputs_are_invalid_argument(target: flight.FlightClient, body: bytes) -> None:
    for surface, call in surfaces(target, body).items():
        with pytest.raises(pa.ArrowInvalid) as error:
            call()
        assert message(error.value), surface
        assert_clean(str(error.value), f"{surface} of {body[:40]!r}")


def test_a_put_with_no_columns_is_invalid_argument(target: flight.FlightClient) -> None:
    with pytest.raises(pa.ArrowInvalid, match="no columns"):
        put_command(target, raw_json({"dataset": DATASET}), pa.table({}))


@pytest.mark.parametrize("epoch_len", [2**63 - 1, 2**63, 2**64 - 1])
def test_epochs_longer_than_an_int64_report_unknown_total_records(
    target: flight.FlightClient, epoch_len: int
) -> None:
    """FlightInfo.total_records is an int64: -1 (unknown) past 2^63 - 1."""
    info = target.get_flight_info(command(VALID | {"epoch_len": epoch_len}))
    assert info.total_records == (epoch_len if epoch_len < 2**63 else -1)
    (endpoint,) = info.endpoints
    assert json.loads(endpoint.ticket.ticket)["epoch_len"] == epoch_len
    # The stream itself is served (its first batch; it is ~forever long).
    assert target.do_get(endpoint.ticket).read_chunk().data.num_rows > 0


def test_a_very_long_action_type_gets_a_short_message(target: flight.FlightClient) -> None:
    """The message names the action, cut: gRPC refuses trailers over 16 KiB."""
    with pytest.raises(pa.ArrowInvalid, match="unknown action") as error:
        list(target.do_action(flight.Action("x" * 100_000, b"")))
    assert len(str(error.value)) < 10_000


# -- nothing of the server's insides -----------------------------------------------

TOKEN = "admin-token-0123456789abcdef"


@pytest.fixture
def secured(catalog: Catalog) -> Iterator[DatasetFlightServer]:
    with serve(catalog, tokens=TokenFile(((TOKEN, "admin"),))) as running:
        yield running


ADMIN = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
MISSING_POPULATION = "0" * 32


def bad_requests(client: flight.FlightClient) -> dict[str, Callable[[], Any]]:
    """A representative bad request of every kind, on every RPC."""
    o = ADMIN

    def get(body: Any) -> Callable[[], Any]:
        return lambda: client.do_get(ticket(body), options=o).read_all()

    def info(body: Any) -> Callable[[], Any]:
        return lambda: client.get_flight_info(command(body), options=o)

    def action(kind: str, body: Any) -> Callable[[], Any]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return lambda: list(client.do_action(flight.Action(kind, raw), options=o))

    def put_table(table: pa.Table, body: Any = None) -> Callable[[], Any]:
        descriptor = command(body or {"dataset": DATASET})

        def call() -> None:
            writer, reader = client.do_put(descriptor, table.schema, options=o)
            try:
                writer.write_table(table)
                writer.done_writing()
                reader.read()
            finally:
                writer.close()

        return call

    population = VALID | {"population": MISSING_POPULATION}
    ids = pa.table({"cache_id": pa.array([1], pa.uint64()), "sample_id": pa.array([1])})
    return {
        "do_get: malformed ticket": get(b"{"),
        "do_get: unknown dataset": get(VALID | {"dataset": "nope"}),
        "do_get: missing population": get(population),
        "do_get: missing population metadata": get(
            {"dataset": DATASET, "metadata": True, "population": MISSING_POPULATION}
        ),
        "do_get: unknown column": get(VALID | {"columns": ["nope"]}),
        "do_get: rank beyond world_size": get(VALID | {"world_size": 2, "rank": 2}),
        "get_flight_info: unknown key": info(VALID | {"nope": 1}),
        "get_flight_info: missing population": info(population),
        "get_flight_info: unknown dataset path": lambda: client.get_flight_info(
            flight.FlightDescriptor.for_path("nope"), options=o
        ),
        "get_flight_info: world_size": info(VALID | {"world_size": 10**6}),
        "do_action: unknown action": action("nope", b""),
        "do_action: bad body": action("list_populations", b"[1]"),
        "do_action: unknown dataset": action("set_epoch_len", {"dataset": "x", "epoch_len": 1}),
        "do_action: epoch_len 0": action("set_epoch_len", {"dataset": DATASET, "epoch_len": 0}),
        "do_put: bad command": put_table(ids, b"{"),
        "do_put: unknown dataset": put_table(ids, {"dataset": "nope"}),
        "do_put: missing columns": put_table(ids),
        "do_put: no columns": put_table(pa.table({})),
        "list_flights: without a token": lambda: list(client.list_flights()),
    }


def assert_clean(text: str, what: str, private: tuple[str, ...] = ()) -> None:
    for insider in ("Traceback", 'File "', ".py", *private):
        assert insider not in text, f"{what}: {insider!r} in {text!r}"


def test_no_answer_carries_tracebacks_or_the_servers_paths(
    secured: DatasetFlightServer,
    catalog: Catalog,
    tmp_path: Path,
    toy_caches: tuple[Path, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="flight_server")
    private = (str(tmp_path), *(str(cache) for cache in toy_caches), "/tmp/")
    with flight.connect(secured.location) as client:
        for what, call in bad_requests(client).items():
            with pytest.raises(pa.ArrowException) as error:
                call()
            assert_clean(str(error.value), what, private)
            assert message(error.value), what
    # The operator's log has the requests and what was wrong with them.
    assert "unknown dataset 'nope'" in caplog.text
    assert str(tmp_path) in caplog.text


def test_a_bug_reaches_the_client_as_a_short_message_and_the_log_in_full(
    server: DatasetFlightServer,
    raw: flight.FlightClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = server.catalog.get(DATASET)

    class Broken:
        def __getattr__(self, name: str) -> Any:
            return getattr(service, name)

        def pin(self, request: Any) -> Any:
            raise RuntimeError("boom in /srv/secret/flight_server/server.py")

    monkeypatch.setattr(server.catalog, "get", lambda name: Broken())
    caplog.set_level(logging.INFO, logger="flight_server")
    with pytest.raises(flight.FlightServerError) as error:
        raw.get_flight_info(command(VALID))
    assert_clean(str(error.value), "a bug", ("/srv/secret", "boom"))
    assert "RuntimeError" in message(error.value)
    assert "boom in /srv/secret" in caplog.text
    assert "Traceback" in caplog.text
