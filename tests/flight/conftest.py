"""Shared fixtures and helpers for the Flight suites.

Every server runs in-process on ``grpc://127.0.0.1:0`` inside ``with serve(...)``.
The dataset ``toy`` is two small caches (``alpha``: 200 records, ``beta``: 100
records) with varied payload sizes and the metadata columns of ``make_records``
(label, score, flag, name). Other suites in this folder import the helpers:

    from .conftest import make_catalog, serve

``make_catalog(tmp_path, runtime)`` is idempotent per ``tmp_path``: the caches are
reused and the population store lives in ``tmp_path / "state"``, so building a
second catalog over the same ``tmp_path`` is a server restart.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records, payload

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

DATASET = "toy"
LOOPBACK = "grpc://127.0.0.1:0"
ROWS_A = 200
ROWS_B = 100
ROWS = ROWS_A + ROWS_B
STORED_COLUMNS = ("label", "score", "flag", "name")
STREAM_COLUMNS = ("position", "cache_id", "sample_id", "payload")
SHUTDOWN_TIMEOUT = 30.0


# -- caches and catalogs ----------------------------------------------------------


def payload_size(index: int) -> int:
    """Varied payload sizes, 1 byte to ~3 KiB."""
    return 1 + (index * 773) % 3000


def varied_records(n: int, seed: int) -> list[drt.CacheInput]:
    """``make_records`` metadata with payloads of varied sizes."""
    return [
        drt.CacheInput(data=payload(i, payload_size(i), seed), metadata=record.metadata)
        for i, record in enumerate(make_records(n, seed=seed))
    ]


def build_caches(base_dir: Path, runtime: drt.DatasetRuntime) -> tuple[Path, Path]:
    """The two caches of ``toy`` under ``base_dir / "caches"`` (reused when present)."""
    root = base_dir / "caches"
    config = drt.WriterConfig(show_progress=False)
    paths = []
    for name, rows, seed in (("alpha", ROWS_A, 1), ("beta", ROWS_B, 2)):
        source = ListSource(name, varied_records(rows, seed=seed))
        (result,) = runtime.write_cache(source, root, writer_config=config)
        assert isinstance(result, drt.CacheWriteSuccess), result
        paths.append(result.path)
    return paths[0], paths[1]


def make_catalog(
    tmp_path: Path,
    runtime: drt.DatasetRuntime,
    name: str = DATASET,
    *,
    caches: tuple[Path, ...] | None = None,
) -> Catalog:
    """A catalog serving dataset ``name``, its population store in ``tmp_path / "state"``.

    The caches are built under ``tmp_path`` unless ``caches`` names existing ones
    (e.g. the session's read-only ``toy_caches``).
    """
    if caches is None:
        caches = build_caches(tmp_path, runtime)
    return Catalog([DatasetSpec(name, tuple(caches))], tmp_path / "state", runtime)


@contextmanager
def serve(
    catalog: Catalog,
    location: str = LOOPBACK,
    *,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
    **kwargs: Any,
) -> Iterator[DatasetFlightServer]:
    """A running `DatasetFlightServer` (port 0 by default); shut down on exit.

    The shutdown waits for in-flight calls; it runs on a helper thread so that a
    stuck stream fails the test after ``shutdown_timeout`` seconds instead of
    hanging it.
    """
    with DatasetFlightServer(catalog, location, **kwargs) as server:
        try:
            yield server
        finally:
            stopper = threading.Thread(target=server.__exit__, args=(None, None, None), daemon=True)
            stopper.start()
            stopper.join(shutdown_timeout)
            if stopper.is_alive():
                raise AssertionError(
                    f"the Flight server did not shut down within {shutdown_timeout} s: "
                    "a call is still in flight"
                )


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def toy_caches(
    tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime
) -> tuple[Path, Path]:
    """The two caches of ``toy``, built once per session (caches are immutable)."""
    return build_caches(tmp_path_factory.mktemp("toy"), runtime)


@pytest.fixture
def catalog(tmp_path: Path, runtime: drt.DatasetRuntime, toy_caches: tuple[Path, Path]) -> Catalog:
    """``toy`` over the session's caches with a fresh population store in ``tmp_path``."""
    return make_catalog(tmp_path, runtime, caches=toy_caches)


@pytest.fixture
def server(catalog: Catalog) -> Iterator[DatasetFlightServer]:
    with serve(catalog) as running:
        yield running


@pytest.fixture
def client(server: DatasetFlightServer) -> Iterator[DatasetClient]:
    with DatasetClient(server.location) as friendly:
        yield friendly


@pytest.fixture
def raw(server: DatasetFlightServer) -> Iterator[flight.FlightClient]:
    """A plain ``pyarrow.flight`` client (no helper package)."""
    with flight.connect(server.location) as plain:
        yield plain


# -- plain-Flight helpers ---------------------------------------------------------


def encode(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def command(body: Any) -> flight.FlightDescriptor:
    """A command descriptor of a JSON object (or raw bytes)."""
    return flight.FlightDescriptor.for_command(encode(body))


def ticket(body: Any) -> flight.Ticket:
    """A hand-written ticket of a JSON object (or raw bytes)."""
    return flight.Ticket(encode(body))


def stream(raw: flight.FlightClient, body: Any) -> pa.Table:
    """Read a whole hand-written ticket."""
    return raw.do_get(ticket(body)).read_all()


def act(raw: flight.FlightClient, kind: str, body: Any = None) -> Any:
    """Run an action and decode its one JSON answer."""
    results = list(raw.do_action(flight.Action(kind, b"" if body is None else encode(body))))
    assert len(results) == 1, results
    return json.loads(results[0].body.to_pybytes())


def active(raw: flight.FlightClient, dataset: str = DATASET) -> dict[str, Any]:
    """``{"population", "epoch_len", "rows"}`` of the active population."""
    answer = act(raw, "list_populations", {"dataset": dataset})
    return dict(answer["active"])


def populations(raw: flight.FlightClient, dataset: str = DATASET) -> list[str]:
    return list(act(raw, "list_populations", {"dataset": dataset})["populations"])


def put(
    raw: flight.FlightClient,
    table: Any,
    *,
    dataset: str = DATASET,
    activate: bool | None = None,
    body: Any = None,
) -> dict[str, Any]:
    """``do_put`` a table (any Arrow stream exporter) and decode the JSON answer."""
    arrow = pa.table(table)
    if body is None:
        body = {"dataset": dataset} | ({} if activate is None else {"activate": activate})
    descriptor = body if isinstance(body, flight.FlightDescriptor) else command(body)
    writer, reader = raw.do_put(descriptor, arrow.schema)
    try:
        writer.write_table(arrow)
        writer.done_writing()
        answer = reader.read()
    finally:
        writer.close()
    assert answer is not None, "do_put answered no PutResult"
    return dict(json.loads(answer.to_pybytes()))


def metadata(raw: flight.FlightClient, population: str | None = None) -> pl.DataFrame:
    """A population's metadata table through a hand-written metadata ticket."""
    body: dict[str, Any] = {"dataset": DATASET, "metadata": True}
    if population is not None:
        body["population"] = population
    return pl.DataFrame(stream(raw, body))


def ids(table: pa.Table | pa.RecordBatch) -> list[tuple[int, int]]:
    """The ``(cache_id, sample_id)`` sequence of a stream (or metadata) table."""
    return list(
        zip(
            table.column("cache_id").to_pylist(),
            table.column("sample_id").to_pylist(),
            strict=True,
        )
    )


def message(error: BaseException) -> str:
    """The server's message without pyarrow's appended traceback and gRPC context."""
    return str(error).split(". Detail:")[0].split(". gRPC client debug context")[0]


def reweighted(table: pl.DataFrame) -> pl.DataFrame:
    """A typical edit: drop label 0, triple label 2's weight, duplicate every 7th row."""
    kept = table.filter(pl.col("label") != 0).with_columns(
        pl.when(pl.col("label") == 2)
        .then(pl.col("weight") * 3.0)
        .otherwise(pl.col("weight"))
        .alias("weight")
    )
    return pl.concat([kept, kept.gather_every(7)])
