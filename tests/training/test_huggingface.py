"""`HFIterableDataset` against the real Hugging Face ``datasets.IterableDataset``
over the same examples: the same values in every format, the same batches, the
same checkpoint and resume pattern, the same DataLoader collation. Where ours
differs it says why (uint64 stays uint64; payloads stay bytes)."""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch

import dataset_rt as drt
from dataset_rt.batches import BatchLoader
from dataset_rt.integrations.huggingface import HFIterableDataset
from dataset_rt.loader import LocalSource

from .conftest import DATASET, RECORDS, SEED

BLOCK = 16
USED = RECORDS // BLOCK * BLOCK  # the partition rule drops the tail of the last block
IDS = ("position", "cache_id", "sample_id")  # uint64: cache ids use all 64 bits


def ours(source: LocalSource, **options: Any) -> HFIterableDataset:
    options.setdefault("block", BLOCK)
    return HFIterableDataset(source, DATASET, seed=SEED, columns=["label"], **options)


def reference(source: LocalSource) -> Any:
    """Hugging Face's IterableDataset over the examples ours yields in epoch 0."""
    whole = BatchLoader(
        source, DATASET, batch_size=BLOCK, seed=SEED, columns=["label"], batch_format="arrow"
    )
    table = pa.concat_tables(list(whole))
    assert table.num_rows == USED
    return datasets.Dataset(table).to_iterable_dataset()


def same_value(mine: Any, theirs: Any, name: str) -> None:
    if name == "payload":
        # Hugging Face's NumPy format gives an 'S' value, which loses trailing
        # NUL bytes; ours stays the payload's bytes.
        assert isinstance(mine, bytes)
        assert mine.rstrip(b"\0") == bytes(theirs).rstrip(b"\0")
    elif name in IDS and isinstance(theirs, torch.Tensor | np.ndarray | np.generic):
        # Hugging Face casts uint64 to int64 in tensors and batches (a cache id
        # above 2^63 would wrap); ours stays uint64.
        assert str(getattr(mine, "dtype", "")).endswith("uint64")
    else:
        assert type(mine) is type(theirs), name
        if hasattr(theirs, "dtype"):
            assert mine.dtype == theirs.dtype, name
        assert np.array_equal(np.asarray(mine), np.asarray(theirs)), name


@pytest.mark.parametrize("form", [None, "numpy", "torch"])
def test_examples_are_huggingfaces_in_every_format(source: LocalSource, form: str | None) -> None:
    mine = list(ours(source).with_format(form))
    theirs = list(reference(source).with_format(form))
    exact = list(reference(source))
    assert len(mine) == len(theirs) == USED
    for a, b, e in zip(mine, theirs, exact, strict=True):
        assert list(a) == list(b)
        assert a["payload"] == e["payload"]
        for name in a:
            same_value(a[name], b[name], name)


def test_arrow_examples_and_batches(source: LocalSource) -> None:
    mine = ours(source).with_format("arrow")
    rows = list(mine.iter(batch_size=10))
    theirs = list(reference(source).with_format("arrow").iter(batch_size=10))
    assert [r.num_rows for r in rows] == [t.num_rows for t in theirs]
    mine_table, their_table = pa.concat_tables(rows), pa.concat_tables(theirs)
    # The same columns and types (Hugging Face's schema drops "not null").
    assert [(f.name, f.type) for f in mine_table.schema] == [
        (f.name, f.type) for f in their_table.schema
    ]
    assert mine_table.to_pydict() == their_table.to_pydict()


@pytest.mark.parametrize("form", [None, "numpy", "torch"])
def test_batches_are_huggingfaces(source: LocalSource, form: str | None) -> None:
    mine = list(ours(source).with_format(form).iter(batch_size=7))
    theirs = list(reference(source).with_format(form).iter(batch_size=7))
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert list(a) == list(b)
        if form is None:
            assert a == b
            continue
        for name in a:
            if name == "payload":  # a list of bytes (HF: an 'S' array, trailing NULs lost)
                assert all(isinstance(x, bytes) for x in a[name])
                assert [x.rstrip(b"\0") for x in a[name]] == [
                    bytes(x).rstrip(b"\0") for x in b[name]
                ]
            elif name in IDS:
                assert str(a[name].dtype).endswith("uint64")
            else:
                same_value(a[name], b[name], name)


