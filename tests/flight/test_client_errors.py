"""A server's refusals reach `DatasetClient` as the library's own classes.

Each is also the pyarrow class its status arrives as (``except pa.ArrowInvalid``
keeps working), and its message is the server's one line: no "Detail: ..." and no
"gRPC client debug context". Every class of `dataset_rt.errors` is checked end to
end through a bare server that raises it by the server's one mapping
(`to_flight_error`); the refusals a user meets first (a rejected table, a put past
a limit, an unknown dataset or column, a fenced run) through the real server.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import dataset_rt as drt
import flight_client.errors as client_errors
from dataset_rt.loader import LocalSource
from flight_client import DatasetClient, EveryLocationFailedError
from flight_client.client import RETRYABLE
from flight_client.errors import server_error, server_message
from flight_server import Catalog, DatasetFlightServer
from flight_server.auth import TokenFile
from flight_server.errors import hide_tracebacks, to_flight_error
from flight_server.limits import Limits

from .conftest import DATASET, LOOPBACK, ROWS, command, metadata, serve

LIBRARY_CLASSES = [getattr(drt.errors, name) for name in drt.errors.__all__]


def status_of(cls: type[BaseException]) -> type[BaseException]:
    """The pyarrow class (the status) of ``cls``: its first base from pyarrow."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("pyarrow"))


def assert_servers_words(error: BaseException, *expected: str) -> None:
    text = str(error)
    assert "\n" not in text, text
    for tail in ("Detail:", "gRPC", "Client context", "Traceback", "C Data interface"):
        assert tail not in text, text
    for words in expected:
        assert words in text, text


def test_every_library_class_has_a_client_class_of_the_status_the_server_sends() -> None:
    assert set(client_errors.CLASSES) == set(drt.errors.__all__)
    for library_class in LIBRARY_CLASSES:
        client_class = client_errors.CLASSES[library_class.__name__]
        assert client_class.__mro__[1] is library_class
        sent = to_flight_error(library_class("what went wrong"))
        assert issubclass(client_class, status_of(type(sent))), library_class.__name__


# -- every class, end to end over a bare server -------------------------------------


