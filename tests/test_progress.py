"""Progress (writes, puts, scans, the server's start, a population's rows file built
for a store of an older build): drawn on a terminal, silent otherwise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import ListSource
from terminal import on_a_terminal

SCRIPT = """
import sys
import dataset_rt as drt

class Source:
    name = "progress"
    def __len__(self):
        return 3000
    def __iter__(self):
        for i in range(3000):
            yield drt.CacheInput(data=bytes(2048), metadata={"i": i})

runtime = drt.DatasetRuntime(num_workers=2)
[result] = runtime.write_cache(Source(), sys.argv[1])
assert isinstance(result, drt.CacheWriteSuccess), result
"""


def _run(target: Path, *, terminal: bool) -> str:
    if not terminal:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(target)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stderr
    return on_a_terminal([sys.executable, "-c", SCRIPT, str(target)])


def test_progress_is_drawn_on_a_terminal(tmp_path: Path) -> None:
    output = _run(tmp_path, terminal=True)
    assert "writing progress" in output
    assert "records" in output
    assert "MB/s" in output
    assert "3000/3000" in output


def test_progress_is_silent_without_a_terminal(tmp_path: Path) -> None:
    assert _run(tmp_path, terminal=False) == ""


def test_the_rate_is_a_whole_number_of_records_per_second(tmp_path: Path) -> None:
    output = _run(tmp_path, terminal=True)
    rates = re.findall(r"([\d,.]+)/s", output)
    assert rates, output
    assert all("." not in rate for rate in rates), rates


def test_the_ok_line_after_a_progress_bar_starts_a_line_of_its_own(tmp_path: Path) -> None:
    """``import`` at a terminal: the bar (stderr) is left on screen, finished, and
    the command's "ok:" line (stdout) comes on the next line, not after the bar."""
    n = 3000
    table = pa.table({"data": [bytes(512)] * n, "i": list(range(n))})
    pq.write_table(table, tmp_path / "data.parquet")
    output = on_a_terminal(
        [
            sys.executable, "-m", "dataset_rt", "import", str(tmp_path / "data.parquet"),
            "--payload-column", "data", "--name", "bar", "--base-dir", str(tmp_path),
        ],
        stdout_too=True,
    )  # fmt: skip
    assert f"{n}/{n} records" in output  # the finished bar
    before, ok, _ = output.rpartition("ok: bar -> ")
    assert ok, output
    assert before.endswith("\n"), f"the ok line follows {before[-60:]!r}"


# -- the server's start, puts and scans ---------------------------------------------


def test_the_server_start_says_what_it_opens_on_a_terminal_only(tmp_path: Path) -> None:
    """``python -m flight_server`` at a terminal: one status line (stderr) of what
    the start opens, the demo cache's bar when it is written, then the "serving"
    line (stdout) on a line of its own. With --quiet, or piped, neither."""
    from flight.test_server_cli import ServerProcess

    command = [sys.executable, "-m", "flight_server", "--port", "0"]
    command += ["--data-dir", str(tmp_path / "data")]
    output = on_a_terminal(command, stdout_too=True, stop_after=b"serving ")
    assert "starting: opening the demo dataset demo" in output
    assert f"population store {tmp_path / 'data' / 'state'}" in output
    assert "2000/2000 records" in output  # the demo cache, written on this first start
    before, serving, _ = output.rpartition("serving demo at ")
    assert serving, output
    assert before.endswith("\n"), f"the serving line follows {before[-60:]!r}"

    quiet = on_a_terminal([*command, "-q"], stdout_too=True, stop_after=b"serving ")
    assert "serving demo at " in quiet
    assert "starting" not in quiet

    with ServerProcess(command[3:]) as server:
        server.location()
        assert server.stop() == 0
    assert server.stdout[0].startswith("serving demo at "), server.output()
    assert not any("starting" in line for line in server.stderr), server.output()


