"""`DatasetLoader` in one process: the partition rule through a real DataLoader,
checkpoint and resume at other world sizes and worker counts, population
switches, states and their validation.

Ranks are simulated here by loaders with an explicit ``rank`` and
``world_size``; tests/training/test_ddp.py runs real ranks with torch.distributed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import dataset_rt as drt
from dataset_rt.loader import LocalSource
from dataset_rt.torch import DatasetLoader

from .conftest import DATASET, RECORDS, SEED, only_label

BATCH = 8

# Three workers on this two-core machine: PyTorch warns, the test means it.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def loader(source: LocalSource, **options: Any) -> DatasetLoader:
    options.setdefault("batch_size", BATCH)
    options.setdefault("seed", SEED)
    return DatasetLoader(source, DATASET, columns=["label"], **options)


def positions(batch: dict[str, Any]) -> list[int]:
    return [int(p) for p in batch["position"].tolist()]


def take(it: Any, n: int) -> list[dict[str, Any]]:
    return [next(it) for _ in range(n)]


def id_map(source: LocalSource, epoch_len: int, epoch: int = 0) -> dict[int, tuple[int, int]]:
    """position -> (cache_id, sample_id) of the whole epoch, read in one stream."""
    whole = loader(source, batch_size=1, epoch=epoch)
    return {p: i for b in whole for p, i in zip(positions(b), _ids(b), strict=True)}


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_batches_are_blocks_r_plus_q_w_whatever_the_worker_count(
    source: LocalSource, workers: int, world_size: int
) -> None:
    """The DataLoader's round-robin over workers gives rank r the blocks
    r, r + w, r + 2w, ... (verified against the installed PyTorch)."""
    rank = world_size - 1
    batches = list(loader(source, rank=rank, world_size=world_size, num_workers=workers))
    assert len(batches) == 500 // BATCH // world_size
    for q, batch in enumerate(batches):
        first = (rank + q * world_size) * BATCH
        assert positions(batch) == list(range(first, first + BATCH)), f"batch {q}"


def test_default_batches_are_collated_tensors(source: LocalSource) -> None:
    batch = next(iter(loader(source)))
    assert set(batch) == {"position", "cache_id", "sample_id", "payload", "label"}
    assert batch["position"].dtype == torch.uint64
    assert batch["label"].dtype == torch.int64
    assert len(batch["payload"]) == BATCH
    assert all(isinstance(p, bytes) and len(p) == 32 for p in batch["payload"])


def _bytes_sum(sample: dict[str, Any]) -> dict[str, Any]:
    return {"x": torch.tensor(sum(sample["payload"]), dtype=torch.float32), "y": sample["label"]}


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_and_collate_hooks_run_per_sample_then_per_batch(
    source: LocalSource, workers: int
) -> None:
    plain = next(iter(loader(source)))
    batch = next(iter(loader(source, transform=_bytes_sum, num_workers=workers)))
    assert batch["x"].shape == (BATCH,)
    assert batch["x"].tolist() == [float(sum(p)) for p in plain["payload"]]
    assert batch["y"].tolist() == plain["label"].tolist()
    lists = next(iter(loader(source, collate_fn=list)))
    assert [s["position"] for s in lists] == positions(plain)


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 2), (3, 1)), ((1, 0), (4, 2)), ((3, 1), (2, 0)), ((2, 2), (2, 2))],
)
def test_resume_at_another_world_size_consumes_every_position_once(
    source: LocalSource, before: tuple[int, int], after: tuple[int, int]
) -> None:
    (w1, n1), (w2, n2) = before, after
    steps = 5
    truth = id_map(source, 500)
    consumed: list[tuple[int, tuple[int, int]]] = []
    first_run = [loader(source, rank=r, world_size=w1, num_workers=n1) for r in range(w1)]
    for run in first_run:
        for batch in take(iter(run), steps):
            consumed += zip(positions(batch), _ids(batch), strict=True)
    state = json.loads(json.dumps(first_run[0].state_dict()))
    assert state["position"] == steps * w1 * BATCH
    for r in range(w2):
        resumed = loader(source, rank=r, world_size=w2, num_workers=n2)
        resumed.load_state_dict(state)
        for batch in resumed:
            consumed += zip(positions(batch), _ids(batch), strict=True)
        assert resumed.position == 500
    seen = [p for p, _ in consumed]
    assert len(seen) == len(set(seen)), "a position was consumed twice"
    start = steps * w1 * BATCH
    covered = start + (500 - start) // BATCH // w2 * w2 * BATCH
    assert sorted(seen) == list(range(covered)), "a covered position was lost"
    assert all(truth[p] == ids for p, ids in consumed)


def _ids(batch: dict[str, Any]) -> list[tuple[int, int]]:
    return list(zip(batch["cache_id"].tolist(), batch["sample_id"].tolist(), strict=True))


def test_resume_with_the_same_world_repeats_each_ranks_sequence(source: LocalSource) -> None:
    def run(rank: int) -> DatasetLoader:
        return loader(source, rank=rank, world_size=2, num_workers=2)

    whole = [list(map(positions, run(r))) for r in range(2)]
    first = [run(r) for r in range(2)]
    heads = [list(map(positions, take(iter(part), 4))) for part in first]
    state = first[0].state_dict()
    assert state["position"] == 4 * 2 * BATCH
    for r in range(2):
        resumed = run(r)
        resumed.load_state_dict(state)
        assert heads[r] + list(map(positions, resumed)) == whole[r]


def test_a_switch_applies_from_the_agreed_position_and_survives_resume(
    source: LocalSource,
) -> None:
    table = source.metadata()
    twos = source.put(only_label(table, 2), activate=False)
    run = loader(source, world_size=1)
    it = iter(run)
    before = take(it, 3)
    at = run.switch_population(twos)
    assert at == 3 * BATCH
    after = take(it, 4)
    assert len({label for b in before for label in b["label"].tolist()}) > 1
    assert all(label == 2 for b in after for label in b["label"].tolist())
    assert [positions(b)[0] for b in after] == [24, 32, 40, 48]
    state = run.state_dict()
    assert state["segments"] == [[0, run.segments[0].population], [24, twos]]
    # A run resumed at world size 2 from here reads label 2 only, and the
    # positions -> samples of the rest equal the uninterrupted run's.
    rest = list(it)
    resumed = [loader(source, rank=r, world_size=2) for r in range(2)]
    for part in resumed:
        part.load_state_dict(state)
    tail = {
        p: i for part in resumed for b in part for p, i in zip(positions(b), _ids(b), strict=True)
    }
    uninterrupted = {p: i for b in rest for p, i in zip(positions(b), _ids(b), strict=True)}
    assert tail.items() <= uninterrupted.items()
    resumed_at = 7 * BATCH
    assert sorted(tail) == list(range(resumed_at, resumed_at + (500 - resumed_at) // 16 * 16))


def test_a_future_switch_splits_the_epoch_and_keeps_the_earlier_population(
    source: LocalSource,
) -> None:
    table = source.metadata()
    ones = source.put(only_label(table, 1), activate=False)
    run = loader(source, world_size=2, rank=1, num_workers=2)
    assert run.switch_population(ones, at=10 * 2 * BATCH) == 160
    labels_after = [(positions(b)[0], b["label"].tolist()) for b in run if positions(b)[0] >= 160]
    assert labels_after
    assert all(set(labels) == {1} for _, labels in labels_after)
    with pytest.raises(drt.InvalidArgumentError, match="batch boundary"):
        loader(source, world_size=2).switch_population(ones, at=17)
    with pytest.raises(drt.InvalidArgumentError, match="population id"):
        run.switch_population("not-an-id", at=run.position + 500 * 3)


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_never_change_a_ranks_sequence_across_population_segments(
    source: LocalSource, workers: int
) -> None:
    """Parts of unequal lengths (a switch at an odd block) keep the round-robin."""
    ones = source.put(only_label(source.metadata(), 1), activate=False)

    def sequence(n: int) -> list[list[int]]:
        run = loader(source, world_size=2, rank=1, num_workers=n)
        run.switch_population(ones, at=7 * 2 * BATCH)
        return list(map(positions, run))

    assert sequence(workers) == sequence(0)


def test_set_epoch_restarts_only_a_new_epoch(source: LocalSource) -> None:
    run = loader(source)
    take(iter(run), 2)
    run.set_epoch(0)
    assert run.position == 2 * BATCH
    run.set_epoch(1)
    assert (run.epoch, run.position) == (1, 0)
    assert positions(next(iter(run)))[0] == 500


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"version": 7}, "version"),
        ({"position": -1}, "position"),
        ({"position": 501}, "position"),
        ({"seed": "1"}, "seed"),
        ({"segments": []}, "segments"),
        ({"segments": [[5, "0" * 32]]}, "segments"),
        ({"segments": [[0, "xyz"]]}, "segments"),
        ({"dataset": "other"}, "dataset"),
        ({"extra": 1}, "unknown"),
    ],
)
def test_bad_states_are_refused_and_change_nothing(
    source: LocalSource, change: dict[str, Any], word: str
) -> None:
    run = loader(source)
    take(iter(run), 1)
    good = run.state_dict()
    with pytest.raises(drt.InvalidArgumentError, match=word):
        run.load_state_dict(good | change)
    assert run.state_dict() == good


def test_bad_loader_arguments(source: LocalSource) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="batch_size"):
        loader(source, batch_size=0)
    with pytest.raises(drt.InvalidArgumentError, match="fork"):
        loader(source, multiprocessing_context="fork")
    with pytest.raises(drt.InvalidArgumentError, match="rank"):
        loader(source, rank=2, world_size=2)
    with pytest.raises(drt.InvalidArgumentError, match="nope"):
        DatasetLoader(source, DATASET, batch_size=4, seed=1, columns=["nope"])


# torchdata 0.11 (its last release) calls torch.set_vital, which PyTorch 2.15 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_torchdatas_stateful_dataloader_resumes_the_stateful_dataset(
    source: LocalSource, workers: int
) -> None:
    """torchdata's StatefulDataLoader checkpoints our dataset per worker and
    resumes it exactly (with the same worker count, as it requires)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def stateful() -> StatefulDataLoader:
        run = loader(source, world_size=2, rank=1)
        options: dict[str, Any] = {"num_workers": workers}
        if workers:
            options["multiprocessing_context"] = "forkserver"
        return StatefulDataLoader(run.stateful_dataset(), batch_size=None, **options)

    whole = list(map(positions, stateful()))
    assert whole == list(map(positions, loader(source, world_size=2, rank=1)))
    first = stateful()
    it = iter(first)
    head = [positions(next(it)) for _ in range(5)]
    state = first.state_dict()
    del it
    second = stateful()
    second.load_state_dict(state)
    assert head + list(map(positions, second)) == whole


