"""Populations as Polars LazyFrames over Flight: `DatasetClient.scan_metadata`
is `get_metadata`, batch by batch; a LazyFrame or a Parquet path put with
`update_metadata` / `put` is the eager table's population, refused alike, sent
batch by batch (the client's peak memory stays far below the table's size), and
one failing midway stores nothing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import many_batches, raising_on_batch

from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer

from .conftest import DATASET, ROWS, message, reweighted, serve


def balanced(frame: Any) -> Any:
    """The seed's reweighting (shared/examples/balance.py), on a frame or a LazyFrame."""
    return frame.with_columns((1.0 / pl.len().over("label")).alias("weight"))


def annotated(frame: Any) -> Any:
    """Duplicated rows and extra columns."""
    return reweighted(frame).with_columns(
        (pl.col("score") + 1).alias("extra"), pl.col("name").str.len_chars().alias("length")
    )


def state(client: DatasetClient) -> dict[str, Any]:
    return client.populations(DATASET)


# -- scanning ---------------------------------------------------------------------


def test_scan_equals_get_before_and_after_an_update(client: DatasetClient) -> None:
    assert client.scan_metadata(DATASET).collect().equals(client.get_metadata(DATASET))
    first = state(client)["active"]["population"]
    population = client.update_metadata(DATASET, annotated(client.get_metadata(DATASET)))
    eager = client.get_metadata(DATASET)
    scan = client.scan_metadata(DATASET)
    assert scan.collect_schema() == eager.schema
    assert scan.collect().equals(eager)
    assert eager.columns[-2:] == ["extra", "length"]
    assert client.scan_metadata(DATASET, population).collect().equals(eager)
    older = client.scan_metadata(DATASET, first).collect()
    assert older.equals(client.get_metadata(DATASET, first))
    assert older.height == ROWS


