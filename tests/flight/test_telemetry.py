"""Server telemetry: what ``do_get`` served, per population, in the ``stats`` action.

Every count is checked against what the client received: rows, the Arrow bytes of
the batches, and the rows per value of the grouping column (computed here from the
streamed identities and the population's metadata).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records, write

from flight_server import Catalog, cli

from .conftest import DATASET, act, active, command, ids, metadata, put, serve, ticket
from .test_server_cli import ServerProcess, options

SEED = 7
#: The key of the rows whose value got none (past --telemetry-max-groups).
OVERFLOW = "(other)"


def epoch(**keys: Any) -> dict[str, Any]:
    """A hand-written ticket of epoch 0 (the active population unless pinned)."""
    return {"dataset": DATASET, "seed": SEED, "epoch": 0} | keys


def read(raw: flight.FlightClient, body: dict[str, Any]) -> list[pa.RecordBatch]:
    """The batches of a hand-written ticket, as the client received them."""
    return [chunk.data for chunk in raw.do_get(ticket(body))]


def served(raw: flight.FlightClient, population: str) -> dict[str, Any]:
    """The ``served`` entry of ``population`` in ``stats``."""
    entries = act(raw, "stats")[DATASET]["served"]
    (entry,) = [e for e in entries if e["population"] == population]
    return dict(entry)


def column_of(
    raw: flight.FlightClient, name: str, population: str | None = None
) -> dict[tuple[int, int], Any]:
    """``(cache_id, sample_id) -> value`` of a population's column ``name``."""
    table = metadata(raw, population)
    return dict(zip(ids(table.to_arrow()), table[name].to_list(), strict=True))


def expected_groups(
    batches: list[pa.RecordBatch], values: dict[tuple[int, int], Any]
) -> Counter[str]:
    return Counter(str(values[key]) for batch in batches for key in ids(batch))


def rows_and_bytes(batches: list[pa.RecordBatch]) -> tuple[int, int]:
    return sum(b.num_rows for b in batches), sum(b.nbytes for b in batches)


# -- rows and bytes ------------------------------------------------------------------


def test_rows_and_bytes_per_population(catalog: Catalog) -> None:
    with serve(catalog) as server, flight.connect(server.location) as raw:
        first = active(raw)["population"]
        second = put(raw, metadata(raw).head(50), activate=False)["population"]
        assert act(raw, "stats")[DATASET]["served"] == []

        a = read(raw, epoch(epoch_len=30))
        b1 = read(raw, epoch(epoch_len=20, population=second))
        b2 = read(raw, epoch(epoch_len=25, population=second, payload=False))

        stats = act(raw, "stats")[DATASET]
        # The existing keys are unchanged; the telemetry keys come beside them.
        assert {"rows", "populations", "streams", "rows_sent", "bytes_sent"} <= set(stats)
        assert stats["group_column"] is None
        rows, nbytes = rows_and_bytes(a)
        assert served(raw, first) == {
            "population": first,
            "streams": 1,
            "rows": 30,
            "bytes": nbytes,
            "groups": {},
            "group_column_missing": False,
        }
        assert rows == 30
        assert nbytes > sum(len(p) for b in a for p in b.column("payload").to_pylist())
        entry = served(raw, second)
        assert (entry["streams"], entry["rows"]) == (2, 45)
        assert entry["bytes"] == rows_and_bytes(b1)[1] + rows_and_bytes(b2)[1]
        # Most recently streamed first.
        assert [e["population"] for e in stats["served"]] == [second, first]
        # One measure: the dataset's totals are the sums of what each population served.
        assert stats["rows_sent"] == sum(e["rows"] for e in stats["served"]) == 75
        assert stats["bytes_sent"] == sum(e["bytes"] for e in stats["served"])


def test_ids_only_stream_counts_what_it_sent(catalog: Catalog) -> None:
    with serve(catalog, telemetry_column="label") as server, flight.connect(server.location) as raw:
        batches = read(raw, epoch(epoch_len=40, payload=False))
        assert "payload" not in batches[0].schema.names
        assert "label" not in batches[0].schema.names
        entry = served(raw, active(raw)["population"])
        assert (entry["streams"], entry["rows"]) == (1, 40)
        assert entry["bytes"] == rows_and_bytes(batches)[1] > 0
        assert entry["groups"] == expected_groups(batches, column_of(raw, "label"))


def test_counts_move_while_a_stream_runs_and_a_cancelled_stream_counts_what_it_sent(
    catalog: Catalog,
) -> None:
    total = 30_000  # ~45 MB of payload: far more than gRPC buffers ahead
    with serve(catalog, batch_size=10) as server, flight.connect(server.location) as raw:
        population = active(raw)["population"]
        reader = raw.do_get(ticket(epoch(epoch_len=total)))
        reader.read_chunk()
        live = served(raw, population)
        assert live["streams"] == 1
        assert 10 <= live["rows"] < total
        reader.cancel()
        # Settled: the server has stopped sending, and counted each batch it sent.
        deadline = time.monotonic() + 10
        last = -1
        while (rows := served(raw, population)["rows"]) != last:
            assert time.monotonic() < deadline, "the counts did not settle"
            last = rows
            time.sleep(0.5)
        assert live["rows"] <= rows < total
        assert rows % 10 == 0


# -- groups --------------------------------------------------------------------------


