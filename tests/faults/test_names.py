"""Issue 22, finding 3 and the audit half of finding 7: names and the audit CLI.

A loader state with ``"dataset": "../x"`` made ``python -m dataset_rt audit``
create a population store outside the state directory (a pointer file, a lock,
a population), and a wrong name created one inside a live server's state
directory. Every dataset name now passes the core's one name rule
(``storage::publish::validate_name``, exposed as ``_native.check_name``) before
it reaches a path, and the audit opens stores read-only
(``DatasetService::open_existing``): a missing one is NotFound, nothing is
created.

The audit CLI ended in a traceback on JSON nested 100k deep and on a
``batch_size`` of 2^40 (a report over no draw). Every bad input is now one line
on stderr and exit 2; `test_any_state_file_gets_exit_0_or_2` fuzzes the state
file's contents.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from audit.conftest import DATASET, SEED, label_of
from conftest import ListSource
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dataset_rt as drt
from dataset_rt import _native
from dataset_rt.audit import RunDescription
from dataset_rt.audit_cli import EXIT_BAD_INPUT
from dataset_rt.cli import main
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import LocalSource, RunState
from flight_server.catalog import Catalog, DatasetSpec
from flight_server.server import DatasetFlightServer

SMALL = int(os.environ.get("FUZZ_SMALL_EXAMPLES", "200"))
LARGE = int(os.environ.get("FUZZ_EXAMPLES", "2000"))

#: Positions per epoch of the saved state: small, so that a valid state's
#: report takes milliseconds.
EPOCH_LEN = 240

#: Rows a fuzzed state may ask the audit to compute (a valid state with an
#: epoch_len of 2^40 is a long job, not a fault): above it the example is skipped.
MAX_FUZZ_ROWS = 100_000


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    records = [
        drt.CacheInput(data=index.to_bytes(8, "little"), metadata={"label": label_of(index)})
        for index in range(400)
    ]
    (result,) = runtime.write_cache(
        ListSource(DATASET, records),
        tmp_path_factory.mktemp("names-cache"),
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def save_state(source: LocalSource, path: Path, **changes: Any) -> Path:
    """A loader state of ``source``'s active population, with ``changes``."""
    run = RunDescription.new(
        source, DATASET, seed=SEED, batch_size=8, world_size=2, epoch_len=EPOCH_LEN
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    state = run.state.to_dict() | changes
    # The run's shape is recorded twice: at the top and in its last resume.
    shape = {k: v for k, v in changes.items() if k in ("world_size", "batch_size")}
    state["resumes"][-1] |= shape
    path.write_text(json.dumps(state))
    return path


@pytest.fixture
def store(tmp_path: Path, cache: Path) -> LocalSource:
    """A population store two levels into tmp_path (so that ``../x`` from it
    is still inside tmp_path, where the listings look)."""
    return LocalSource([cache], tmp_path / "srv" / "state", name=DATASET)


@pytest.fixture
def server(store: LocalSource, runtime: drt.DatasetRuntime) -> Iterator[Path]:
    """A live server over ``store``'s caches and state dir; yields the state dir."""
    state_dir = Path(store.state_dir)
    catalog = Catalog([DatasetSpec(DATASET, tuple(map(Path, store.caches)))], state_dir, runtime)
    with DatasetFlightServer(catalog, "grpc://127.0.0.1:0"):
        yield state_dir


def listing(root: Path) -> list[str]:
    """Every file and directory under ``root``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def audit(*args: str | Path) -> tuple[int, str]:
    """``python -m dataset_rt audit ARGS`` in this process: (exit code, stderr).
    An exception out of it (a traceback) fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(["audit", *map(str, args)])
        except SystemExit as stop:  # argparse's usage errors
            code = int(stop.code or 0)
    return code, err.getvalue()


def where(source: LocalSource) -> list[str]:
    return ["--cache", *source.caches, "--state-dir", source.state_dir]


def assert_one_line(code: int, err: str, *expected: str) -> None:
    assert code == EXIT_BAD_INPUT, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")
    for part in expected:
        assert part in err


# -- names -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "x\\y"])
def test_a_state_naming_a_path_is_refused_and_creates_nothing(
    store: LocalSource, tmp_path: Path, name: str
) -> None:
    state = save_state(store, tmp_path / "run" / "state.json", dataset=name)
    before = listing(tmp_path)
    code, err = audit(state, *where(store), "--group", "label")
    assert_one_line(code, err, "dataset name", json.dumps(name), "plain directory name")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("name", ["../x", "a/b"])
def test_a_dataset_flag_naming_a_path_is_refused_and_creates_nothing(
    store: LocalSource, tmp_path: Path, name: str
) -> None:
    before = listing(tmp_path)
    keys = ["--dataset", name, "--seed", "1", "--batch-size", "8"]
    code, err = audit(*keys, *where(store), "--group", "label")
    assert_one_line(code, err, "dataset name", json.dumps(name))
    assert listing(tmp_path) == before


def test_a_wrong_name_creates_no_store_in_a_live_servers_state_dir(
    store: LocalSource, server: Path, tmp_path: Path
) -> None:
    state = save_state(store, tmp_path / "run" / "state.json", dataset="mxi")
    before = listing(tmp_path)
    code, err = audit(state, *where(store), "--group", "label")
    # Which dataset, which state dir, what it holds.
    assert_one_line(code, err, "'mxi'", str(server), f'["{DATASET}"]')
    keys = ["--dataset", "mxi", "--seed", "1", "--batch-size", "8"]
    assert_one_line(*audit(*keys, *where(store), "--group", "label"), "'mxi'")
    assert listing(tmp_path) == before
    # The right name still audits, through the same read-only opening.
    right = save_state(store, tmp_path / "run" / "right.json")
    before = listing(tmp_path)
    assert audit(right, *where(store), "--group", "label") == (0, "")
    assert listing(tmp_path) == before


def test_a_missing_state_dir_or_store_is_not_found_and_not_created(
    store: LocalSource, tmp_path: Path
) -> None:
    state = save_state(store, tmp_path / "run" / "state.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    before = listing(tmp_path)
    for state_dir, says in ((tmp_path / "nowhere", "does not exist"), (empty, "holds []")):
        code, err = audit(state, "--cache", *store.caches, "--state-dir", state_dir, "--group", "x")
        assert_one_line(code, err, str(state_dir), says)
    assert listing(tmp_path) == before


def test_the_name_rule_is_the_cores() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^dataset name \"a/b\" contains '/'"):
        _native.check_name("dataset", "a/b")
    _native.check_name("dataset", DATASET)
    state = {"version": 1, "dataset": "../x", "seed": 0, "shuffle": True, "columns": []}
    state |= {"epoch_len": 1, "batch_size": 1, "world_size": 1, "epoch": 0, "position": 0}
    state |= {"steps": 0, "segments": [[0, "0" * 32]]}
    with pytest.raises(InvalidArgumentError, match="dataset name"):
        RunState.from_dict(state)


# -- the audit's bad inputs --------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [b"[" * 100_000 + b"]" * 100_000, b'{"a": ' * 100_000 + b"1" + b"}" * 100_000],
    ids=["list", "dict"],
)
def test_json_nested_100k_deep_is_one_line_and_exit_2(
    store: LocalSource, tmp_path: Path, text: bytes
) -> None:
    state = tmp_path / "deep.json"
    state.write_bytes(text)
    done = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "audit", str(state), *where(store), "--group", "l"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert_one_line(done.returncode, done.stderr, "nested too deeply")