def test_every_request_of_a_scan_ends_ok(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    """A scan asks the metadata's schema with ``get_schema``, opening no stream
    only to cancel it: every request of a scan read to its end is OK in the
    server's log (CANCELLED is a fenced run's status, docs/flight-protocol.md)."""
    with (
        caplog.at_level(logging.INFO, logger="flight_server.requests"),
        serve(catalog) as server,
        DatasetClient(server.location) as client,
    ):
        scan = client.scan_metadata(DATASET)
        assert scan.collect().height == ROWS
        assert scan.filter(pl.col("label") == 1).select("name").collect().height > 0
    # The server has shut down: every stream it served has ended and logged.
    lines = [r.request for r in caplog.records]  # type: ignore[attr-defined]
    assert [line["method"] for line in lines].count("do_get") == 2, lines
    assert "get_schema" in [line["method"] for line in lines]
    assert {line["status"] for line in lines} == {"OK"}, lines


def test_a_scan_reads_the_population_active_when_it_was_made(client: DatasetClient) -> None:
    before = client.get_metadata(DATASET)
    scan = client.scan_metadata(DATASET)
    client.update_metadata(DATASET, before.head(10))
    assert scan.collect().equals(before)


QUERIES: list[Callable[[Any], Any]] = [
    lambda f: f.select("sample_id", "extra"),
    lambda f: f.filter(pl.col("label") == 2),
    lambda f: f.filter(pl.col("length") > 3).select("name", "weight"),
    lambda f: f.head(11),
    lambda f: f.filter(pl.col("flag")).head(4).select("cache_id", "sample_id"),
    lambda f: f.group_by("label").agg(pl.col("weight").sum()).sort("label"),
]


@pytest.mark.parametrize("query", QUERIES)
def test_projection_filter_and_limit_give_what_eager_gives(
    client: DatasetClient, query: Callable[[Any], Any]
) -> None:
    client.update_metadata(DATASET, annotated(client.get_metadata(DATASET)))
    lazy = query(client.scan_metadata(DATASET)).collect()
    assert lazy.equals(query(client.get_metadata(DATASET)))


def test_a_metadata_ticket_sends_the_columns_it_names(
    client: DatasetClient, raw: flight.FlightClient
) -> None:
    """A plain pyarrow client names columns in the ticket; the server sends those
    only, in that order; a name that is not a column, or none, is refused."""
    client.update_metadata(DATASET, annotated(client.get_metadata(DATASET)))
    eager = client.get_metadata(DATASET)

    def read(**keys: Any) -> pa.Table:
        body = {"dataset": DATASET, "metadata": True, **keys}
        return raw.do_get(flight.Ticket(json.dumps(body).encode())).read_all()

    table = read(columns=["weight", "sample_id"])
    assert table.column_names == ["weight", "sample_id"]
    assert pl.DataFrame(table).equals(eager.select("weight", "sample_id"))
    with pytest.raises(pa.ArrowInvalid, match=r"unknown column 'nope'; the population's columns"):
        read(columns=["label", "nope"])
    with pytest.raises(pa.ArrowInvalid, match="names no column"):
        read(columns=[])
    with pytest.raises(pa.ArrowInvalid, match="'label' twice"):
        read(columns=["label", "weight", "label"])


def test_get_schema_answers_a_tickets_schema_without_a_stream(
    client: DatasetClient, raw: flight.FlightClient
) -> None:
    """``get_schema`` of a metadata command is the schema of that ticket's
    stream (the columns it names, in that order); of a path or a stream
    command, the schema ``get_flight_info`` gives."""
    client.update_metadata(DATASET, annotated(client.get_metadata(DATASET)))

    def schemas(body: dict[str, Any]) -> tuple[pa.Schema, pa.Schema]:
        raw_body = json.dumps(body).encode()
        asked = raw.get_schema(flight.FlightDescriptor.for_command(raw_body)).schema
        return asked, raw.do_get(flight.Ticket(raw_body)).read_all().schema

    metadata = {"dataset": DATASET, "metadata": True}
    asked, streamed = schemas(metadata)
    assert asked == streamed
    assert asked.names[-2:] == ["extra", "length"]
    asked, streamed = schemas(metadata | {"columns": ["weight", "sample_id"]})
    assert asked == streamed
    assert asked.names == ["weight", "sample_id"]
    path = flight.FlightDescriptor.for_path(DATASET)
    assert raw.get_schema(path).schema == raw.get_flight_info(path).schema
    epoch = {"dataset": DATASET, "seed": 1, "epoch": 0, "columns": ["label"]}
    command = flight.FlightDescriptor.for_command(json.dumps(epoch).encode())
    assert raw.get_schema(command).schema == raw.get_flight_info(command).schema
    bad = json.dumps(metadata | {"columns": ["nope"]}).encode()
    with pytest.raises(pa.ArrowInvalid, match="unknown column 'nope'"):
        raw.get_schema(flight.FlightDescriptor.for_command(bad))


def test_a_scan_asks_the_server_for_the_columns_it_reads(
    client: DatasetClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.update_metadata(DATASET, annotated(client.get_metadata(DATASET)))
    tickets: list[dict[str, Any]] = []
    read = client._metadata_batches

    def spy(ticket: flight.Ticket) -> Any:
        tickets.append(json.loads(ticket.ticket))
        return read(ticket)

    monkeypatch.setattr(client, "_metadata_batches", spy)
    scan = client.scan_metadata(DATASET)
    count = scan.filter(pl.col("label") == 2).select(pl.len()).collect().item()
    assert count == client.get_metadata(DATASET).filter(pl.col("label") == 2).height
    columns = tickets[-1]["columns"]
    assert "label" in columns
    assert len(columns) < len(scan.collect_schema())
    scan.collect()
    assert "columns" not in tickets[-1], "a query of every column names none"


def test_a_scan_fails_over_to_the_next_location(server: DatasetFlightServer) -> None:
    with DatasetClient(["grpc://127.0.0.1:1", server.location], backoff=0.01) as client:
        assert client.scan_metadata(DATASET).collect().equals(client.get_metadata(DATASET))


def test_an_unknown_population_is_not_found_when_the_scan_is_made(client: DatasetClient) -> None:
    # pyarrow clients read NOT_FOUND as ArrowKeyError (tests/flight/test_error_statuses.py).
    with pytest.raises(pa.ArrowKeyError, match="is not in the store"):
        client.scan_metadata(DATASET, "0" * 32)


# -- putting ----------------------------------------------------------------------


def test_a_lazy_reweighting_is_the_eager_population(client: DatasetClient, tmp_path: Path) -> None:
    table = client.get_metadata(DATASET)
    eager = client.update_metadata(DATASET, balanced(table), activate=False)
    assert client.update_metadata(DATASET, balanced(client.scan_metadata(DATASET))) == eager
    assert state(client)["active"] == {"population": eager, "epoch_len": ROWS, "rows": ROWS}
    assert client.put(DATASET, balanced(many_batches(table, 1))) == eager
    path = tmp_path / "balanced.parquet"
    balanced(table).write_parquet(path)
    assert client.update_metadata(DATASET, path) == eager
    assert client.put(DATASET, str(path)) == eager
    assert client.get_metadata(DATASET).equals(balanced(table))


def test_a_lazy_put_of_many_batches_is_the_eager_population(client: DatasetClient) -> None:
    table = annotated(client.get_metadata(DATASET))
    eager = client.update_metadata(DATASET, pl.concat([table] * 40))
    assert client.update_metadata(DATASET, many_batches(table)) == eager


BAD_EDITS: list[Callable[[Any], Any]] = [
    lambda f: f.drop("weight"),
    lambda f: f.with_columns(pl.col("label").cast(pl.Float64)),
    lambda f: f.with_columns(pl.col("name") + "?"),
    lambda f: f.with_columns(pl.lit(0.0).alias("weight")),
    lambda f: f.with_columns(pl.col("sample_id") + 1_000_000),
]


@pytest.mark.parametrize("edit", BAD_EDITS)
def test_a_bad_lazy_frame_gets_its_eager_error_and_changes_nothing(
    client: DatasetClient, edit: Callable[[Any], Any]
) -> None:
    table = client.get_metadata(DATASET)
    before = state(client)
    # INVALID_ARGUMENT reaches a pyarrow client as ArrowInvalid.
    with pytest.raises(pa.ArrowInvalid) as eager:
        client.update_metadata(DATASET, edit(pl.concat([table] * 3)))
    with pytest.raises(pa.ArrowInvalid) as lazy:
        client.update_metadata(DATASET, edit(many_batches(table, 3)))
    assert type(lazy.value) is type(eager.value)
    assert message(lazy.value) == message(eager.value)
    assert state(client) == before


def test_a_lazy_frame_failing_midway_stores_nothing(client: DatasetClient) -> None:
    table = client.get_metadata(DATASET)
    client.update_metadata(DATASET, balanced(table))
    before = state(client)
    failing = many_batches(table).map_batches(raising_on_batch(3), streamable=True)
    with pytest.raises(RuntimeError, match="batch 3 is bad"):
        client.update_metadata(DATASET, failing)
    assert state(client) == before
    # The connection still serves the next put.
    assert client.update_metadata(DATASET, table) in state(client)["populations"]


# -- memory -----------------------------------------------------------------------

MEMORY_ROWS = 5_000_000

# Run in a fresh process, so that its peak resident memory (VmHWM) is the put's
# alone; the server (in the test's process) collects what it receives.
PUT_IN_A_CHILD = """
import json, sys
from pathlib import Path
import polars as pl
from flight_client import DatasetClient

def peak() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")

location, path, mode = sys.argv[1:]
with DatasetClient(location) as client:
    client.health()
    base = peak()
    if mode == "lazy":
        # The seed's class balance, written to stream: a streamed group_by counts
        # the classes (a row each), and each row's weight needs only the row.
        rows = pl.scan_parquet(path)
        counts = rows.group_by("label").agg(pl.len()).collect(engine="streaming")
        weight = pl.lit(None, dtype=pl.Float64)
        for label, n in counts.iter_rows():
            weight = pl.when(pl.col("label") == label).then(1.0 / n).otherwise(weight)
        table = rows.with_columns(weight.alias("weight"))
    else:
        table = pl.read_parquet(path).with_columns((1.0 / pl.len().over("label")).alias("weight"))
    population = client.update_metadata("toy", table)
    print(json.dumps({"population": population, "base": base, "peak": peak()}))
"""


def _put_in_a_child(location: str, path: Path, mode: str) -> dict[str, Any]:
    # Polars' buffers grow with its threads: two, so that the bound holds on any machine.
    env = os.environ | {"POLARS_MAX_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", PUT_IN_A_CHILD, location, str(path), mode],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_a_lazy_put_holds_far_less_than_the_table(client: DatasetClient, tmp_path: Path) -> None:
    """5·10^6 rows from a Parquet file, reweighted lazily and put over Flight: the
    client's peak memory grows by far less than the table (and than the same put
    done eagerly, the baseline measured in the same run)."""
    table = client.get_metadata(DATASET)
    big = pl.concat([table] * (MEMORY_ROWS // ROWS + 1)).head(MEMORY_ROWS)
    size = big.to_arrow().nbytes
    path = tmp_path / "population.parquet"
    big.write_parquet(path, row_group_size=16_384)
    del big
    location = client.locations[0]
    lazy = _put_in_a_child(location, path, "lazy")
    eager = _put_in_a_child(location, path, "eager")
    lazy_growth = lazy["peak"] - lazy["base"]
    eager_growth = eager["peak"] - eager["base"]
    print(
        f"table {size / 2**20:.0f} MiB of Arrow; client peak growth: lazy "
        f"{lazy_growth / 2**20:.0f} MiB ({lazy_growth / size:.2f}x the table), eager "
        f"{eager_growth / 2**20:.0f} MiB ({eager_growth / size:.2f}x)"
    )
    assert lazy["population"] == eager["population"]
    assert state(client)["active"]["rows"] == MEMORY_ROWS
    assert lazy_growth < size / 2
    assert lazy_growth < eager_growth / 4
