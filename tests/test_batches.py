"""`BatchLoader`: the training loader without PyTorch (NumPy or Arrow batches,
for JAX and other consumers), checked against the engine's own stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import ListSource, make_records

import dataset_rt as drt
from dataset_rt.batches import BatchLoader
from dataset_rt.loader import LocalSource
from dataset_rt.service import StreamRequest

DATASET = "toy"
RECORDS = 300
SEED = 5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    root = tmp_path_factory.mktemp("batches")
    (result,) = runtime.write_cache(
        ListSource("b", make_records(RECORDS, payload_size=24)),
        root,
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture
def source(cache: Path, tmp_path: Path) -> LocalSource:
    return LocalSource([cache], tmp_path / "state", name=DATASET)


def loader(source: LocalSource, **options: Any) -> BatchLoader:
    options.setdefault("batch_size", 10)
    options.setdefault("seed", SEED)
    return BatchLoader(source, DATASET, columns=["label"], **options)


def test_numpy_batches_hold_arrays_and_payload_bytes(source: LocalSource) -> None:
    batches = list(loader(source))
    assert len(batches) == RECORDS // 10
    first = batches[0]
    assert sorted(first) == ["cache_id", "label", "payload", "position", "sample_id"]
    for name in ("position", "cache_id", "sample_id"):
        assert isinstance(first[name], np.ndarray)
        assert first[name].dtype == np.uint64
        assert first[name].flags.writeable
    assert isinstance(first["label"], np.ndarray)
    assert isinstance(first["payload"], list)
    assert isinstance(first["payload"][0], bytes)
    positions = np.concatenate([b["position"] for b in batches])
    assert positions.tolist() == list(range(RECORDS))


def test_batches_are_the_engines_stream_cut_in_blocks(source: LocalSource) -> None:
    """Every rank's batches are blocks r, r + w, ... of one epoch stream."""
    whole = pa.Table.from_batches(
        list(source.open(StreamRequest(dataset=DATASET, seed=SEED, epoch=0, columns=["label"])))
    )
    for rank in range(3):
        for q, table in enumerate(loader(source, rank=rank, world_size=3, batch_format="arrow")):
            assert isinstance(table, pa.Table)
            block = rank + 3 * q
            assert table.equals(whole.slice(block * 10, 10).combine_chunks(), check_metadata=False)


def test_checkpoint_resumes_at_another_world_size_exactly_once(source: LocalSource) -> None:
    ranks = [loader(source, rank=r, world_size=2) for r in range(2)]
    iters = [iter(r) for r in ranks]
    seen = [int(p) for _ in range(4) for it in iters for p in next(it)["position"]]
    state = ranks[0].state_dict()
    resumed = [loader(source, rank=r, world_size=3, batch_size=5) for r in range(3)]
    for r in resumed:
        r.load_state_dict(state)
        seen += [int(p) for b in r for p in b["position"]]
    # A prefix, each position once; the tail the partition rule drops at 3 x 5
    # (docs/training.md, "The dropped tail") is the rest.
    assert sorted(seen) == list(range(80 + (RECORDS - 80) // 15 * 15))


def test_epochs_need_set_epoch_and_differ(source: LocalSource) -> None:
    one = loader(source)
    first = [b["sample_id"].tolist() for b in one]
    with pytest.raises(drt.InvalidArgumentError, match=r"set_epoch\(1\)"):
        next(iter(one))
    one.set_epoch(1)
    second = [b["sample_id"].tolist() for b in one]
    assert first != second
    assert len(first) == len(second)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_format": "torch"}, "'batch_format' must be one of 'numpy', 'arrow'"),
        ({"rank": 2, "world_size": 2}, r"'rank' must be in \[0, world_size=2\)"),
        ({"world_size": 0}, "'world_size' in the loader options: .* expected an integer >= 1"),
        ({"batch_size": 0}, "'batch_size' in the loader options: .* expected an integer >= 1"),
        ({"seed": -1}, "'seed' in the loader options: .* expected an integer >= 0"),
        ({"shuffle": "sometimes"}, "'shuffle' in the loader options"),
        ({"bacth_size": 8}, "unknown field 'bacth_size', expected one of .*'batch_size'"),
    ],
)
def test_bad_options_are_refused_naming_them(
    source: LocalSource, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(drt.InvalidArgumentError, match=message):
        loader(source, **options)