def test_state_dict_resumes_after_the_last_example_as_huggingfaces_does(
    source: LocalSource,
) -> None:
    """The pattern of Hugging Face's docs: iterate, stop, state_dict(), later
    load_state_dict() and iterate: the rest, from the next example. Stops inside
    a block and on a block boundary."""
    for stop in (37, 2 * BLOCK - 1):
        results = []
        for make in (lambda: ours(source), lambda: reference(source)):
            ds = make()
            head = []
            for index, example in enumerate(ds):
                head.append(example["position"])
                if index == stop:
                    break
            state = ds.state_dict()
            fresh = make()
            fresh.load_state_dict(state)
            results.append(head + [e["position"] for e in fresh])
        mine, theirs = results
        assert mine == theirs
        assert sorted(mine) == list(range(USED))


def test_iterating_again_continues_and_an_epoch_needs_set_epoch(source: LocalSource) -> None:
    """Unlike Hugging Face's, a second `for` continues (it would otherwise
    deliver the epoch's first examples twice); a finished epoch says what to do."""
    ds = ours(source)
    first = []
    for example in ds:
        first.append(example["position"])
        if len(first) == 5:
            break
    first += [e["position"] for e in ds]
    assert first == list(range(USED))
    with pytest.raises(drt.InvalidArgumentError, match=r"set_epoch\(1\)"):
        next(iter(ds))
    ds.set_epoch(1)
    assert ds.epoch == 1
    assert [e["position"] for e in ds] == list(range(RECORDS, RECORDS + USED))


def test_ranks_share_each_epoch_and_a_boundary_state_resumes_at_another_world_size(
    source: LocalSource,
) -> None:
    two = [ours(source, rank=r, world_size=2) for r in range(2)]
    iters = [iter(d) for d in two]
    seen = [next(it)["position"] for _ in range(3 * BLOCK) for it in iters]
    state = two[0].state_dict()
    assert state["examples"] == 0  # three whole blocks per rank: a boundary
    three = [ours(source, rank=r, world_size=3) for r in range(3)]
    for d in three:
        d.load_state_dict(state)
        seen += [e["position"] for e in d]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == list(range(len(seen)))


def test_a_state_inside_a_block_resumes_only_where_it_was_taken(source: LocalSource) -> None:
    ds = ours(source)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = ds.state_dict()
    assert state["examples"] == 5
    with pytest.raises(drt.InvalidArgumentError, match="resumes only with world size 1 and block"):
        ours(source, block=8).load_state_dict(state)
    with pytest.raises(drt.InvalidArgumentError, match="'examples' must be an integer"):
        ours(source).load_state_dict({"run": state["run"], "examples": BLOCK})
    with pytest.raises(drt.InvalidArgumentError, match="an HFIterableDataset state is"):
        ours(source).load_state_dict(state["run"])


def test_a_dataloader_collates_it_as_huggingfaces(source: LocalSource) -> None:
    loader = torch.utils.data.DataLoader(ours(source).with_format("torch"), batch_size=8)
    reference_loader = torch.utils.data.DataLoader(
        reference(source).with_format("torch"), batch_size=8
    )
    payloads = [e["payload"] for e in reference(source)]
    exact = [payloads[i : i + 8] for i in range(0, len(payloads), 8)]
    for a, b, e in zip(loader, reference_loader, exact, strict=True):
        # Hugging Face's torch format loses a payload's trailing NUL bytes too.
        assert a["payload"] == e
        assert [x.rstrip(b"\0") for x in a["payload"]] == [x.rstrip(b"\0") for x in b["payload"]]
        assert torch.equal(a["label"], b["label"])
        assert a["position"].tolist() == b["position"].tolist()


def test_dataloader_workers_are_refused_naming_the_loader_that_has_them(
    source: LocalSource,
) -> None:
    loader = torch.utils.data.DataLoader(
        ours(source), batch_size=4, num_workers=1, multiprocessing_context="spawn"
    )
    with pytest.raises(Exception, match=r"DatasetLoader\(num_workers=n\)"):
        next(iter(loader))