@pytest.mark.timeout(120)  # before the fix, a world of 2^32 ranks looped 2^32 times
@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"batch_size": 2**40}, "draws no sample"),
        ({"world_size": 2**32}, "draws no sample"),
        ({"world_size": 2**40}, "'world_size'"),
        ({"batch_size": 2**64}, "'batch_size'"),
        ({"batch_size": 2**70}, "'batch_size'"),
        ({"seed": 2**64}, "'seed'"),
        ({"epoch_len": 2**64}, "'epoch_len'"),
        ({"batch_size": -1}, "'batch_size'"),
        ({"batch_size": 1.5}, "'batch_size'"),
        ({"batch_size": True}, "'batch_size'"),
        ({"batch_size": "8"}, "'batch_size'"),
        ({"dataset": 7}, "'dataset'"),
        ({"segments": "x"}, "'segments'"),
        ({"columns": [1]}, "'columns'"),
    ],
)
def test_out_of_range_and_mistyped_keys_are_one_line_and_exit_2(
    store: LocalSource, tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    state = save_state(store, tmp_path / "state.json", **changes)
    assert_one_line(*audit(state, *where(store), "--group", "label"), says)


def test_a_checkpoint_epoch_of_2_40_seen_is_one_line_and_exit_2(
    store: LocalSource, tmp_path: Path
) -> None:
    state = save_state(store, tmp_path / "state.json", epoch=2**40)
    code, err = audit(state, *where(store), "--group", "label", "--seen")
    assert_one_line(code, err, "at most")
    code, err = audit(state, *where(store), "--group", "label", "--epochs", "0-99999999999")
    assert code == 2  # argparse's usage error
    assert "at most" in err


def test_unreadable_state_files_and_bad_outputs_are_one_line_and_exit_2(
    store: LocalSource, tmp_path: Path
) -> None:
    folder = tmp_path / "folder.json"
    folder.mkdir()
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "gone.json")
    not_utf8 = tmp_path / "latin.json"
    not_utf8.write_bytes(b'{"dataset": "\xe9"}')
    huge = tmp_path / "huge.json"
    huge.write_bytes(b'{"seed": ' + b"9" * 5000 + b"}")
    torch_like = tmp_path / "broken.pt"
    torch_like.write_bytes(b"not a checkpoint")
    for state in (folder, dangling, not_utf8, huge, tmp_path / "nothing.json"):
        assert_one_line(*audit(state, *where(store), "--group", "label"), str(state))
    # A checkpoint torch cannot read, or (without torch) cannot be read at all.
    assert_one_line(*audit(torch_like, *where(store), "--group", "label"), str(torch_like))
    good = save_state(store, tmp_path / "state.json")
    for flags in (
        ["--manifest", str(tmp_path / "no" / "m.parquet")],
        ["--group", "label", "--report", str(tmp_path / "r.txt")],
        ["--group", "label", "--read-manifest", str(good)],
        ["--group", "label", "--steps", "1000:2000"],
    ):
        assert_one_line(*audit(good, *where(store), *flags))


