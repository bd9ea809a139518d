"""`HFIterableDataset`: a real Hugging Face ``datasets.IterableDataset`` over the
engine's stream, tested against a ``datasets.IterableDataset`` over the same
examples (``reference``): the same API (``take``, ``skip``, ``select_columns``,
``remove_columns``, ``map``, ``filter``, ``features``, ``n_shards``), the same
values in every format (payloads and uint64 ids exact where Hugging Face's own
formats change them), the same checkpoint pattern, resumed exactly; one
process reads every example of an epoch, ranks keep the tail rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch

import dataset_rt as drt
from dataset_rt.batches import BatchLoader
from dataset_rt.integrations.huggingface import HFIterableDataset
from dataset_rt.loader import LocalSource, RunState

from .conftest import DATASET, RECORDS, SEED, only_label

BLOCK = 16
IDS = ("position", "cache_id", "sample_id")  # uint64: cache ids use all 64 bits


def ours(source: LocalSource, **options: Any) -> HFIterableDataset:
    options.setdefault("block", BLOCK)
    return HFIterableDataset(source, DATASET, seed=SEED, columns=["label"], **options)


def reference(source: LocalSource) -> Any:
    """Hugging Face's IterableDataset over the examples of epoch 0."""
    whole = BatchLoader(
        source, DATASET, batch_size=100, seed=SEED, columns=["label"], batch_format="arrow"
    )
    table = pa.concat_tables(list(whole))
    assert table.num_rows == RECORDS
    return datasets.Dataset(table).to_iterable_dataset()


def position(example: Any) -> int:
    if isinstance(example, pa.Table):  # the arrow format: one-row tables
        return int(example.column("position")[0].as_py())
    return int(example["position"])


def positions(examples: Any) -> list[int]:
    return [position(example) for example in examples]


def head(ds: Any, count: int) -> list[int]:
    """The positions of ``ds``'s first ``count`` examples, read from ``ds``
    itself (its state moves; ``ds.take(n)`` is another dataset with its own)."""
    got = []
    for example in ds:
        got.append(position(example))
        if len(got) == count:
            break
    return got


def exact_int(value: Any) -> int:
    """A uint64 as a Python int (torch's ``int()`` and ``tolist()`` refuse one
    above 2**63)."""
    return int(np.asarray(value))


def place(state: dict[str, Any]) -> dict[str, Any]:
    """Our live place inside Hugging Face's (nested) state (not a snapshot a
    wrapper keeps as its ``previous_state``)."""
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("type") == "DatasetRTExamples":
                found.append(value)
            else:
                for key, item in value.items():
                    if key != "previous_state":
                        walk(item)

    walk(state["examples_iterable"])
    assert len(found) == 1, state
    return found[0]


# -- the datasets API --------------------------------------------------------------


def test_it_is_a_datasets_iterable_dataset_with_its_api(source: LocalSource) -> None:
    ds = ours(source)
    theirs = reference(source)
    assert isinstance(ds, datasets.IterableDataset)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    assert ds.features == theirs.features
    assert ds.column_names == theirs.column_names
    assert ds.features["cache_id"] == datasets.Value("uint64")
    assert ds.n_shards == ds.num_shards == 1
    assert len(ds) == RECORDS
    assert positions(ds.take(5)) == [0, 1, 2, 3, 4]
    assert positions(ds.skip(RECORDS - 3)) == [RECORDS - 3, RECORDS - 2, RECORDS - 1]
    labels = ds.select_columns(["label"])
    assert list(labels.take(3)) == list(theirs.select_columns("label").take(3))
    assert ds.select_columns(["position", "label"]).column_names == ["position", "label"]
    assert list(ds.remove_columns(["payload"]).take(3)) == list(
        theirs.remove_columns(["payload"]).take(3)
    )
    assert "payload" not in ds.remove_columns("payload").column_names
    assert list(ds.rename_column("label", "y").take(2)) == list(
        theirs.rename_column("label", "y").take(2)
    )

    def double(example: dict[str, Any]) -> dict[str, Any]:
        return {"twice": example["label"] * 2}

    def every_third(example: dict[str, Any]) -> bool:
        return example["position"] % 3 == 0

    mapped = list(ds.map(double).filter(every_third))
    assert mapped == list(theirs.map(double).filter(every_third))
    assert positions(mapped) == list(range(0, RECORDS, 3))
    assert [len(b["label"]) for b in ds.batch(batch_size=200)] == [200, 200, 100]
    mixed = datasets.interleave_datasets([ds.take(3), ours(source).skip(100).take(3)])
    expected = datasets.interleave_datasets([theirs.take(3), theirs.skip(100).take(3)])
    assert positions(mixed) == positions(expected) == [0, 100, 1, 101, 2]
    shuffled = positions(ds.shuffle(seed=0, buffer_size=50))
    assert shuffled != list(range(RECORDS))
    assert sorted(shuffled) == list(range(RECORDS))