CLIENT = """
import sys
from pathlib import Path

import polars as pl

import dataset_rt as drt
from flight_client import DatasetClient
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

base = Path(sys.argv[1])
hide = {"show_progress": False} if sys.argv[2] == "hide" else {}  # shown by default
ROWS = 300_000  # 300 times each of 1,000 records: several 4 MiB messages and scan batches


class Source:
    name = "bars"
    def __len__(self):
        return 1000
    def __iter__(self):
        for i in range(1000):
            yield drt.CacheInput(data=bytes(8), metadata={"label": i % 10})


runtime = drt.DatasetRuntime(num_workers=2)
quiet = drt.WriterConfig(show_progress=False)
[cache] = runtime.write_cache(Source(), base / "caches", writer_config=quiet)
catalog = Catalog([DatasetSpec("bars", (cache.path,))], base / "state", runtime)
with DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server:
    with DatasetClient(server.location) as client:
        table = pl.concat([client.get_metadata("bars", **hide)] * 300)
        client.put("bars", table, **hide)
        assert client.get_metadata("bars", **hide).height == ROWS
        wide = table.with_columns(pl.col("weight") * 2)
        client.update_metadata("bars", wide.lazy(), **hide)
        table.head(250_000).write_parquet(base / "part.parquet")
        client.put("bars", base / "part.parquet", **hide)
        client.put("bars", table, **hide)
        frame = client.scan_metadata("bars", **hide)
        assert frame.filter(pl.col("label") == 3).select(pl.len()).collect().item() == ROWS // 10

config = drt.ReaderConfig(seed=0)
result = runtime.from_cache_sources(Source(), base / "caches", reader_config=config)
dataset = result.dataset
dataset.update_metadata(table)
scanned = dataset.scan_metadata(**hide).select(pl.len()).collect().item()
assert scanned == ROWS, scanned
"""


def test_puts_and_scans_draw_their_bars_on_a_terminal(tmp_path: Path) -> None:
    """`DatasetClient` puts (a DataFrame, a LazyFrame, a Parquet file), reads and scans, and the
    library's own scan, each draw a bar of the rows on a terminal (stderr)."""
    output = on_a_terminal([sys.executable, "-c", CLIENT, str(tmp_path), "show"])
    assert "━" in output  # rich's bar
    assert "read bars" in output
    assert "1000/1000" in output  # the first read: the population of the cache's rows
    assert "put bars" in output
    assert "put bars: sent; the server stores it" in output  # waiting for the answer
    assert "300000/300000" in output  # the DataFrame put, the second read
    assert "300000/?" in output  # the LazyFrame put: its rows are not known ahead
    assert "250000/250000" in output  # the Parquet put: its rows counted from its footer
    assert "scan bars" in output
    assert "scan population" in output  # the library's scan


def test_puts_and_scans_are_silent_off_a_terminal_or_without_progress(tmp_path: Path) -> None:
    piped = subprocess.run(
        [sys.executable, "-c", CLIENT, str(tmp_path / "piped"), "show"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert piped.stderr == ""
    assert piped.stdout == ""
    hidden = on_a_terminal([sys.executable, "-c", CLIENT, str(tmp_path / "hidden"), "hide"])
    assert hidden == ""


# -- the engine's one-time waits: a rows file built for a store of an older build --

OLD_STORE = """
import sys
from dataset_rt.loader import LocalSource

cache, state, show = sys.argv[1], sys.argv[2], sys.argv[3] == "show"
source = LocalSource([cache], state, name="old", show_progress=show)
assert source.service.active().rows == 20_000
"""


def test_the_rows_file_built_for_an_older_store_draws_a_bar_on_a_terminal(
    tmp_path: Path,
) -> None:
    """A store written before rows files existed (its table file an Arrow IPC stream
    of the table as put, identities included) gets each rows file built when its
    population is first opened, a full read of the table: a bar of its rows on a
    terminal, none with ``show_progress=False`` or off a terminal."""
    import dataset_rt as drt
    from dataset_rt.loader import LocalSource

    runtime = drt.DatasetRuntime(num_workers=2)
    records = [drt.CacheInput(data=b"x", metadata={"label": i % 7}) for i in range(20_000)]
    [written] = runtime.write_cache(
        ListSource("old", records), tmp_path, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(written, drt.CacheWriteSuccess), written
    state = tmp_path / "state"
    service = LocalSource([written.path], state, name="old").service
    population = service.active().population
    table = pa.table(service.metadata())
    [table_file] = state.rglob(f"{population}.arrow")

    def as_an_older_build_left_it() -> None:
        older = table_file.with_suffix(".older")
        with pa.OSFile(str(older), "wb") as out, pa.ipc.new_stream(out, table.schema) as ipc:
            ipc.write_table(table)
        older.replace(table_file)
        table_file.with_suffix(".rows").unlink()

    command = [sys.executable, "-c", OLD_STORE, str(written.path), str(state)]
    as_an_older_build_left_it()
    shown = on_a_terminal([*command, "show"])
    assert f"building the rows file of population {population[:12]}" in shown, shown
    assert "20000/20000 rows" in shown, shown
    as_an_older_build_left_it()
    assert on_a_terminal([*command, "hide"]) == ""
    as_an_older_build_left_it()
    piped = subprocess.run(
        [*command, "show"], capture_output=True, text=True, timeout=120, check=True
    )
    assert piped.stderr == ""