# torchdata 0.11 (its last release) calls torch.set_vital, which PyTorch 2.15 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_a_stateful_checkpoint_at_another_worker_count_is_refused_saying_why(
    source: LocalSource,
) -> None:
    run = loader(source, num_workers=2)
    first = run.stateful_loader()
    it = iter(first)
    head = [positions(next(it)) for _ in range(3)]
    state = first.state_dict()
    del it
    with pytest.raises(drt.InvalidArgumentError, match="num_workers=2") as caught:
        loader(source).stateful_loader(state)  # 0 workers
    assert "state_dict(), which resumes at any worker count" in str(caught.value)
    same = loader(source, num_workers=2).stateful_loader(state)
    assert head + list(map(positions, same)) == list(map(positions, loader(source)))


def test_switching_to_an_unknown_population_fails_at_once_and_changes_nothing(
    source: LocalSource,
) -> None:
    run = loader(source)
    take(iter(run), 2)
    before = run.state_dict()
    with pytest.raises(drt.NotFoundError, match="f" * 32):
        run.switch_population("f" * 32)
    assert run.state_dict() == before


def test_a_permutation_loader_reads_every_sample_once_per_epoch_and_resumes(
    source: LocalSource,
) -> None:
    """shuffle="permutation" with epoch_len = rows: each epoch is every sample
    once across the ranks; a resumed run continues with the same samples."""

    def loader(rank: int, world: int) -> DatasetLoader:
        return DatasetLoader(
            source,
            DATASET,
            batch_size=10,
            seed=SEED,
            shuffle="permutation",
            epoch_len=RECORDS,
            rank=rank,
            world_size=world,
        )

    ranks = [loader(r, 2) for r in range(2)]
    seen = [s for run in ranks for batch in run for s in batch["sample_id"].tolist()]
    assert sorted(seen) == list(range(RECORDS))
    # Stop after 7 steps of epoch 1 and resume on 3 ranks: the rest of the same order.
    for run in ranks:
        run.set_epoch(1)
    first = [
        s
        for run in ranks
        for _, batch in zip(range(7), run, strict=False)
        for s in batch["sample_id"].tolist()
    ]
    state = json.loads(json.dumps(ranks[0].state_dict()))
    assert state["shuffle"] == "permutation"
    resumed = [loader(r, 3) for r in range(3)]
    rest = []
    for run in resumed:
        run.load_state_dict(state)
        rest += [s for batch in run for s in batch["sample_id"].tolist()]
    assert len(set(first + rest)) == len(first + rest)  # no sample twice in the epoch
    assert len(first + rest) >= RECORDS - 3 * 10  # at most a tail of one step per rank dropped


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_formats_hand_out_the_same_batches(source: LocalSource, workers: int) -> None:
    """``batch_format`` changes the container, never the batch: tensors, NumPy
    arrays (for JAX and other non-torch consumers) and Arrow tables agree."""
    import numpy as np
    import pyarrow as pa

    as_torch = list(loader(source, num_workers=workers))
    as_numpy = list(loader(source, num_workers=workers, batch_format="numpy"))
    as_arrow = list(loader(source, num_workers=workers, batch_format="arrow"))
    assert len(as_torch) == len(as_numpy) == len(as_arrow) == RECORDS // BATCH
    for t, n, a in zip(as_torch, as_numpy, as_arrow, strict=True):
        assert isinstance(n["position"], np.ndarray)
        assert isinstance(a, pa.Table)
        assert t["position"].tolist() == n["position"].tolist() == a["position"].to_pylist()
        assert t["label"].tolist() == n["label"].tolist() == a["label"].to_pylist()
        assert t["payload"] == n["payload"] == a["payload"].to_pylist()


