"""A new loader's first batch does not wait for imports it could have done
earlier or never needed, nor for its workers (issue 47, deliverable 4).

- A loader with workers starts their forkserver when it is built: the server's
  import of torch, pyarrow and the engine overlaps the trainer's own work
  until the first ``iter()``.
- Until its workers have started, the trainer reads the first batches itself.
- No process imports pandas to make a batch: the forkserver does not preload
  it, and columns become NumPy arrays through DLPack and their bits
  (`dataset_rt.batches.numpy_column`), not through pyarrow's ``to_numpy``,
  whose pandas code imports pandas.

The loader checks run in a new interpreter each (this one started a forkserver
and imported pandas long ago). pandas is blocked there by a package of that
name, first on ``PYTHONPATH`` so that the forkserver and the workers see it too,
which notes every process that tries to import it and fails the import. No
assertion here is about time: the benchmark is benchmarks/bench_loader_start.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataset_rt.batches import numpy_column

from .conftest import DATASET, RECORDS

TIMEOUT = 240

HEADER = textwrap.dedent(
    """
    import json, multiprocessing.forkserver, os, sys
    from dataset_rt.loader import LocalSource
    from dataset_rt.torch import DatasetLoader

    def server():
        return multiprocessing.forkserver._forkserver._forkserver_pid
    """
)

#: Builds loaders and says, after each, whether a forkserver runs (its pid);
#: then iterates the last one.
STARTS = HEADER + textwrap.dedent(
    """
    if __name__ == "__main__":
        source = LocalSource([sys.argv[1]], sys.argv[2], name=sys.argv[3])
        seen = {}
        DatasetLoader(source, sys.argv[3], batch_size=10, seed=1)
        seen["0 workers"] = server()
        DatasetLoader(
            source, sys.argv[3], batch_size=10, seed=1, num_workers=2,
            multiprocessing_context="spawn",
        )
        seen["spawn"] = server()
        loader = DatasetLoader(source, sys.argv[3], batch_size=10, seed=1, num_workers=2)
        pid = seen["forkserver, built"] = server()
        if pid is not None:
            with open(f"/proc/{pid}/stat") as stat:  # "pid (comm) state ppid ..."
                seen["its parent"] = int(stat.read().rsplit(")", 1)[1].split()[1])
        seen["first batch"] = [int(p) for p in next(iter(loader))["position"]]
        seen["forkserver, iterated"] = server()
        if pid is not None:  # read now: just after the start it may not have run exec yet
            with open(f"/proc/{pid}/cmdline", "rb") as command:
                seen["its command"] = command.read().decode(errors="replace")
        print(json.dumps({"pid": os.getpid(), "seen": seen}))
    """
)

#: Reads every requested column with 0 and 2 workers, and with a transform.
READS = HEADER + textwrap.dedent(
    """
    COLUMNS = ["label", "score", "flag", "name"]

    def as_sample(sample):  # cache ids (64 bits) and payloads do not collate to tensors
        return {k: v for k, v in sample.items() if k not in ("cache_id", "payload")}

    def column(batch, name):
        value = batch[name]
        return value.tolist() if hasattr(value, "tolist") else list(value)

    if __name__ == "__main__":
        source = LocalSource([sys.argv[1]], sys.argv[2], name=sys.argv[3])
        runs = {}
        for name, options in [
            ("0 workers", {}),
            ("2 workers", {"num_workers": 2}),
            ("2 workers, transform", {"num_workers": 2, "transform": as_sample}),
        ]:
            loader = DatasetLoader(
                source, sys.argv[3], batch_size=10, seed=1, columns=COLUMNS, **options
            )
            batches = list(loader)
            runs[name] = {
                "dtypes": {k: str(v.dtype) for k, v in batches[0].items() if hasattr(v, "dtype")},
                "rows": [
                    row
                    for batch in batches
                    for row in zip(*(column(batch, k) for k in ["sample_id", *COLUMNS]))
                ],
            }
        print(json.dumps(runs))
    """
)


#: A trainer whose workers are slow to start (their import of the script sleeps,
#: as a script with heavy imports would): it reads an epoch with 2 workers and
#: says what it got and when the workers were up.
HEAD_START = HEADER + textwrap.dedent(
    """
    import time

    UP = os.environ["WORKERS_UP"]
    if __name__ != "__main__":  # a worker importing the script
        time.sleep(3)
        open(os.path.join(UP, str(os.getpid())), "w").close()

    def positions(loader):
        return [batch["position"].tolist() for batch in loader]

    def as_sample(sample):
        return {"position": sample["position"]}

    if __name__ == "__main__":
        source = LocalSource([sys.argv[1]], sys.argv[2], name=sys.argv[3])
        options = {"batch_size": 5, "seed": 1}
        expected = [
            positions(DatasetLoader(source, sys.argv[3], epoch=epoch, **options))
            for epoch in (0, 1)
        ]
        loader = DatasetLoader(source, sys.argv[3], num_workers=2, **options)
        got, up_at_first = [], None
        for index, batch in enumerate(loader):
            got.append(batch["position"].tolist())
            if index == 0:
                up_at_first = os.listdir(UP)
            if index == 5:  # the workers start while the trainer goes on
                deadline = time.monotonic() + 180
                while len(os.listdir(UP)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
            if index > 5:
                time.sleep(0.1)  # a training step
        first_epoch = loader.input_stats()["trainer_batches"]
        loader.set_epoch(1)
        second = positions(loader)
        workers_up = len(os.listdir(UP))
        transformed = DatasetLoader(
            source, sys.argv[3], num_workers=2, transform=as_sample, **options
        )
        read = len(positions(transformed))
        print(json.dumps({
            "expected": expected,
            "got": [got, second],
            "up_at_first": up_at_first,
            "workers_up": workers_up,
            "trainer_batches": [first_epoch, loader.input_stats()["trainer_batches"]],
            "transformed": [read, transformed.input_stats()["trainer_batches"]],
        }))
    """
)


def run_script(
    tmp_path: Path, cache: Path, script: str, env: dict[str, str] | None = None
) -> tuple[Any, list[str]]:
    """Run ``script`` in a new interpreter, with pandas blocked in it and in
    every process it starts; its last line of output (JSON) and the imports of
    pandas that were tried."""
    blocked = tmp_path / "blocked"
    (blocked / "pandas").mkdir(parents=True)
    tried = tmp_path / "pandas-imports.log"
    (blocked / "pandas" / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            import os, sys, traceback
            with open({str(tried)!r}, "a") as log:
                log.write(f"pid {{os.getpid()}} ({{sys.argv[:2]}}):\\n")
                log.write("".join(traceback.format_stack()[-12:]) + "\\n")
            raise ImportError("pandas is blocked by tests/training/test_first_batch.py")
            """
        )
    )
    (tmp_path / "train.py").write_text(script)
    path = [str(blocked), os.environ.get("PYTHONPATH", "")]
    done = subprocess.run(
        [sys.executable, "train.py", str(cache), str(tmp_path / "state"), DATASET],
        cwd=tmp_path,
        env={**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(p for p in path if p)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imports = tried.read_text().split("\n\n")[:-1] if tried.exists() else []
    return json.loads(done.stdout.strip().splitlines()[-1]), imports


def test_a_loader_with_workers_starts_its_forkserver_when_built(
    tmp_path: Path, cache: Path
) -> None:
    """Right after the loader is built, before any ``iter()``, the forkserver
    runs (a child of the trainer); its workers then come from that server.
    Loaders that start no forkserver (no workers, ``spawn``) do not start one."""
    answer, _ = run_script(tmp_path, cache, STARTS)
    seen = answer["seen"]
    assert seen["0 workers"] is None
    assert seen["spawn"] is None
    assert seen["forkserver, built"] is not None, "the forkserver waited for iter()"
    assert seen["its parent"] == answer["pid"]
    assert "multiprocessing.forkserver" in seen["its command"]
    assert seen["first batch"] == list(range(10))
    assert seen["forkserver, iterated"] == seen["forkserver, built"]


def test_no_process_imports_pandas_to_make_batches(tmp_path: Path, cache: Path) -> None:
    """Numbers, floats, booleans and strings, in the trainer (0 workers) and in
    workers, with and without a transform: the batches are right and no
    process (trainer, forkserver, worker) tried to import pandas."""
    runs, imports = run_script(tmp_path, cache, READS)
    assert imports == [], "pandas was imported:\n" + "\n\n".join(imports)
    assert set(runs) == {"0 workers", "2 workers", "2 workers, transform"}
    for name, run in runs.items():
        # the toy records (tests/conftest.py make_records): record i has label
        # i % 3, score i / 2, flag i % 2 == 0, name f"r{i}"
        expected = [[i, i % 3, i / 2, i % 2 == 0, f"r{i}"] for i, *_ in run["rows"]]
        assert run["rows"] == expected, name
        assert len(run["rows"]) == RECORDS, name
    for name in ("0 workers", "2 workers"):
        assert runs[name]["dtypes"] == {
            "position": "torch.uint64",
            "cache_id": "torch.uint64",
            "sample_id": "torch.uint64",
            "label": "torch.int64",
            "score": "torch.float64",
            "flag": "torch.bool",
        }, name


def test_the_first_batches_do_not_wait_for_the_workers(tmp_path: Path, cache: Path) -> None:
    """A new 2-worker loader's first batches are read by the trainer itself
    while its workers start (here they take seconds to import the script);
    the workers then go on from where the trainer is, and the epoch is exactly
    the one a loader without workers reads, batch for batch. The next epoch
    comes from the workers alone. With a ``transform`` (the workers' job) the
    trainer reads nothing itself."""
    up = tmp_path / "up"
    up.mkdir()
    answer, _ = run_script(tmp_path, cache, HEAD_START, {"WORKERS_UP": str(up)})
    assert answer["up_at_first"] == [], "the first batch waited for the workers"
    assert answer["workers_up"] == 2
    assert answer["got"] == answer["expected"]
    first_epoch, both = answer["trainer_batches"]
    batches = len(answer["expected"][0])
    assert 6 <= first_epoch < batches, "the workers took over within the first epoch"
    assert both == first_epoch, "the second epoch came from the workers"
    assert answer["transformed"] == [batches, 0]


#: Takes one batch and ends while the workers are still starting.
ONE_BATCH = HEADER + textwrap.dedent(
    """
    if __name__ == "__main__":
        source = LocalSource([sys.argv[1]], sys.argv[2], name=sys.argv[3])
        loader = DatasetLoader(source, sys.argv[3], batch_size=10, seed=1, num_workers=2)
        print(json.dumps({"first": [int(p) for p in next(iter(loader))["position"]]}))
    """
)


def test_a_trainer_that_ends_while_its_workers_start_ends_quietly(
    tmp_path: Path, cache: Path
) -> None:
    """A script that takes the first batch (read by the trainer) and ends while
    the workers start: the exit waits for them, so no half-made worker prints
    a traceback (their semaphores would be gone). The captured stderr closes
    only when the forkserver and every worker have let go of it."""
    (tmp_path / "train.py").write_text(ONE_BATCH)
    done = subprocess.run(
        [sys.executable, "train.py", str(cache), str(tmp_path / "state"), DATASET],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"first": list(range(10))}
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


# -- numpy_column is to_numpy without pandas ---------------------------------------

#: (Arrow type, NumPy type, hypothesis strategy of one value)
KINDS: list[tuple[pa.DataType, Any, st.SearchStrategy[Any]]] = [
    *(
        (pa.from_numpy_dtype(t), t, st.integers(int(np.iinfo(t).min), int(np.iinfo(t).max)))
        for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
    ),
    (pa.float16(), np.float16, st.floats(width=16)),
    (pa.float32(), np.float32, st.floats(width=32)),
    (pa.float64(), np.float64, st.floats()),
    (pa.bool_(), np.bool_, st.booleans()),
]


@st.composite
def arrays(draw: st.DrawFn) -> pa.Array | pa.ChunkedArray:
    """An Array or a ChunkedArray of one of `KINDS`, with or without nulls,
    whose chunks are slices (offsets not a multiple of 8 included) of larger
    arrays."""
    kind, numpy_type, value = draw(st.sampled_from(KINDS))
    pieces = []
    for _ in range(draw(st.integers(0, 4))):
        values = draw(st.lists(value, max_size=40))
        nulls = draw(st.sampled_from(["none", "some", "all"]))
        mask = None
        if nulls != "none":
            some = st.lists(st.booleans(), min_size=len(values), max_size=len(values))
            mask = np.ones(len(values), bool) if nulls == "all" else np.array(draw(some), bool)
        whole = pa.array(np.array(values, dtype=numpy_type), type=kind, mask=mask)
        start = draw(st.integers(0, len(whole)))
        stop = draw(st.integers(start, len(whole)))
        pieces.append(whole.slice(start, stop - start))
    if len(pieces) == 1 and draw(st.booleans()):
        return pieces[0]
    return pa.chunked_array(pieces, type=kind)


def to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, Any]:
    """What pyarrow makes of ``array`` (through its pandas code)."""
    if isinstance(array, pa.ChunkedArray) and array.num_chunks == 0:
        return np.array([], dtype=array.type.to_pandas_dtype())
    converted: np.ndarray[Any, Any] = array.to_numpy(zero_copy_only=False)
    return converted


@settings(max_examples=400, deadline=None, derandomize=True)
@given(array=arrays())
def test_numpy_column_equals_pyarrows_to_numpy(array: pa.Array | pa.ChunkedArray) -> None:
    expected = to_numpy(array)
    got = numpy_column(array)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    if got.dtype == object:  # booleans with nulls: True, False and None
        assert got.tolist() == expected.tolist()
    else:
        np.testing.assert_array_equal(got, expected)  # NaN equals NaN here
        assert np.signbit(got).tolist() == np.signbit(expected).tolist()  # -0.0 stays
    assert got.flags.writeable
    assert got.flags.c_contiguous


def test_numpy_column_owns_its_values() -> None:
    """The array is a copy: writing to it leaves the batch's Arrow data alone."""
    source = pa.array(np.arange(20, dtype=np.int64)).slice(3, 10)
    got = numpy_column(source)
    got[:] = -1
    assert source.to_pylist() == list(range(3, 13))


def test_numpy_column_refuses_other_types() -> None:
    from dataset_rt.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="string"):
        numpy_column(pa.array(["a"]))