class RaisingServer(flight.FlightServerBase):  # type: ignore[misc]
    """Answers every call with ``error`` as the DatasetRT server sends it; a
    ``do_get`` sends one batch first (a failure met mid-stream)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(LOOPBACK)
        hide_tracebacks()
        self.error = error
        self.location = f"grpc://127.0.0.1:{self.port}"

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        raise to_flight_error(self.error)

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.GeneratorStream:
        batch = pa.record_batch({"sample_id": pa.array([1, 2], pa.uint64())})

        def batches() -> Iterator[pa.RecordBatch]:
            yield batch
            raise to_flight_error(self.error)

        return flight.GeneratorStream(batch.schema, batches())


@contextmanager
def raising(error: Exception) -> Iterator[DatasetClient]:
    with RaisingServer(error) as server, DatasetClient(server.location, backoff=0.001) as client:
        yield client


def caught(call: Callable[[], object], library_class: type[Exception]) -> BaseException:
    """The error ``call`` raises: ``library_class`` itself, or, for a status the
    client retries, `EveryLocationFailedError` with it as the cause."""
    retried = issubclass(client_errors.CLASSES[library_class.__name__], RETRYABLE)
    with pytest.raises(EveryLocationFailedError if retried else library_class) as raised:
        call()
    error = raised.value.__cause__ if retried else raised.value
    assert isinstance(error, library_class), repr(error)
    if retried:
        assert library_class.__name__ in str(raised.value)
    return error


@pytest.mark.parametrize("library_class", LIBRARY_CLASSES, ids=lambda c: c.__name__)
def test_each_class_reaches_the_client_as_itself_and_its_status(
    library_class: type[Exception],
) -> None:
    with raising(library_class("the server's own words")) as client:
        calls: list[Callable[[], object]] = [
            client.health,  # an action
            lambda: list(client.stream_ticket({"dataset": DATASET, "seed": 0, "epoch": 0})),
        ]
        for call in calls:
            error = caught(call, library_class)
            assert isinstance(error, status_of(client_errors.CLASSES[library_class.__name__]))
            if library_class is drt.StorageFullError:  # the server's words for it
                assert_servers_words(error, "state volume is full")
            else:
                assert_servers_words(error, "the server's own words")


def test_a_retried_class_is_raised_after_every_location_failed() -> None:
    """INTERNAL and UNAVAILABLE are retried on every location; then
    `EveryLocationFailedError` names the classes and has the last error as its cause."""
    with (
        RaisingServer(drt.StoreUnavailableError("the object store is down")) as first,
        RaisingServer(drt.CorruptCacheError("shard-00001.bin fails its checksum")) as second,
        DatasetClient([first.location, second.location], backoff=0.001) as client,
    ):
        with pytest.raises(EveryLocationFailedError) as raised:
            list(client.stream_ticket({"dataset": DATASET, "seed": 0, "epoch": 0}))
        text = str(raised.value)
        assert "StoreUnavailableError: the object store is down" in text
        assert "CorruptCacheError: the server's data is damaged" in text
        assert isinstance(raised.value.__cause__, drt.DatasetRTError)
        assert "gRPC client debug context" not in text


def test_invalid_population_error_keeps_where_and_pickles(catalog: Catalog) -> None:
    """Its ``column``, ``row`` and ``count`` cross the wire; the error pickles by
    reference (a DataLoader worker hands its exception to the trainer so)."""
    with serve(catalog) as server, DatasetClient(server.location) as client:
        table = client.get_metadata(DATASET)
        with pytest.raises(drt.InvalidPopulationError) as raised:
            client.put(DATASET, table.with_columns(pl.lit(-1.0).alias("weight")))
    error = raised.value
    assert (error.column, error.row, error.count) == ("weight", 0, ROWS)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert (copy.column, copy.row, copy.count) == ("weight", 0, ROWS)


# -- the real server's refusals ------------------------------------------------------


def negative_weights(table: pl.DataFrame) -> pl.DataFrame:
    return table.with_columns(pl.lit(-1.0).alias("weight"))


@pytest.mark.parametrize(
    "form",
    ["DataFrame", "LazyFrame", "Parquet path", "pyarrow Table"],
)
def test_a_refused_table_raises_invalid_population_error_as_in_process(
    catalog: Catalog, toy_caches: tuple[Path, Path], tmp_path: Path, form: str
) -> None:
    """The same class, message and ``column``/``row``/``count`` as a put in
    process (`LocalSource.put`), whatever form the table takes."""
    with serve(catalog) as server, DatasetClient(server.location) as client:
        bad = negative_weights(client.get_metadata(DATASET))
        before = client.populations(DATASET)
        path = tmp_path / "bad.parquet"
        bad.write_parquet(path)
        table: Any = {
            "DataFrame": bad,
            "LazyFrame": bad.lazy(),
            "Parquet path": path,
            "pyarrow Table": bad.to_arrow(),
        }[form]
        with pytest.raises(drt.InvalidPopulationError) as remote:
            client.put(DATASET, table)
        assert client.populations(DATASET) == before
    local = LocalSource(toy_caches, tmp_path / "local", name=DATASET)
    with pytest.raises(drt.InvalidPopulationError) as in_process:
        local.put(bad)
    assert isinstance(remote.value, pa.ArrowInvalid)
    assert isinstance(remote.value, ValueError)
    assert str(remote.value) == str(in_process.value)
    assert_servers_words(remote.value, "column 'weight'")
    assert (remote.value.column, remote.value.row, remote.value.count) == (
        in_process.value.column,
        in_process.value.row,
        in_process.value.count,
    )


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        (Limits(max_put_rows=100), "--max-put-rows 100: "),
        (Limits(max_put_bytes=4096), "--max-put-bytes 4096: "),
    ],
)
@pytest.mark.parametrize("form", ["DataFrame", "LazyFrame"])
def test_a_table_over_a_put_limit_is_refused_with_the_limits_name_first(
    catalog: Catalog, limits: Limits, name: str, form: str
) -> None:
    with serve(catalog, limits=limits) as server, DatasetClient(server.location) as client:
        table = client.get_metadata(DATASET)
        with pytest.raises(drt.InvalidArgumentError) as raised:
            client.put(DATASET, table if form == "DataFrame" else table.lazy())
    assert isinstance(raised.value, pa.ArrowInvalid)
    assert str(raised.value).startswith(name), str(raised.value)
    assert_servers_words(raised.value, "the most this server takes in one do_put")


def readme_put(raw: flight.FlightClient, table: pa.Table) -> dict[str, Any]:
    """The README's plain ``do_put`` pattern: closing the writer raises a refusal."""
    writer, reader = raw.do_put(command({"dataset": DATASET}), table.schema)
    with writer:
        writer.write_table(table)
        writer.done_writing()
        answer = reader.read()
    return dict(json.loads(answer.to_pybytes()))


