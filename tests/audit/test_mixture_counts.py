"""The report's streamed counts (`dataset_rt.mixture_counts`): the same however
the draws are cut into batches, and the same as counting them one by one."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataset_rt as drt
from dataset_rt import mixture_index
from dataset_rt.mixture_counts import MixtureCounts
from dataset_rt.mixture_index import SampleIndex, group_values

#: Cache ids across the uint64 range (the slots must not depend on their size).
CACHES = (3, 1 << 40, (1 << 64) - 5)
GROUPS = ("a", "b", "c", None)
SAMPLES = 40  # sample ids 0..39 per cache; draws also name ids up to 47 (outside)
SWITCH = 300  # the second population is drawn from this position on

sample = st.tuples(st.sampled_from(CACHES), st.integers(0, SAMPLES - 1))
population = st.dictionaries(sample, st.sampled_from(GROUPS), min_size=1, max_size=60)
draw = st.tuples(
    st.integers(0, 599), st.sampled_from(CACHES), st.integers(0, SAMPLES + 7)
)  # position, cache_id, sample_id


def table(groups: dict[tuple[int, int], str | None], repeats: int) -> pl.DataFrame:
    """A population table listing ``groups``' samples, the first ``repeats`` twice
    (a sample listed twice is one sample)."""
    keys = list(groups)
    keys += keys[:repeats]
    return pl.DataFrame(
        {
            "cache_id": [c for c, _ in keys],
            "sample_id": [s for _, s in keys],
            "tag": [groups[k] for k in keys],
            "weight": [1.0 + (c % 7) + s / 8 for c, s in keys],
        },
        schema={
            "cache_id": pl.UInt64,
            "sample_id": pl.UInt64,
            "tag": pl.String,
            "weight": pl.Float64,
        },
    )


def count(
    first: dict[tuple[int, int], str | None],
    second: dict[tuple[int, int], str | None],
    draws: list[tuple[int, int, int]],
    cuts: list[int],
    direct: bool,
) -> dict[str, Any]:
    """The counts of ``draws`` fed in batches cut at ``cuts``, by group value
    (samples numbered slot by slot, or ranked in a bitmap)."""
    indexes = [
        SampleIndex.of(table(first, 3), "tag", "p1", weighted=True, direct=direct),
        SampleIndex.of(table(second, 0), "tag", "p2", weighted=True, direct=direct),
    ]
    values, null = group_values(indexes)
    counts = MixtureCounts([(0, indexes[0]), (SWITCH, indexes[1])], len(values), null, (0, 10, 60))
    columns = np.array(draws, dtype=np.uint64).reshape(-1, 3)
    for rows in np.split(columns, sorted(cuts)):
        counts.add(rows[:, 0], rows[:, 1], rows[:, 2])
    named = values.to_list()
    timeline = counts.timeline.reshape(60, len(values))
    return {
        "observed": dict(zip(named, counts.observed.tolist(), strict=True)),
        "distinct": dict(zip(named, counts.distinct().tolist(), strict=True)),
        "samples": dict(zip(named, counts.samples().tolist(), strict=True)),
        "segments": counts.draws_per_segment.tolist(),
        "timeline": {
            (int(b), named[g]): int(timeline[b, g])
            for b, g in zip(*np.nonzero(timeline), strict=True)
        },
    }


def one_by_one(
    first: dict[tuple[int, int], str | None],
    second: dict[tuple[int, int], str | None],
    draws: list[tuple[int, int, int]],
) -> dict[str, Any]:
    """The same counts, with dicts and sets, one draw at a time."""
    observed: dict[str | None, int] = {}
    distinct: set[tuple[str | None, tuple[int, int]]] = set()
    timeline: dict[tuple[int, str | None], int] = {}
    segments = [0, 0]
    for position, cache_id, sample_id in draws:
        segment = int(position >= SWITCH)
        segments[segment] += 1
        group = (first, second)[segment].get((cache_id, sample_id))  # None outside it
        observed[group] = observed.get(group, 0) + 1
        distinct.add((group, (cache_id, sample_id)))
        timeline[(position // 10, group)] = timeline.get((position // 10, group), 0) + 1
    used = [groups for groups, n in zip((first, second), segments, strict=True) if n]
    samples = {(g, key) for groups in used for key, g in groups.items()}
    return {
        "observed": observed,
        "distinct": _tally(g for g, _ in distinct),
        "samples": _tally(g for g, _ in samples),
        "segments": segments,
        "timeline": timeline,
    }


def _tally(groups: Any) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for group in groups:
        out[group] = out.get(group, 0) + 1
    return out


def _nonzero(counts: dict[Any, int]) -> dict[Any, int]:
    return {key: n for key, n in counts.items() if n}


@settings(max_examples=60, deadline=None)
@given(
    first=population,
    second=population,
    draws=st.lists(draw, min_size=1, max_size=300),
    data=st.data(),
)
def test_batches_do_not_change_the_counts(
    first: dict[tuple[int, int], str | None],
    second: dict[tuple[int, int], str | None],
    draws: list[tuple[int, int, int]],
    data: st.DataObject,
) -> None:
    """Two populations (a switch at position 300), draws inside and outside
    them, null groups, a sample listed twice: the counts of one batch, of
    batches cut anywhere (empty ones too), with either numbering, and of one
    draw at a time agree."""
    cuts = data.draw(st.lists(st.integers(0, len(draws)), max_size=12))
    whole = count(first, second, draws, [], direct=True)
    assert count(first, second, draws, cuts, direct=True) == whole
    assert count(first, second, draws, list(range(1, len(draws))), direct=True) == whole
    assert count(first, second, draws, cuts, direct=False) == whole
    with pytest.MonkeyPatch.context() as patch:  # populations read and listed in many chunks
        patch.setattr(mixture_index, "CHUNK", 64)
        assert count(first, second, draws, cuts, direct=False) == whole
        assert count(first, second, draws, cuts, direct=True) == whole
    expected = one_by_one(first, second, draws)
    for key in ("observed", "distinct", "samples", "timeline"):
        assert _nonzero(whole[key]) == expected[key], key
    assert whole["segments"] == expected["segments"]


def test_a_sample_with_two_groups_is_refused() -> None:
    groups = {(3, 1): "a", (3, 2): "b"}
    doubled = pl.concat([table(groups, 0), table({(3, 1): "b"}, 0)])
    with pytest.raises(drt.InvalidArgumentError, match=r"sample \(cache_id=3, sample_id=1\)"):
        SampleIndex.of(doubled, "tag", "p", weighted=False)


def test_both_numberings_find_the_same_members(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Numbered slot by slot or ranked in a bitmap (with numpy's popcount or,
    as numpy < 2 has none, a byte table), a sample is found as its rank."""
    rng = np.random.default_rng(7)
    ids = np.unique(rng.integers(0, 5000, 800))
    members = pl.DataFrame(
        {"cache_id": np.full(len(ids), 9, np.uint64), "sample_id": ids.astype(np.uint64)}
    ).with_columns(pl.lit("x").alias("tag"))
    probe = rng.integers(0, 5100, 4000).astype(np.uint64)
    cache = np.full(len(probe), 9, np.uint64)
    found = SampleIndex.of(members, "tag", "p", weighted=False, direct=False).find(cache, probe)
    direct = SampleIndex.of(members, "tag", "p", weighted=False, direct=True).find(cache, probe)
    assert (found == direct).all()
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert getattr(np, "bitwise_count", None) is None
    without = SampleIndex.of(members, "tag", "p", weighted=False, direct=False)
    assert (without.find(cache, probe) == found).all()
    rank = np.searchsorted(ids, probe)
    inside = np.isin(probe, ids)
    assert (found == np.where(inside, rank, -1)).all()
    assert mixture_index.popcount(np.array([0, 1, (1 << 64) - 1], np.uint64)).tolist() == [
        0,
        1,
        64,
    ]