def test_examples_are_huggingfaces_in_python_and_arrow(source: LocalSource) -> None:
    assert list(ours(source)) == list(reference(source))
    mine = pa.concat_tables(list(ours(source).with_format("arrow").iter(batch_size=10)))
    theirs = pa.concat_tables(list(reference(source).with_format("arrow").iter(batch_size=10)))
    assert mine.schema == theirs.schema
    assert mine.to_pydict() == theirs.to_pydict()


@pytest.mark.parametrize("form", ["numpy", "np", "torch", "pt"])
def test_numpy_and_torch_are_huggingfaces_with_payloads_and_ids_exact(
    source: LocalSource, form: str
) -> None:
    """Hugging Face's NumPy and torch formats make a payload an 'S' value, which
    loses trailing NUL bytes, and cast uint64 to int64 in tensors and batches
    (a cache id above 2**63 wraps); ours keeps both, the rest is theirs."""
    exact = list(reference(source))
    mine = list(ours(source).with_format(form))
    theirs = list(reference(source).with_format(form))
    assert len(mine) == len(theirs) == RECORDS
    for a, b, e in zip(mine, theirs, exact, strict=True):
        assert list(a) == list(b)
        assert a["payload"] == e["payload"]
        assert isinstance(a["payload"], bytes)
        for name in IDS:
            assert str(a[name].dtype).endswith("uint64")
            assert exact_int(a[name]) == e[name]
        assert type(a["label"]) is type(b["label"])
        assert a["label"].dtype == b["label"].dtype
        assert a["label"] == b["label"]
    batch = next(ours(source).with_format(form).iter(batch_size=7))
    assert batch["payload"] == [e["payload"] for e in exact[:7]]
    assert [exact_int(v) for v in batch["cache_id"]] == [e["cache_id"] for e in exact[:7]]
    # The format goes on through Hugging Face's own methods, and any
    # datasets.IterableDataset takes it by name.
    taken = next(iter(ours(source).with_format(form).skip(3).take(1)))
    assert taken["payload"] == exact[3]["payload"]
    name = "dataset_rt.torch" if form in ("torch", "pt") else "dataset_rt.numpy"
    named = next(iter(ours(source).skip(3).with_format(name)))
    assert named["payload"] == exact[3]["payload"]
    assert str(named["cache_id"].dtype).endswith("uint64")
    theirs_named = next(iter(reference(source).with_format(name)))
    assert theirs_named["payload"] == exact[0]["payload"]


def test_batches_are_huggingfaces(source: LocalSource) -> None:
    assert list(ours(source).iter(batch_size=7)) == list(reference(source).iter(batch_size=7))
    mine = list(ours(source).with_format("torch").iter(batch_size=7, drop_last_batch=True))
    theirs = list(reference(source).with_format("torch").iter(batch_size=7, drop_last_batch=True))
    assert len(mine) == len(theirs) == RECORDS // 7
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a["label"], b["label"])


# -- one process, ranks ------------------------------------------------------------


@pytest.mark.parametrize("form", [None, "torch", "arrow"])
def test_one_process_reads_every_example_of_an_epoch(source: LocalSource, form: str | None) -> None:
    """An epoch of 1,000 examples read 256 at a time is 1,000 examples, not
    768: the tail rule keeps ranks in step, and one process has none to keep."""
    ds = ours(source, epoch_len=1000, block=256).with_format(form)
    assert len(ds) == 1000
    assert positions(ds) == list(range(1000))
    ds.set_epoch(1)
    assert len(ds) == 1000
    assert positions(ds) == list(range(1000, 2000))
    # The run's state says so too: the audit sees all 1,000 of each epoch.
    run = RunState.from_dict(place(ds.state_dict())["run"])
    assert (run.epoch, run.position) == (1, 1000)
    assert sum(span.rows() for span in run.seen()) == 2000