# -- fuzz --------------------------------------------------------------------------

#: What a state's values are replaced with.
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [2**40, 2**63, 2**64, 2**70, -1, -(2**64), 0, 1.5, float("nan"), True, None, "", []]
    ),
    st.sampled_from(["../x", "a/b", "..", ".", "/", "x\x00y", "mxi", DATASET, "é" * 300]),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    ),
)


@st.composite
def state_files(draw: st.DrawFn, valid: dict[str, Any]) -> bytes:
    """A saved state with keys replaced, removed or added; or any JSON; or bytes."""
    kind = draw(st.sampled_from(["edited", "edited", "edited", "json", "bytes", "wrapped"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return json.dumps(draw(HOSTILE_VALUES)).encode()
    state = dict(valid)
    for key in draw(st.lists(st.sampled_from([*valid, "extra"]), min_size=1, max_size=3)):
        if draw(st.booleans()) and key in state:
            del state[key]
        else:
            state[key] = draw(HOSTILE_VALUES)
    return json.dumps({"loader": state} if kind == "wrapped" else state).encode()


def check_state_file(source: LocalSource, path: Path, text: bytes) -> None:
    """The audit of any state file exits 0 or 2 with no traceback, and creates
    nothing in the state dir."""
    try:
        loaded = json.loads(text)
        if isinstance(loaded, dict) and "loader" in loaded and "version" not in loaded:
            loaded = loaded["loader"]
        run = RunDescription.from_state(loaded)
        if run.rows() > MAX_FUZZ_ROWS:
            return  # a long job, not a fault
    except Exception:  # refused: exactly what the audit must answer cleanly
        pass
    path.write_bytes(text)
    state_dir = Path(source.state_dir)
    before = listing(state_dir)
    code, err = audit(path, *where(source), "--group", "label")
    assert code in (0, EXIT_BAD_INPUT), err
    assert "Traceback" not in err
    if code:
        assert len(err.strip().splitlines()) == 1, err
    assert listing(state_dir) == before


FUZZ = settings(
    deadline=None,  # 2 shared cores; each example is bounded by MAX_FUZZ_ROWS instead
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def valid(store: LocalSource, tmp_path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(save_state(store, tmp_path / "valid.json").read_text())
    return loaded


@pytest.mark.timeout(900)
def test_any_state_file_gets_exit_0_or_2(
    store: LocalSource, tmp_path: Path, valid: dict[str, Any]
) -> None:
    @settings(FUZZ, max_examples=SMALL, derandomize=True)
    @given(text=state_files(valid))
    @example(text=b"[" * 100_000 + b"]" * 100_000)
    @example(text=json.dumps(valid | {"batch_size": 2**40}).encode())
    @example(text=json.dumps(valid | {"dataset": "../x"}).encode())
    def run(text: bytes) -> None:
        check_state_file(store, tmp_path / "fuzzed.json", text)

    run()


@pytest.mark.fuzz
@pytest.mark.timeout(max(900, LARGE))
def test_any_state_file_gets_exit_0_or_2_at_length(
    store: LocalSource, tmp_path: Path, valid: dict[str, Any]
) -> None:
    @settings(FUZZ, max_examples=LARGE, print_blob=True)
    @given(text=state_files(valid))
    def run(text: bytes) -> None:
        check_state_file(store, tmp_path / "fuzzed.json", text)

    run()