def test_batch_format_with_a_collate_fn_is_refused(source: LocalSource) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="applies to the default batches"):
        loader(source, batch_format="numpy", collate_fn=list)


def test_large_batches_cross_from_workers_in_shared_memory_unchanged(
    big_cache: Any, tmp_path: Any
) -> None:
    """Batches of at least PACK_BYTES of payload leave a worker as one
    shared-memory tensor (not bytes through the queue's pipe) and reach the
    trainer as the same list of bytes, in the same column order."""
    from dataset_rt.torch import PACK_BYTES

    big = LocalSource([big_cache], tmp_path / "state", name="big")
    batch_size = 128  # of 64 KiB records: 8 MiB a batch
    assert batch_size * 64 * 1024 >= PACK_BYTES
    for batch_format in ("torch", "numpy"):
        read = {
            workers: list(
                DatasetLoader(
                    big,
                    "big",
                    batch_size=batch_size,
                    seed=SEED,
                    epoch_len=1024,
                    num_workers=workers,
                    batch_format=batch_format,
                )
            )
            for workers in (0, 2)
        }
        assert len(read[0]) == len(read[2]) == 1024 // batch_size
        for alone, from_workers in zip(read[0], read[2], strict=True):
            assert list(from_workers) == list(alone)
            assert from_workers["payload"] == alone["payload"]
            assert all(isinstance(p, bytes) for p in from_workers["payload"])
            assert from_workers["sample_id"].tolist() == alone["sample_id"].tolist()
