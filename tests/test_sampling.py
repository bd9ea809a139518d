"""Epoch streams (DESIGN contract 4): one addressable, deterministic stream per dataset.

Each new iterator takes the next ``len(dataset)`` positions of the stream;
`update_metadata` resets the position to 0 and the epoch length to the new row
count; `set_epoch_len` changes only future iterators; an iterator keeps the
snapshot it was created with. ``dataset.stream(start, count, stride)`` reads any
window without moving the dataset's position.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from conftest import ListSource, make_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dataset_rt as drt

N = 30
M = 10
STORED = ["label", "score", "flag", "name"]
RECORDS = make_records(N)
RECORDS_B = make_records(M, payload_size=24, seed=1)

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

Ident = tuple[int, int, int]  # (position, cache_id, sample_id)


# -- helpers -------------------------------------------------------------------


def _write(runtime: drt.DatasetRuntime, base: Path, source: ListSource) -> Path:
    (result,) = runtime.write_cache(
        source, base, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture(scope="module")
def caches(
    runtime: drt.DatasetRuntime, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """Two caches with the same schema: ``a`` (N records) and ``b`` (M records)."""
    base = tmp_path_factory.mktemp("sampling")
    return (
        _write(runtime, base, ListSource("a", RECORDS)),
        _write(runtime, base, ListSource("b", RECORDS_B)),
    )


@pytest.fixture(scope="module")
def cache_a(caches: tuple[Path, Path]) -> Path:
    return caches[0]


def open_dataset(
    runtime: drt.DatasetRuntime,
    paths: Path | list[Path],
    *,
    seed: int = 3,
    shuffle: bool = True,
    prefetch_size: int = 64,
) -> drt.CachedDataset:
    config = drt.ReaderConfig(seed=seed, shuffle=shuffle, prefetch_size=prefetch_size)
    return runtime.cached_dataset(
        paths if isinstance(paths, list) else [paths], reader_config=config
    )


def idents(reader: pa.RecordBatchReader) -> list[Ident]:
    table = reader.read_all()
    return list(
        zip(
            table["position"].to_pylist(),
            table["cache_id"].to_pylist(),
            table["sample_id"].to_pylist(),
            strict=True,
        )
    )


def window(dataset: drt.CachedDataset, start: int, count: int) -> list[tuple[int, int]]:
    """(cache_id, sample_id) of positions ``start .. start + count`` (position untouched)."""
    return [(c, s) for _, c, s in idents(dataset.stream(start=start, count=count, columns=[]))]


def table_ids(table: pa.Table) -> list[tuple[int, int]]:
    return list(zip(table["cache_id"].to_pylist(), table["sample_id"].to_pylist(), strict=True))


def sample_ids(samples: Iterable[drt.CachedSample]) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in samples]


def full(samples: Iterable[drt.CachedSample]) -> list[tuple[int, int, str, dict[str, Any]]]:
    return [
        (s.cache_id, s.sample_id, hashlib.sha256(s.data).hexdigest(), s.metadata) for s in samples
    ]


def batch_samples(reader: pa.RecordBatchReader) -> list[tuple[int, int, str, dict[str, Any]]]:
    """The batch path in the per-sample shape of `full`."""
    rows = reader.read_all().to_pylist()
    return [
        (
            row["cache_id"],
            row["sample_id"],
            hashlib.sha256(row["payload"]).hexdigest(),
            {c: row[c] for c in STORED},
        )
        for row in rows
    ]


def five_sigma_check(counts: Counter[Any], probabilities: dict[Any, float], draws: int) -> None:
    assert sum(counts.values()) == draws
    assert set(counts) <= set(probabilities), counts
    for key, p in probabilities.items():
        sigma = math.sqrt(draws * p * (1 - p))
        assert abs(counts[key] - draws * p) < 5 * sigma, (key, counts[key], draws * p, sigma)


# -- one stream, successive iterators ------------------------------------------


def test_successive_iterators_continue_one_stream(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a)
    assert len(dataset) == N
    stream = window(dataset, 0, 4 * N)
    assert len(stream) == 4 * N

    first = sample_ids(dataset)
    second = sample_ids(dataset)
    third = idents(dataset.iter_batches())
    fourth = sample_ids(dataset)

    assert first == stream[:N]
    assert second == stream[N : 2 * N]
    assert [p for p, _, _ in third] == list(range(2 * N, 3 * N))
    assert [(c, s) for _, c, s in third] == stream[2 * N : 3 * N]
    assert fourth == stream[3 * N :]
    # Successive epochs are different draws, not a replay.
    assert first != second


def test_update_metadata_resets_position_and_epoch_length(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    used = open_dataset(runtime, cache_a)
    fresh = open_dataset(runtime, cache_a)
    list(used)
    used.set_epoch_len(7)
    list(used)

    table = (
        used.get_metadata()
        .filter(pl.col("label") == 2)
        .with_columns(pl.col("score").alias("weight"))
    )
    assert table.height == 10
    for dataset in (used, fresh):
        dataset.update_metadata(table)
        assert len(dataset) == table.height
    expected = window(used, 0, 2 * table.height)
    assert sample_ids(used) == expected[: table.height]
    assert sample_ids(used) == expected[table.height :]
    assert sample_ids(fresh) == expected[: table.height]

    # Even the unchanged table resets the position.
    used.update_metadata(used.get_metadata())
    assert sample_ids(used) == expected[: table.height]


def test_set_epoch_len_changes_only_future_iterators(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a)
    stream = window(dataset, 0, N + 5 + 45)
    older = iter(dataset)
    dataset.set_epoch_len(5)
    assert len(dataset) == 5
    newer = iter(dataset)
    dataset.set_epoch_len(45)
    newest = iter(dataset)
    assert sample_ids(newest) == stream[N + 5 :]
    assert sample_ids(newer) == stream[N : N + 5]
    assert sample_ids(older) == stream[:N]


@pytest.mark.parametrize("bad", [0, -1, -(2**40)])
def test_set_epoch_len_rejects_values_below_one(
    runtime: drt.DatasetRuntime, cache_a: Path, bad: int
) -> None:
    dataset = open_dataset(runtime, cache_a)
    control = open_dataset(runtime, cache_a)
    dataset.set_epoch_len(9)
    control.set_epoch_len(9)
    with pytest.raises(drt.InvalidArgumentError, match="epoch_len") as info:
        dataset.set_epoch_len(bad)
    assert isinstance(info.value, ValueError)
    assert len(dataset) == 9
    assert sample_ids(dataset) == sample_ids(control)


@pytest.mark.parametrize("bad", [True, 2.0, "3", None])
def test_set_epoch_len_rejects_non_integers(
    runtime: drt.DatasetRuntime, cache_a: Path, bad: Any
) -> None:
    dataset = open_dataset(runtime, cache_a)
    with pytest.raises(drt.InvalidArgumentError, match="epoch_len"):
        dataset.set_epoch_len(bad)
    assert len(dataset) == N


def test_an_iterator_keeps_the_snapshot_taken_at_iter(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a)
    list(dataset)
    old_stream = window(dataset, N, 2 * N)

    samples = iter(dataset)  # positions N .. 2N of the default population
    batches = dataset.iter_batches()  # positions 2N .. 3N
    subset = dataset.get_metadata().filter(pl.col("sample_id") < 4)
    dataset.update_metadata(subset)
    dataset.set_epoch_len(3)

    # Nothing was consumed before the update: both still read the old snapshot.
    assert sample_ids(samples) == old_stream[:N]
    old_batches = idents(batches)
    assert [p for p, _, _ in old_batches] == list(range(2 * N, 3 * N))
    assert [(c, s) for _, c, s in old_batches] == old_stream[N:]
    assert any(s >= 4 for _, _, s in old_batches)

    # The next iterator sees the new population from position 0.
    new = sample_ids(dataset)
    assert len(new) == 3
    assert new == window(dataset, 0, 3)
    assert all(s < 4 for _, s in new)


def test_a_partly_consumed_iterator_keeps_its_snapshot(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a)
    expected = window(dataset, 0, N)
    samples = iter(dataset)
    head = [next(samples) for _ in range(10)]
    dataset.update_metadata(dataset.get_metadata().head(2))
    dataset.set_epoch_len(1)
    assert sample_ids([*head, *samples]) == expected


# -- reproducibility -----------------------------------------------------------


def _history(dataset: drt.CachedDataset) -> list[list[tuple[int, int, str, dict[str, Any]]]]:
    """A fixed sequence of calls; returns every epoch it read."""
    epochs = [full(dataset)]
    table = dataset.get_metadata()
    dataset.update_metadata(
        pl.concat([table, table.head(5)]).with_columns((pl.col("label") + 0.5).alias("weight"))
    )
    dataset.set_epoch_len(17)
    epochs += [full(dataset), batch_samples(dataset.iter_batches()), full(dataset)]
    return epochs


def test_fresh_datasets_with_the_same_history_reproduce_the_stream(
    runtime: drt.DatasetRuntime, cache_a: Path, tmp_path: Path
) -> None:
    # The same source written elsewhere is the same cache (same ids, same bytes).
    copy = _write(runtime, tmp_path, ListSource("a", RECORDS))
    first = _history(open_dataset(runtime, cache_a, seed=99))
    second = _history(open_dataset(runtime, cache_a, seed=99))
    third = _history(open_dataset(runtime, copy, seed=99))
    assert first == second == third
    other_seed = _history(open_dataset(runtime, cache_a, seed=100))
    assert other_seed != first


def test_negative_seeds_are_taken_modulo_2_64(runtime: drt.DatasetRuntime, cache_a: Path) -> None:
    negative = open_dataset(runtime, cache_a, seed=-5)
    unsigned = open_dataset(runtime, cache_a, seed=2**64 - 5)
    assert window(negative, 0, 100) == window(unsigned, 0, 100)


def _varied_records(n: int) -> list[drt.CacheInput]:
    """Payload sizes from a few bytes to tens of KiB, so batches take uneven time to build."""
    records = make_records(n)
    return [
        drt.CacheInput(data=r.data * (1 + (i * 37) % 2000), metadata=r.metadata)
        for i, r in enumerate(records)
    ]


@pytest.fixture(scope="module")
def varied_cache(runtime: drt.DatasetRuntime, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(runtime, tmp_path_factory.mktemp("varied"), ListSource("v", _varied_records(200)))


def _read_history(runtime: drt.DatasetRuntime, path: Path, prefetch_size: int) -> list[Any]:
    dataset = open_dataset(runtime, path, seed=5, prefetch_size=prefetch_size)
    dataset.set_epoch_len(700)
    out: list[Any] = [full(dataset)]
    out.append(batch_samples(dataset.iter_batches(batch_size=16)))
    dataset.update_metadata(dataset.get_metadata().filter(pl.col("flag")))
    out.append(full(dataset))
    out.append(idents(dataset.stream(start=12_345, count=500, stride=3, batch_size=7)))
    return out


@pytest.mark.parametrize(("num_workers", "prefetch_size"), [(1, 1), (4, 64), (2, 1000), (4, 1)])
def test_workers_and_prefetch_never_change_the_stream(
    runtime: drt.DatasetRuntime, varied_cache: Path, num_workers: int, prefetch_size: int
) -> None:
    other = drt.DatasetRuntime(num_workers=num_workers)
    assert other.num_workers == num_workers
    reference = _read_history(runtime, varied_cache, 64)
    assert len(reference[0]) == len(reference[1]) == 700
    assert _read_history(other, varied_cache, prefetch_size) == reference


# -- sampling modes ------------------------------------------------------------


def test_shuffle_false_yields_table_order_cyclically(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a, shuffle=False)
    assert [s for _, s in sample_ids(dataset)] == list(range(N))
    dataset.set_epoch_len(N + 4)
    assert [s for _, s in sample_ids(dataset)] == [*range(N), 0, 1, 2, 3]

    order = [4, 2, 2, 7, 0]
    table = dataset.get_metadata()[order].with_columns(
        pl.Series("weight", [100.0, 1.0, 0.5, 3.0, 1e-6])  # weights do not matter here
    )
    dataset.update_metadata(table)
    dataset.set_epoch_len(12)
    cycle = order * 5
    first = dataset.iter_batches()
    assert [s for _, _, s in idents(first)] == cycle[:12]
    assert [s for _, s in sample_ids(dataset)] == cycle[12:24]


def test_shuffle_true_draws_with_replacement_uniformly_by_default(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a, seed=2024)
    one_epoch = [s for _, s in sample_ids(dataset)]
    assert len(one_epoch) == N
    # 30 uniform draws from 30 rows without a repeat has probability 30!/30**30 ~ 1e-12.
    assert len(set(one_epoch)) < N
    draws = 30_000
    counts = Counter(s for _, _, s in idents(dataset.stream(count=draws, columns=[])))
    five_sigma_check(counts, {i: 1 / N for i in range(N)}, draws)


def test_shuffle_true_frequencies_follow_the_weights(
    runtime: drt.DatasetRuntime, caches: tuple[Path, Path]
) -> None:
    dataset = open_dataset(runtime, list(caches), seed=77)
    table = dataset.get_metadata()
    id_a, id_b = table["cache_id"].unique(maintain_order=True).to_list()
    chosen = {(id_a, 0): 1.0, (id_a, 1): 2.0, (id_a, 2): 3.0, (id_b, 0): 4.0, (id_b, 1): 10.0}
    chosen[(id_a, 3)] = 0.5
    rows = [table.filter((pl.col("cache_id") == c) & (pl.col("sample_id") == s)) for c, s in chosen]
    weighted = pl.concat(rows).with_columns(pl.Series("weight", list(chosen.values())))
    dataset.update_metadata(weighted)

    draws = 60_000
    counts = Counter((c, s) for _, c, s in idents(dataset.stream(count=draws, columns=[])))
    total = sum(chosen.values())
    five_sigma_check(counts, {key: w / total for key, w in chosen.items()}, draws)


def test_tiny_weights_are_drawn_rarely(runtime: drt.DatasetRuntime, cache_a: Path) -> None:
    dataset = open_dataset(runtime, cache_a, seed=8)
    table = dataset.get_metadata().head(3).with_columns(pl.Series("weight", [1.0, 1e-9, 1.0]))
    dataset.update_metadata(table)
    draws = 20_000
    counts = Counter(s for _, _, s in idents(dataset.stream(count=draws, columns=[])))
    # Expected 2e-5 draws of row 1: seeing 5 would be a > 5 sigma event many times over.
    assert counts[1] < 5
    five_sigma_check(Counter({0: counts[0], 2: counts[2] + counts[1]}), {0: 0.5, 2: 0.5}, draws)


# -- the batch path and samples ------------------------------------------------


def test_batch_schema_and_contents(runtime: drt.DatasetRuntime, cache_a: Path) -> None:
    dataset = open_dataset(runtime, cache_a)
    reader = dataset.iter_batches(batch_size=7)
    assert isinstance(reader, pa.RecordBatchReader)
    schema = reader.schema
    assert schema.names == ["position", "cache_id", "sample_id", "payload", *STORED]
    assert [schema.field(n).type for n in schema.names] == [
        pa.uint64(),
        pa.uint64(),
        pa.uint64(),
        pa.large_binary(),
        pa.int64(),
        pa.float64(),
        pa.bool_(),
        schema.field("name").type,
    ]
    assert pa.types.is_string(schema.field("name").type) or pa.types.is_large_string(
        schema.field("name").type
    )
    batches = list(reader)
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    assert all(b.num_rows <= 7 for b in batches)
    rows = pa.Table.from_batches(batches, schema).to_pylist()
    assert [r["position"] for r in rows] == list(range(N))
    for row in rows:
        record = RECORDS[row["sample_id"]]
        assert row["payload"] == record.data
        assert {c: row[c] for c in STORED} == record.metadata


def test_batch_columns_are_chosen_in_order(runtime: drt.DatasetRuntime, cache_a: Path) -> None:
    dataset = open_dataset(runtime, cache_a, shuffle=False)
    table = dataset.get_metadata().with_columns(
        pl.format("n{}", pl.col("sample_id")).alias("note"), (pl.col("label") + 1.0).alias("weight")
    )
    dataset.update_metadata(table)
    base = ["position", "cache_id", "sample_id", "payload"]

    reader = dataset.iter_batches(columns=["note", "score", "weight"])
    assert reader.schema.names == [*base, "note", "score", "weight"]
    result = reader.read_all()
    assert result["note"].to_pylist() == [f"n{i}" for i in range(N)]
    assert result["weight"].to_pylist() == [float(i % 3 + 1) for i in range(N)]

    reader = dataset.iter_batches(columns=[])
    assert reader.schema.names == base
    assert reader.read_all()["position"].to_pylist() == list(range(N, 2 * N))


def test_per_sample_iterator_matches_the_batch_path(
    runtime: drt.DatasetRuntime, caches: tuple[Path, Path]
) -> None:
    by_sample = open_dataset(runtime, list(caches), seed=31)
    by_batch = open_dataset(runtime, list(caches), seed=31)
    for dataset in (by_sample, by_batch):
        dataset.set_epoch_len(300)  # more than one 256-row batch behind the iterator
    for _ in range(3):
        samples = full(by_sample)
        batches = batch_samples(by_batch.iter_batches(batch_size=50))
        assert len(samples) == 300
        assert samples == batches


def test_cached_sample_fields(runtime: drt.DatasetRuntime, cache_a: Path) -> None:
    dataset = open_dataset(runtime, cache_a, shuffle=False)
    cache_id = dataset.get_metadata()["cache_id"][0]
    samples = list(dataset)
    assert len(samples) == N
    for sample_id, sample in enumerate(samples):
        assert isinstance(sample, drt.CachedSample)
        assert type(sample.data) is bytes
        assert sample.data == RECORDS[sample_id].data
        assert sample.metadata == RECORDS[sample_id].metadata
        assert [type(sample.metadata[c]) for c in STORED] == [int, float, bool, str]
        assert (sample.cache_id, sample.sample_id) == (cache_id, sample_id)
        assert dataset.get_item(cache_id, sample_id) == sample


def test_several_caches_in_one_dataset(
    runtime: drt.DatasetRuntime, caches: tuple[Path, Path]
) -> None:
    dataset = open_dataset(runtime, list(caches), shuffle=False)
    table = dataset.get_metadata()
    assert table.height == len(dataset) == N + M
    id_a, id_b = table["cache_id"].unique(maintain_order=True).to_list()
    assert id_a != id_b
    records = {id_a: RECORDS, id_b: RECORDS_B}

    samples = list(dataset)
    assert sample_ids(samples) == [(id_a, i) for i in range(N)] + [(id_b, i) for i in range(M)]
    for sample in samples:
        expected = records[sample.cache_id][sample.sample_id]
        assert (sample.data, sample.metadata) == (expected.data, expected.metadata)

    # A population that interleaves the caches, read through the batch path.
    mixed = pl.concat([table.filter(pl.col("cache_id") == id_b), table.head(3)])
    dataset.update_metadata(mixed)
    rows = dataset.iter_batches().read_all().to_pylist()
    assert [(r["cache_id"], r["sample_id"]) for r in rows] == mixed.select(
        "cache_id", "sample_id"
    ).rows()
    for row in rows:
        assert row["payload"] == records[row["cache_id"]][row["sample_id"]].data


# -- errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda d: d.iter_batches(columns=["nope"]), ["nope", "label"]),
        (lambda d: d.iter_batches(columns=["payload"]), ["payload"]),
        (lambda d: d.iter_batches(columns=["label", "label"]), ["label"]),
        (lambda d: d.iter_batches(batch_size=0), ["batch_size"]),
        (lambda d: d.stream(stride=0), ["stride"]),
        (lambda d: d.stream(start=-1), ["start"]),
        (lambda d: d.stream(count=-1), ["count"]),
        (lambda d: d.stream(columns=["nope"]), ["nope"]),
    ],
    ids=[
        "unknown-column",
        "base-column",
        "column-twice",
        "batch-size-0",
        "stride-0",
        "negative-start",
        "negative-count",
        "window-unknown-column",
    ],
)
def test_bad_stream_requests_raise_clear_errors(
    runtime: drt.DatasetRuntime, cache_a: Path, call: Any, words: list[str]
) -> None:
    dataset = open_dataset(runtime, cache_a)
    with pytest.raises(drt.DatasetRTError) as info:
        call(dataset).read_all()
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("call", "word"),
    [
        (lambda d: d.iter_batches(columns=["nope"]), "nope"),
        (lambda d: d.iter_batches(columns=["payload"]), "payload"),
        (lambda d: d.iter_batches(batch_size=0), "batch_size"),
    ],
    ids=["unknown-column", "base-column", "batch-size-0"],
)
def test_a_rejected_stream_request_does_not_consume_an_epoch(
    runtime: drt.DatasetRuntime, cache_a: Path, call: Any, word: str
) -> None:
    dataset = open_dataset(runtime, cache_a)
    control = open_dataset(runtime, cache_a)
    list(dataset)
    list(control)
    with pytest.raises(drt.DatasetRTError, match=word):
        call(dataset).read_all()
    assert sample_ids(dataset) == sample_ids(control)


def test_epoch_partitions_equal_the_per_sample_iterator(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    """``epoch(e, partition=p)`` and the e-th ``iter_samples(partition=p)`` agree."""
    dataset = open_dataset(runtime, cache_a)
    share = drt.Partition(rank=1, world_size=3, start=4, stop=N - 2, block=3, offset=2)
    by_epoch = [table_ids(dataset.epoch(e, partition=share).read_all()) for e in range(3)]
    by_iterator = [sample_ids(dataset.iter_samples(partition=share)) for _ in range(3)]
    assert by_epoch == by_iterator
    blocks = (N - 2 - 4) // 3
    assert len(by_epoch[0]) == blocks // 3 * 3 - 2
    # Rank 1 takes blocks 1 and 4 of [4, 28); the offset skips two samples.
    positions = dataset.epoch(1, partition=share).read_all().column("position").to_pylist()
    assert positions == [N + 4 + 3 + 2, N + 4 + 12, N + 4 + 13, N + 4 + 14]


def test_a_partition_holds_its_keys() -> None:
    """One `Partition` is the six keys (tests/test_partition_keywords.py: the
    deprecated keyword arguments that build one)."""
    keys = {"rank": 1, "world_size": 3, "start": 4, "stop": N - 2, "block": 3, "offset": 2}
    partition = drt.Partition(**keys)
    assert (partition.rank, partition.world_size, partition.stop) == (1, 3, N - 2)
    assert partition.to_dict() == keys
    assert partition == drt.Partition(**keys)
    with pytest.raises(drt.InvalidArgumentError, match="'rank'"):
        drt.Partition(rank=3, world_size=3)
    with pytest.raises(drt.InvalidArgumentError, match="stop=2"):
        drt.Partition(start=3, stop=2)
    whole = drt.Partition()
    assert (whole.rank, whole.world_size, whole.block, whole.stop) == (0, 1, 1, None)


@pytest.mark.parametrize(
    ("keys", "word"),
    [
        ({"start": N + 1}, "start"),
        ({"start": 3, "stop": 2}, "stop=2"),
        ({"block": 0}, "block"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"offset": -1}, "offset"),
    ],
)
def test_bad_partitions_raise_clear_errors(
    runtime: drt.DatasetRuntime, cache_a: Path, keys: dict[str, int], word: str
) -> None:
    dataset = open_dataset(runtime, cache_a)
    control = open_dataset(runtime, cache_a)
    with pytest.raises(drt.DatasetRTError, match=word):
        dataset.epoch(0, partition=drt.Partition(**keys))
    with pytest.raises(drt.DatasetRTError, match=word):
        dataset.iter_samples(partition=drt.Partition(**keys))
    # The refused iterator consumed no epoch.
    assert sample_ids(dataset) == sample_ids(control)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_adapter_without_torch_raises_import_error(
    runtime: drt.DatasetRuntime, cache_a: Path
) -> None:
    dataset = open_dataset(runtime, cache_a)
    with pytest.raises(ImportError, match="torch"):
        dataset.to_torch_iterable_dataset()
    # The failed call consumed nothing.
    control = open_dataset(runtime, cache_a)
    assert sample_ids(dataset) == sample_ids(control)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_adapter_yields_the_epoch(runtime: drt.DatasetRuntime, cache_a: Path) -> None:
    import torch.utils.data

    dataset = open_dataset(runtime, cache_a)
    control = open_dataset(runtime, cache_a)
    adapter = dataset.to_torch_iterable_dataset()
    assert isinstance(adapter, torch.utils.data.IterableDataset)
    assert len(adapter) == N
    assert sample_ids(adapter) == sample_ids(control)
    assert sample_ids(adapter) == sample_ids(control)


# -- properties ----------------------------------------------------------------


@st.composite
def populations(draw: st.DrawFn) -> list[tuple[int, float]]:
    """Rows of cache ``a`` (duplicates allowed) with positive weights."""
    return draw(
        st.lists(
            st.tuples(
                st.integers(0, N - 1),
                st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False),
            ),
            min_size=1,
            max_size=25,
        )
    )


def _population_table(base: pl.DataFrame, rows: list[tuple[int, float]]) -> pl.DataFrame:
    return base[[r for r, _ in rows]].with_columns(pl.Series("weight", [w for _, w in rows]))


@PROPERTY
@given(
    seed=st.integers(0, 2**64 - 1),
    shuffle=st.booleans(),
    rows=populations(),
    epoch_len=st.integers(1, 60),
)
def test_property_same_inputs_same_stream(
    runtime: drt.DatasetRuntime,
    cache_a: Path,
    seed: int,
    shuffle: bool,
    rows: list[tuple[int, float]],
    epoch_len: int,
) -> None:
    def run() -> list[Any]:
        dataset = open_dataset(runtime, cache_a, seed=seed, shuffle=shuffle)
        dataset.update_metadata(_population_table(dataset.get_metadata(), rows))
        dataset.set_epoch_len(epoch_len)
        return [full(dataset), idents(dataset.iter_batches()), window(dataset, 10**9, 20)]

    first, second = run(), run()
    assert first == second
    assert len(first[0]) == epoch_len
    # Only rows of the population are drawn.
    assert {s for _, s, _, _ in first[0]} <= {r for r, _ in rows}


@pytest.fixture(scope="module")
def weighted_pair(
    runtime: drt.DatasetRuntime, caches: tuple[Path, Path]
) -> tuple[drt.CachedDataset, drt.CachedDataset]:
    """A weighted two-cache dataset, shuffled and in order (windows never move them)."""
    out = []
    for shuffle in (True, False):
        dataset = open_dataset(runtime, list(caches), seed=12345, shuffle=shuffle)
        table = dataset.get_metadata()
        dataset.update_metadata(
            pl.concat([table, table.head(4)]).with_columns((pl.col("score") + 0.1).alias("weight"))
        )
        out.append(dataset)
    return out[0], out[1]


@PROPERTY
@given(
    shuffle=st.booleans(),
    start=st.one_of(st.integers(0, 10_000), st.integers(0, 2**62)),
    n=st.integers(0, 300),
    m=st.integers(0, 300),
    batch_size=st.integers(1, 64),
)
def test_property_windows_concatenate_to_the_stream(
    weighted_pair: tuple[drt.CachedDataset, drt.CachedDataset],
    shuffle: bool,
    start: int,
    n: int,
    m: int,
    batch_size: int,
) -> None:
    dataset = weighted_pair[0 if shuffle else 1]
    whole = idents(dataset.stream(start=start, count=n + m, columns=[]))
    head = idents(dataset.stream(start=start, count=n, columns=[], batch_size=batch_size))
    tail = idents(dataset.stream(start=start + n, count=m, columns=[]))
    assert head + tail == whole
    assert [p for p, _, _ in whole] == list(range(start, start + n + m))


@PROPERTY
@given(
    shuffle=st.booleans(),
    start=st.one_of(st.integers(0, 10_000), st.integers(0, 2**62)),
    count=st.integers(0, 400),
    world_size=st.integers(1, 9),
)
def test_property_stride_partitions_are_disjoint_and_cover_the_window(
    weighted_pair: tuple[drt.CachedDataset, drt.CachedDataset],
    shuffle: bool,
    start: int,
    count: int,
    world_size: int,
) -> None:
    dataset = weighted_pair[0 if shuffle else 1]
    whole = idents(dataset.stream(start=start, count=count, columns=[]))
    parts = [
        idents(
            dataset.stream(
                start=start + rank,
                count=len(range(rank, count, world_size)),
                stride=world_size,
                columns=[],
            )
        )
        for rank in range(world_size)
    ]
    positions = [p for part in parts for p, _, _ in part]
    assert len(positions) == len(set(positions)) == count
    assert sorted(ident for part in parts for ident in part) == whole
    for rank, part in enumerate(parts):
        assert all((p - start) % world_size == rank for p, _, _ in part)


@PROPERTY
@given(
    seeds=st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=2, unique=True),
    start=st.integers(0, 2**62),
)
def test_property_different_seeds_give_different_streams(
    runtime: drt.DatasetRuntime, cache_a: Path, seeds: list[int], start: int
) -> None:
    # 64 uniform draws over 30 rows agree by chance with probability 30**-64.
    streams = [window(open_dataset(runtime, cache_a, seed=seed), start, 64) for seed in seeds]
    assert streams[0] != streams[1]


@pytest.mark.parametrize("shuffle", [True, False])
def test_draw_rows_are_the_rows_the_stream_reads(runtime, tmp_path, shuffle):
    """`draw_rows` gives the active-table rows of exactly the stream's positions."""
    source = ListSource("draws", make_records(37))
    path = runtime.write_cache(
        source, tmp_path, writer_config=drt.WriterConfig(show_progress=False)
    )[0].path
    dataset = runtime.cached_dataset(
        [path], reader_config=drt.ReaderConfig(seed=5, shuffle=shuffle)
    )
    table = dataset.get_metadata()
    reweighted = table.with_columns((pl.col("label") + 1).cast(pl.Float64).alias("weight"))
    dataset.update_metadata(reweighted[::-1])
    rows = dataset.draw_rows(start=11, count=200, stride=3).to_pylist()
    batches = dataset.stream(start=11, count=200, stride=3, columns=[]).read_all()
    active = dataset.get_metadata()
    expected = list(
        zip(batches["cache_id"].to_pylist(), batches["sample_id"].to_pylist(), strict=True)
    )
    drawn = [(active["cache_id"][r], active["sample_id"][r]) for r in rows]
    assert drawn == expected
    assert dataset.draw_rows(count=0).to_pylist() == []
