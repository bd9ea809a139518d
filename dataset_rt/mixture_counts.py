"""The mixture report's counts, aggregated batch by batch.

A report counts, per group of a column: the draws, the distinct samples drawn
and the samples of the populations drawn from. A Polars aggregation over the
manifest's (segment, cache_id, sample_id), joined to the populations, grew with
the draws: 3.3 GiB for 10^8 draws of a 10^6-sample population, 3.6 GiB for
9 * 10^6 of a 10^7-sample one. Here the draws stream through in batches of the
manifest's ``position``, ``cache_id`` and ``sample_id`` columns and are counted
into arrays that do not grow with them:

- per population, a `SampleIndex` (`dataset_rt.mixture_index`): its samples
  numbered, each one's group code and drawn flag;
- per group code, the draws; per population segment, the draws; per bin of the
  timeline and group, the draws (a run that switched populations);
- the (cache_id, sample_id) of draws outside the population of their segment
  (a manifest checked against another run's weights), deduplicated.

`MixtureCounts.add` takes a batch of any size: the counts are the same however
the draws are cut into batches (``tests/audit/test_mixture_counts.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dataset_rt.mixture_index import SampleIndex

Array = npt.NDArray[Any]


class MixtureCounts:
    """The draws of a manifest, counted batch by batch.

    ``segments`` are the run's population segments in order: the first
    position each draws from and its population's `SampleIndex` (indexes shared
    by segments of the same population). ``bins`` = ``(low, width, count)``
    also counts the draws per bin of ``width`` positions from ``low`` and group.
    """

    def __init__(
        self,
        segments: Sequence[tuple[int, SampleIndex]],
        groups: int,
        null_code: int,
        bins: tuple[int, int, int] | None = None,
    ) -> None:
        self.segments = list(segments)
        self.groups = groups
        self.null_code = null_code
        self.bins = bins
        # A segment is the number of starts after the first at or before a position.
        self._starts = np.sort(np.array([s for s, _ in self.segments[1:]], dtype=np.uint64))
        self.draws_per_segment = np.zeros(len(self.segments), dtype=np.int64)
        self.observed = np.zeros(groups, dtype=np.int64)
        self.timeline = np.zeros(0 if bins is None else bins[2] * groups, dtype=np.int64)
        self._outside: list[Array] = []  # (cache_id, sample_id) rows outside their population
        self._outside_rows = 0

    def add(self, position: Array, cache_id: Array, sample_id: Array) -> None:
        """Count one batch of draws (three equally long integer arrays)."""
        position = np.asarray(position, dtype=np.uint64)
        cache_id = np.asarray(cache_id, dtype=np.uint64)
        sample_id = np.asarray(sample_id, dtype=np.uint64)
        if not len(position):
            return
        if not len(self._starts):  # one population
            codes = self._codes(self.segments[0][1], cache_id, sample_id)
            self.draws_per_segment[0] += len(position)
        else:
            segment = np.searchsorted(self._starts, position, side="right")
            low, high = int(segment.min()), int(segment.max())
            if low == high:
                codes = self._codes(self.segments[low][1], cache_id, sample_id)
            else:  # a batch across a switch
                codes = np.empty(len(position), dtype=np.int64)
                for s in np.unique(segment).tolist():
                    rows = np.flatnonzero(segment == s)
                    index = self.segments[s][1]
                    codes[rows] = self._codes(index, cache_id[rows], sample_id[rows])
            self.draws_per_segment += np.bincount(segment, minlength=len(self.segments))
        self.observed += np.bincount(codes, minlength=self.groups)
        if self.bins is not None:
            first, width, count = self.bins
            bin_ = (position - np.uint64(first)) // np.uint64(width)
            cells = bin_.astype(np.int64) * self.groups + codes
            self.timeline += np.bincount(cells, minlength=count * self.groups)

    def _codes(self, index: SampleIndex, cache_id: Array, sample_id: Array) -> Array:
        """The group codes of draws from the population of ``index`` (null outside
        it), marking its drawn samples."""
        member = index.find(cache_id, sample_id)
        found = member >= 0
        if found.all():
            index.drawn[member] = True
            return index.codes[member]
        drawn = member[found]
        index.drawn[drawn] = True
        codes = np.full(len(member), self.null_code, dtype=np.int64)
        codes[found] = index.codes[drawn]
        missing = ~found
        self._keep_outside(cache_id[missing], sample_id[missing])
        return codes

    def _keep_outside(self, cache_id: Array, sample_id: Array) -> None:
        self._outside.append(np.unique(np.stack([cache_id, sample_id], axis=1), axis=0))
        self._outside_rows += len(self._outside[-1])
        if len(self._outside) > 1 and self._outside_rows > 2 * len(self._outside[0]) + (1 << 16):
            self._outside = [np.unique(np.concatenate(self._outside), axis=0)]
            self._outside_rows = len(self._outside[0])

    def used(self) -> list[SampleIndex]:
        """The distinct populations of the segments drawn from, in segment order."""
        chosen: dict[str, SampleIndex] = {}
        for (_, index), draws in zip(self.segments, self.draws_per_segment.tolist(), strict=True):
            if draws:
                chosen.setdefault(index.population, index)
        return list(chosen.values())

    def distinct(self) -> Array:
        """Per group: the samples drawn at least once. A sample drawn from two
        populations counts once per group it has in them; a sample outside the
        population of its segment is in the null group."""
        outside = np.unique(np.concatenate(self._outside), axis=0) if self._outside else None
        return _union_counts(
            self.used(), self.groups, drawn=True, outside=outside, null=self.null_code
        )

    def samples(self) -> Array:
        """Per group: the distinct samples of the populations drawn from."""
        return _union_counts(self.used(), self.groups, drawn=False)


def _union_counts(
    indexes: Sequence[SampleIndex],
    groups: int,
    *,
    drawn: bool,
    outside: Array | None = None,
    null: int = 0,
) -> Array:
    """Per group code, the distinct (group, sample) pairs of ``indexes`` (only
    the drawn ones with ``drawn``), and the ``outside`` (cache_id, sample_id)
    pairs in group ``null``. A pair is counted by the first index that has it."""
    counts = np.zeros(groups, dtype=np.int64)
    for i, index in enumerate(indexes):
        if i == 0:
            mine = index.codes[index.drawn] if drawn else index.codes
            counts += np.bincount(mine, minlength=groups)
            continue
        for numbers, cache_ids, sample_ids in index.members():
            codes = index.codes[numbers]
            keep = index.drawn[numbers].copy() if drawn else np.ones(len(codes), dtype=bool)
            for earlier in indexes[:i]:
                keep &= ~_has(earlier, cache_ids, sample_ids, codes, drawn=drawn)
            counts += np.bincount(codes[keep], minlength=groups)
    if outside is not None and len(outside):
        codes = np.full(len(outside), null, dtype=np.int64)
        keep = np.ones(len(outside), dtype=bool)
        for earlier in indexes:
            keep &= ~_has(earlier, outside[:, 0], outside[:, 1], codes, drawn=drawn)
        counts[null] += int(keep.sum())
    return counts


def _has(
    index: SampleIndex, cache_ids: Array, sample_ids: Array, codes: Array, *, drawn: bool
) -> Array:
    """Whether ``index`` has each sample with the same group code (and drawn)."""
    member = index.find(cache_ids, sample_ids)
    found = member >= 0
    same = np.zeros(len(member), dtype=bool)
    hit = member[found]
    match = index.codes[hit] == codes[found]
    if drawn:
        match &= index.drawn[hit]
    same[found] = match
    return same