def test_group_counts_equal_the_streamed_rows_with_or_without_the_column(
    catalog: Catalog,
) -> None:
    with serve(catalog, telemetry_column="label") as server, flight.connect(server.location) as raw:
        labels = column_of(raw, "label")
        asked = read(raw, epoch(epoch_len=90, columns=["label", "score"]))
        assert asked[0].schema.names[-2:] == ["label", "score"]

        # Without the column: the client gets exactly the schema FlightInfo announced.
        info = raw.get_flight_info(command(epoch(epoch_len=70, columns=["score"])))
        reader = raw.do_get(info.endpoints[0].ticket)
        unasked = [chunk.data for chunk in reader]
        assert reader.schema == info.schema
        assert "label" not in info.schema.names
        assert all(b.schema == info.schema for b in unasked)

        stats = act(raw, "stats")[DATASET]
        assert stats["group_column"] == "label"
        entry = served(raw, active(raw)["population"])
        assert entry["rows"] == 160
        assert entry["group_column_missing"] is False
        expected = expected_groups(asked, labels) + expected_groups(unasked, labels)
        assert entry["groups"] == expected
        assert set(expected) == {"0", "1", "2"}
        # The label a stream carries is the label counted.
        assert expected_groups(asked, labels) == Counter(
            str(v) for b in asked for v in b.column("label").to_pylist()
        )


def test_groups_are_bounded_with_an_overflow_key(catalog: Catalog) -> None:
    max_groups = 5
    with (
        serve(catalog, telemetry_column="name", telemetry_max_groups=max_groups) as server,
        flight.connect(server.location) as raw,
    ):
        names = column_of(raw, "name")
        assert len(set(names.values())) > max_groups
        batches = read(raw, epoch(epoch_len=300, shuffle=False))
        groups = served(raw, active(raw)["population"])["groups"]
        assert len(groups) == max_groups + 1
        assert groups[OVERFLOW] > 0
        assert sum(groups.values()) == 300
        # The values that got a key are counted exactly.
        expected = expected_groups(batches, names)
        assert {k: v for k, v in groups.items() if k != OVERFLOW} == {
            k: expected[k] for k in groups if k != OVERFLOW
        }


def test_population_without_the_column_is_flagged(catalog: Catalog) -> None:
    with serve(catalog, telemetry_column="split") as server, flight.connect(server.location) as raw:
        plain = active(raw)["population"]
        table = metadata(raw).head(120)
        split = table.with_columns(
            pl.when(pl.col("sample_id") % 4 == 0)
            .then(pl.lit("val"))
            .otherwise(pl.lit("train"))
            .alias("split")
        )
        annotated = put(raw, split, activate=False)["population"]

        without = read(raw, epoch(epoch_len=30))
        assert "split" not in without[0].schema.names
        entry = served(raw, plain)
        assert entry["group_column_missing"] is True
        assert (entry["rows"], entry["groups"]) == (30, {})
        assert entry["bytes"] == rows_and_bytes(without)[1]

        info = raw.get_flight_info(command(epoch(epoch_len=60, population=annotated)))
        streamed = raw.do_get(info.endpoints[0].ticket).read_all()
        assert streamed.schema == info.schema
        assert "split" not in streamed.schema.names
        entry = served(raw, annotated)
        assert entry["group_column_missing"] is False
        assert entry["rows"] == 60
        assert entry["groups"] == expected_groups(
            streamed.to_batches(), column_of(raw, "split", annotated)
        )
        assert set(entry["groups"]) == {"train", "val"}


def test_a_column_that_cannot_be_grouped_counts_as_missing(catalog: Catalog) -> None:
    """A list column has no value counts: the stream is served, its groups are not."""
    with serve(catalog, telemetry_column="tags") as server, flight.connect(server.location) as raw:
        tagged = metadata(raw).head(40).with_columns(pl.concat_list("label", "label").alias("tags"))
        population = put(raw, tagged, activate=False)["population"]
        asked = read(raw, epoch(epoch_len=20, population=population, columns=["tags"]))
        unasked = read(raw, epoch(epoch_len=10, population=population))
        assert asked[0].schema.names[-1] == "tags"
        assert "tags" not in unasked[0].schema.names
        entry = served(raw, population)
        assert (entry["rows"], entry["groups"], entry["group_column_missing"]) == (30, {}, True)


# -- the command line ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "--telemetry-max-groups must be >= 1, got 0"),
        ("-3", "--telemetry-max-groups must be >= 1, got -3"),
        ("many", "--telemetry-max-groups: invalid int value"),
    ],
)
def test_cli_refuses_a_bad_max_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, problem: str
) -> None:
    args = ["--data-dir", str(tmp_path / "data"), "--port", "0", "--telemetry-max-groups", value]
    try:
        code: int | str | None = cli.main(args)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert problem in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "data" / "caches").exists()  # refused before building anything


def test_cli_telemetry_flags_reach_the_stats_action(tmp_path: Path) -> None:
    cache = write(tmp_path / "caches", ListSource("small", make_records(30)))
    args = ["--port", "0", "--data-dir", str(tmp_path / "data"), "--dataset", f"small={cache}"]
    args += ["--telemetry-column", "label", "--telemetry-max-groups", "2"]
    with ServerProcess(args) as process, flight.connect(process.location()) as raw:
        body = {"dataset": "small", "seed": 1, "epoch": 0}
        assert raw.do_get(ticket(body), options()).read_all().num_rows == 30
        (result,) = raw.do_action(flight.Action("stats", b""), options())
        stats = json.loads(result.body.to_pybytes())["small"]
        assert stats["group_column"] == "label"
        (entry,) = stats["served"]
        assert entry["rows"] == 30
        groups = entry["groups"]
        assert len(groups) == 3  # two labels and the overflow key
        assert OVERFLOW in groups
        assert sum(groups.values()) == 30
        assert process.stop() == 0, process.output()