def test_ranks_keep_the_tail_rule(source: LocalSource) -> None:
    """Across ranks every rank takes the same number of blocks; the rest of the
    epoch goes to no rank (unchanged)."""
    two = [ours(source, rank=r, world_size=2) for r in range(2)]
    shares = [positions(d) for d in two]
    used = RECORDS // (2 * BLOCK) * 2 * BLOCK
    assert [len(d) for d in two] == [len(s) for s in shares] == [used // 2] * 2
    assert sorted(shares[0] + shares[1]) == list(range(used))
    assert shares[1][:BLOCK] == list(range(BLOCK, 2 * BLOCK))


# -- checkpoint and resume -----------------------------------------------------------


def resumed(make: Callable[[], Any], stop: int) -> list[int]:
    """Positions read by ``make()`` up to example ``stop``, then, from its
    state, by another ``make()`` to the end of the epoch."""
    ds = make()
    first = head(ds, stop + 1)
    state = ds.state_dict()
    fresh = make()
    fresh.load_state_dict(state)
    return first + positions(fresh)


@pytest.mark.parametrize("form", [None, "torch", "arrow"])
def test_state_dict_resumes_exactly_as_huggingfaces_does(
    source: LocalSource, form: str | None
) -> None:
    """The pattern of Hugging Face's docs: iterate, stop, state_dict(), later
    load_state_dict() and iterate: the rest, from the next example. Stops inside
    a table, on its last example, and on the epoch's last."""
    for stop in (0, 37, BLOCK - 1, 2 * BLOCK, RECORDS - 2, RECORDS - 1):
        mine = resumed(lambda: ours(source).with_format(form), stop)
        theirs = resumed(lambda: reference(source).with_format(form), stop)
        assert mine == theirs == list(range(RECORDS)), stop


def test_state_resumes_exactly_through_skip_filter_map_take(source: LocalSource) -> None:
    def pipeline(base: Any) -> Any:
        return (
            base.skip(10)
            .filter(lambda e: e["position"] % 2 == 0)
            .map(lambda e: {"half": e["position"] // 2})
            .take(150)
        )

    for stop in (3, 60, 148):
        mine = resumed(lambda: pipeline(ours(source)), stop)
        assert mine == resumed(lambda: pipeline(reference(source)), stop)
        assert mine == list(range(10, 310, 2)), stop


def test_a_one_process_state_resumes_at_any_world_size(source: LocalSource) -> None:
    ds = ours(source)
    seen = head(ds, 37)
    state = ds.state_dict()
    assert place(state)["examples"] > 0  # taken inside a table of BLOCK examples
    two = [ours(source, rank=r, world_size=2) for r in range(2)]
    for d in two:
        d.load_state_dict(state)
    rest = [positions(d) for d in two]
    assert len(rest[0]) == len(rest[1]) == (RECORDS - 37) // (2 * BLOCK) * BLOCK
    seen += rest[0] + rest[1]
    assert sorted(seen) == list(range(len(seen)))


def test_ranks_boundary_state_resumes_at_another_world_size(source: LocalSource) -> None:
    two = [ours(source, rank=r, world_size=2) for r in range(2)]
    iters = [iter(d) for d in two]
    seen = [int(next(it)["position"]) for _ in range(3 * BLOCK) for it in iters]
    state = two[0].state_dict()
    assert place(state)["examples"] == 0  # three whole blocks per rank: a boundary
    three = [ours(source, rank=r, world_size=3) for r in range(3)]
    for d in three:
        d.load_state_dict(state)
        seen += positions(d)
    assert len(seen) == len(set(seen))
    assert sorted(seen) == list(range(len(seen)))
    one = ours(source)
    one.load_state_dict(state)
    assert positions(one) == list(range(6 * BLOCK, RECORDS))


def test_a_state_inside_a_block_across_ranks_resumes_only_where_taken(
    source: LocalSource,
) -> None:
    ds = ours(source, rank=0, world_size=2)
    assert head(ds, 5) == [0, 1, 2, 3, 4]
    state = ds.state_dict()
    assert place(state)["examples"] == 5
    again = ours(source, rank=0, world_size=2)
    again.load_state_dict(state)
    assert positions(again)[:3] == [5, 6, 7]
    for other in (ours(source), ours(source, rank=0, world_size=3), ours(source, block=8)):
        with pytest.raises(drt.InvalidArgumentError, match="resumes only with world size 2"):
            other.load_state_dict(state)
    bad = {**place(state), "examples": BLOCK}
    with pytest.raises(drt.InvalidArgumentError, match="must be below its block"):
        ours(source, rank=0, world_size=2).load_state_dict({"examples_iterable": bad, "epoch": 0})
    with pytest.raises(drt.InvalidArgumentError, match="an HFIterableDataset state is"):
        ours(source).load_state_dict(place(state)["run"])


def test_a_state_of_the_earlier_shape_still_loads(source: LocalSource) -> None:
    """Before it was a ``datasets.IterableDataset`` its state was ``{"run",
    "examples"}``: a loader state and the examples of the next block taken."""
    loader = BatchLoader(
        source, DATASET, batch_size=BLOCK, seed=SEED, columns=["label"], batch_format="arrow"
    )
    it = iter(loader)
    next(it), next(it)
    ds = ours(source)
    ds.load_state_dict({"run": loader.state_dict(), "examples": 5})
    assert positions(ds) == list(range(2 * BLOCK + 5, RECORDS))


def test_iterating_again_restarts_the_epoch_as_huggingfaces_does(source: LocalSource) -> None:
    ds = ours(source)
    assert head(ds, 5) == [0, 1, 2, 3, 4]
    assert positions(ds) == list(range(RECORDS))
    assert positions(ds) == list(range(RECORDS))
    ds.set_epoch(1)
    assert ds.epoch == 1
    assert head(ds, 2) == [RECORDS, RECORDS + 1]
    # The run's chain says the epoch was read again (the audit counts it twice).
    run = RunState.from_dict(place(ds.state_dict())["run"])
    assert sum(span.rows() for span in run.seen([0])) >= 2 * RECORDS


def test_with_format_keeps_the_epoch_and_a_loaded_state(source: LocalSource) -> None:
    ds = ours(source, epoch=2)
    assert ds.with_format("torch").epoch == 2
    assert int(next(iter(ds.with_format("torch")))["position"]) == 2 * RECORDS
    first = ours(source)
    assert head(first, 40) == list(range(40))
    fresh = ours(source)
    fresh.load_state_dict(first.state_dict())
    assert positions(fresh.with_format("numpy"))[:2] == [40, 41]


def test_a_run_resumed_elsewhere_is_fenced(source: LocalSource) -> None:
    ds = ours(source)
    it = iter(ds)
    for _ in range(3 * BLOCK):
        next(it)
    elsewhere = ours(source)
    elsewhere.load_state_dict(ds.state_dict())
    assert head(elsewhere, 1) == [3 * BLOCK]
    with pytest.raises(drt.FencedError):
        next(it)  # the next block is asked for: the fence says no
    with pytest.raises(drt.FencedError):
        ds.state_dict()


def test_a_dataloader_collates_it_as_huggingfaces(source: LocalSource) -> None:
    loader = torch.utils.data.DataLoader(ours(source).with_format("torch"), batch_size=8)
    reference_loader = torch.utils.data.DataLoader(
        reference(source).with_format("torch"), batch_size=8
    )
    payloads = [e["payload"] for e in reference(source)]
    exact = [payloads[i : i + 8] for i in range(0, len(payloads), 8)]
    assert len(loader) == len(exact)
    for a, b, e in zip(loader, reference_loader, exact, strict=True):
        assert a["payload"] == e
        assert torch.equal(a["label"], b["label"])
        assert a["position"].dtype == torch.uint64
        assert a["position"].tolist() == b["position"].tolist()


def test_dataloader_workers_are_refused_naming_the_loader_that_has_them(
    source: LocalSource,
) -> None:
    loader = torch.utils.data.DataLoader(
        ours(source), batch_size=4, num_workers=1, multiprocessing_context="spawn"
    )
    with pytest.raises(Exception, match=r"DatasetLoader\(num_workers=n\)"):
        next(iter(loader))


def test_arguments_are_checked(source: LocalSource) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="'block' must be an integer >= 1"):
        ours(source, block=0)
    with pytest.raises(drt.InvalidArgumentError, match="'epoch' must be an integer >= 0"):
        ours(source).set_epoch(-1)
    assert repr(ours(source, world_size=2, rank=1)).startswith(
        "HFIterableDataset(dataset='toy', rank=1/2, epoch=0, features=['position', "
    )


@pytest.mark.parametrize(("world_size", "form"), [(1, None), (1, "arrow"), (2, None)])
def test_a_population_switch_applies_where_the_state_says(
    source: LocalSource, world_size: int, form: str | None
) -> None:
    """``ds.loader.switch_population`` draws from the next example on with one
    process (the rest of a table already read is read again), from the next
    block across ranks; a resume from the state maps every position the same."""
    ones = source.put(only_label(source.metadata(), 1), activate=False)
    ds = ours(source, rank=0, world_size=world_size)
    if form is not None:  # (with_format(None) reads through datasets' arrow path too)
        ds = ds.with_format(form)
    it = iter(ds)
    before = [next(it) for _ in range(37)]
    at = ds.loader.switch_population(ones)
    after = list(it)
    labels = [row["label"] for row in rows(before + after)]
    assert len(set(labels[: min(at, 37)])) > 1
    seen = positions(before + after)
    switched = [label for p, label in zip(seen, labels, strict=True) if p >= at]
    assert switched
    assert set(switched) == {1}
    if world_size == 1:
        assert seen == list(range(RECORDS))
        assert at == (37 if form is None else 48)  # arrow: a table of BLOCK is read whole
    run = RunState.from_dict(place(ds.state_dict())["run"])
    assert run.segments[1] == (at, ones)


def rows(examples: list[Any]) -> list[dict[str, Any]]:
    return [e.to_pylist()[0] if isinstance(e, pa.Table) else e for e in examples]