def test_the_readme_put_pattern_raises_the_servers_refusal(catalog: Catalog) -> None:
    """Plain pyarrow: a refused table is the server's ``ArrowInvalid`` (not an
    ``AttributeError`` of the empty answer), and a put past a limit says the
    limit first, with no "C Data interface error" or traceback before it."""
    with (
        serve(catalog, limits=Limits(max_put_rows=ROWS)) as server,
        flight.connect(server.location) as raw,
    ):
        table = metadata(raw)
        with pytest.raises(pa.ArrowInvalid, match="column 'weight' must be positive"):
            readme_put(raw, negative_weights(table).to_arrow())
        with pytest.raises(pa.ArrowInvalid) as raised:
            readme_put(raw, pl.concat([table, table]).to_arrow())
        assert readme_put(raw, table.to_arrow())["rows"] == ROWS
    assert server_message(raised.value).startswith(
        f"--max-put-rows {ROWS}: the table has more than {ROWS} rows"
    )
    assert "Traceback" not in str(raised.value)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda c: c.get_metadata("nope"), "unknown dataset 'nope'"),
        (lambda c: c.populations("nope"), "unknown dataset 'nope'"),
        (lambda c: c.scan_metadata("nope"), "unknown dataset 'nope'"),
        (lambda c: c.epoch_info("nope", seed=0, epoch=0), "unknown dataset 'nope'"),
        (lambda c: list(c.epoch("nope", seed=0, epoch=0)), "unknown dataset 'nope'"),
        (lambda c: c.get_metadata(DATASET, "0" * 32), "0" * 32),
        (lambda c: c.scan_metadata(DATASET, "0" * 32).collect(), "0" * 32),
        (lambda c: c.put("nope", pl.DataFrame({"a": [1]})), "unknown dataset 'nope'"),
    ],
    ids=[
        "get_metadata",
        "populations",
        "scan_metadata",
        "epoch_info",
        "epoch",
        "population",
        "scan-population",
        "put",
    ],
)
def test_unknown_names_raise_not_found_error(
    client: DatasetClient, call: Callable[[DatasetClient], object], words: str
) -> None:
    with pytest.raises(drt.NotFoundError) as raised:
        call(client)
    assert isinstance(raised.value, pa.ArrowKeyError)
    assert isinstance(raised.value, LookupError)
    assert_servers_words(raised.value, words)
    assert str(raised.value) == raised.value.args[0]  # no KeyError quotes


def test_a_refused_request_raises_invalid_argument_error(client: DatasetClient) -> None:
    with pytest.raises(drt.InvalidArgumentError) as raised:
        list(client.epoch(DATASET, seed=0, epoch=0, columns=["nope"]))
    assert isinstance(raised.value, pa.ArrowInvalid)
    assert_servers_words(raised.value, "unknown column 'nope'")
    with pytest.raises(drt.InvalidArgumentError, match="epoch_len") as raised:
        client.set_epoch_len(DATASET, 0)
    assert_servers_words(raised.value)


def test_a_fenced_run_raises_fenced_error(client: DatasetClient) -> None:
    run = "5e11" * 8
    assert client.claim_run(DATASET, run, after=0, epoch=0, position=8) == 1
    with pytest.raises(drt.FencedError) as raised:
        client.check_run(DATASET, run, 0)
    assert isinstance(raised.value, flight.FlightCancelledError)
    assert isinstance(raised.value, RuntimeError)
    assert_servers_words(raised.value, "was resumed elsewhere")
    assert json.loads(raised.value.extra_info) == {"class": "FencedError"}


def test_errors_the_server_names_no_class_for_keep_their_pyarrow_class(
    catalog: Catalog,
) -> None:
    """An auth refusal names no library class: it stays pyarrow's, with the
    server's message only."""
    tokens = TokenFile((("s3cret-token-0123456789", "read"),))
    with (
        serve(catalog, tokens=tokens) as server,
        DatasetClient(server.location, token="wrong") as client,
        pytest.raises(flight.FlightUnauthenticatedError) as raised,
    ):
        client.populations(DATASET)
    assert not isinstance(raised.value, drt.DatasetRTError)
    assert_servers_words(raised.value)


def test_server_error_translates_a_plain_pyarrow_clients_error(catalog: Catalog) -> None:
    """`server_error` serves a plain ``pyarrow.flight`` client too."""
    with (
        serve(catalog) as server,
        flight.connect(server.location) as raw,
        pytest.raises(pa.ArrowKeyError) as raised,
    ):
        raw.do_get(flight.Ticket(json.dumps({"dataset": "nope", "metadata": True}))).read_all()
    assert "gRPC client debug context" in str(raised.value)  # what pyarrow gives
    translated = server_error(raised.value)
    assert isinstance(translated, drt.NotFoundError)
    assert isinstance(translated, pa.ArrowKeyError)
    assert str(translated) == "unknown dataset 'nope'; this server serves ['toy']"
    assert server_error(ValueError("local")).args == ("local",)  # not a server's: as it is


# -- docs/errors.md ------------------------------------------------------------------

ROOT = Path(__file__).parents[2]
DOCS_LOCATION = "grpc://127.0.0.1:8815"


def test_the_errors_page_example_prints_what_it_shows(server: DatasetFlightServer) -> None:
    page = (ROOT / "docs" / "errors.md").read_text()
    example = re.search(r"```python\n(.*?)```\s*```text\n(.*?)```", page, flags=re.DOTALL)
    assert example is not None
    code, shown = example.groups()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace(DOCS_LOCATION, server.location), {"__name__": "__docs__"})
    assert printed.getvalue() == shown


def test_the_readme_links_the_errors_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "[docs/errors.md](docs/errors.md)" in readme
    assert "except drt.InvalidPopulationError" in readme
