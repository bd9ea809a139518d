"""A population's samples, numbered for the mixture report's streamed counts.

The report finds, for every draw of a manifest, its sample in the population it
was drawn from: its group and whether it was drawn before. A hash table or a
join per batch costs a pass over the population for every batch, and a sorted
search ``np.searchsorted`` 400 ns to 2 us a draw at 10^6-10^7 samples (cache
misses); here a sample's *slot* (its ``sample_id`` after the slots of the
population's caches before its own, each cache taking its largest listed
``sample_id`` + 1) is its address:

- a population that fills most of its slots (all of a cache, or a reweighting of
  it) keeps a member number per slot: 4 bytes a slot, about 5 ns a draw;
- a sparse one (a small subset of a large cache) keeps a bit per slot and the
  members before each 64-slot word, and ranks: 1/4 byte a slot, about 35 ns a draw.

Either way a `SampleIndex` also keeps each member's group code (1 to 4 bytes)
and a drawn flag (1 byte), and each group's weight (or row count): not the
population's table, which is read in slices and let go.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from dataset_rt.errors import InvalidArgumentError

Array = npt.NDArray[Any]

#: Rows of a population read at once, and slots listed at once.
CHUNK = 1 << 20

#: A population is numbered slot by slot when it has at least one member per
#: this many slots (or few slots): 16 bytes a member at most.
DIRECT_SLOTS_PER_MEMBER = 4

#: Weights turned into Python floats at once for `math.fsum`.
_FSUM_CHUNK = 1 << 16

_ONE = np.uint64(1)
_SIX = np.uint64(6)
_LOW6 = np.uint64(63)
_BYTE_BITS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


@dataclasses.dataclass
class SampleIndex:
    """The distinct samples of one population, numbered in (cache_id,
    sample_id) order: each one's group code, whether it was drawn, and per code
    the weights' sum (weighted draws) or rows (ordered, permutation)."""

    population: str
    caches: Array  # sorted distinct cache ids, uint64
    offsets: Array  # first slot of each cache, then the slot count, uint64
    numbering: DirectNumbers | RankedBitmap
    codes: Array  # group code of each member
    drawn: Array  # bool per member
    values: pl.Series  # the group values the codes number (local until `renumber`)
    masses: Array  # per code, float64

    @classmethod
    def of(
        cls,
        table: pl.DataFrame,
        group: str,
        population: str,
        *,
        weighted: bool,
        direct: bool | None = None,
    ) -> SampleIndex:
        """Index ``table`` (a population: ``cache_id``, ``sample_id``, ``group``
        and, ``weighted``, ``weight``); a sample listed twice with two values of
        ``group`` has no single group and is refused. ``direct`` forces the
        numbering (by default chosen by density).

        The table is read in slices of `CHUNK` rows (a population table arrives
        in many chunks: a whole column as numpy would be a copy)."""
        slices = list(table.iter_slices(CHUNK))
        values = (
            pl.concat([piece.get_column(group).unique() for piece in slices])
            .unique()
            .sort(nulls_last=True)
        )
        per_cache = (
            table.group_by("cache_id").agg(pl.col("sample_id").max().alias("last")).sort("cache_id")
        )
        caches = np.asarray(per_cache.get_column("cache_id").to_numpy(), dtype=np.uint64)
        offsets = np.zeros(len(caches) + 1, dtype=np.uint64)
        np.cumsum(
            np.asarray(per_cache.get_column("last").to_numpy(), dtype=np.uint64) + _ONE,
            out=offsets[1:],
        )
        codes, slots, masses = _read(slices, group, values, caches, offsets, weighted=weighted)
        del slices
        if len(slots) > 1 and not bool(np.all(slots[1:] >= slots[:-1])):
            order = np.argsort(slots, kind="stable")
            slots, codes = slots[order], codes[order]
            del order
        new = np.ones(len(slots), dtype=bool)
        np.not_equal(slots[1:], slots[:-1], out=new[1:])
        clash = ~new[1:] & (codes[1:] != codes[:-1])
        if clash.any():
            slot = slots[int(np.argmax(clash))]
            cache = int(np.searchsorted(offsets, slot, side="right")) - 1
            raise InvalidArgumentError(
                f"population {population} lists sample (cache_id={int(caches[cache])}, "
                f"sample_id={int(slot - offsets[cache])}) with two values of {group!r}; "
                "a grouping column needs one value per sample"
            )
        del clash
        if not new.all():  # a sample listed twice is one sample
            slots, codes = slots[new], codes[new]
        del new
        count = int(offsets[-1])
        if direct is None:
            direct = count <= DIRECT_SLOTS_PER_MEMBER * len(slots) + CHUNK
        numbering = (DirectNumbers if direct else RankedBitmap).of(slots, count)
        return cls(
            population=population,
            caches=caches,
            offsets=offsets,
            numbering=numbering,
            codes=codes,
            drawn=np.zeros(len(codes), dtype=bool),
            values=values,
            masses=masses,
        )

    def find(self, cache_ids: Array, sample_ids: Array) -> Array:
        """The member number of each (cache_id, sample_id) (uint64 arrays); -1
        where the sample is not in the population."""
        if len(self.caches) == 1:  # the common case: no search
            known = (cache_ids == self.caches[0]) & (sample_ids < self.offsets[1])
            if known.all():
                return self.numbering.numbers(sample_ids)
            slot = np.where(known, sample_ids, np.uint64(0))
        elif len(self.caches):
            cache = np.minimum(np.searchsorted(self.caches, cache_ids), len(self.caches) - 1)
            first = self.offsets[cache]
            known = (self.caches[cache] == cache_ids) & (
                sample_ids < self.offsets[cache + 1] - first
            )
            slot = np.where(known, first + sample_ids, np.uint64(0))
        else:
            return np.full(len(cache_ids), -1, dtype=np.int64)
        return np.where(known, self.numbering.numbers(slot), -1)

    def members(self) -> Iterable[tuple[Array, Array, Array]]:
        """The members, in chunks: their numbers, cache ids and sample ids."""
        for start in range(0, int(self.offsets[-1]), CHUNK):
            numbers, slots = self.numbering.listed(start, start + CHUNK)
            cache = np.searchsorted(self.offsets, slots, side="right") - 1
            yield numbers, self.caches[cache], slots - self.offsets[cache]

    def renumber(self, values: pl.Series) -> None:
        """Number the groups by ``values`` (which hold every value of this index's)."""
        numbered = pl.DataFrame({"value": values}).with_row_index("code")
        mine = pl.DataFrame({"value": self.values.cast(values.dtype)})
        mapping = (
            mine.join(numbered, on="value", how="left", nulls_equal=True, maintain_order="left")
            .get_column("code")
            .to_numpy()
        )
        self.codes = mapping.astype(np.min_scalar_type(len(values) - 1))[self.codes]
        masses = np.zeros(len(values), dtype=np.float64)
        masses[mapping] = self.masses
        self.values, self.masses = values, masses


@dataclasses.dataclass
class DirectNumbers:
    """The member number of every slot (-1 for none)."""

    table: Array

    @classmethod
    def of(cls, slots: Array, count: int) -> DirectNumbers:
        """``slots``: the members' slots, ascending and distinct, of ``count``."""
        table = np.full(max(count, 1), -1, dtype=np.int32 if len(slots) < 1 << 31 else np.int64)
        table[slots] = np.arange(len(slots), dtype=table.dtype)
        return cls(table)

    def numbers(self, slot: Array) -> Array:
        return self.table[slot]

    def listed(self, start: int, stop: int) -> tuple[Array, Array]:
        """The numbers and slots of the members in slots [start, stop)."""
        slots = np.flatnonzero(self.table[start:stop] >= 0).astype(np.uint64) + np.uint64(start)
        return self.table[slots], slots


@dataclasses.dataclass
class RankedBitmap:
    """A bit per slot (uint64 words) and the members before each word: a
    member's number is the set bits before its own."""

    words: Array
    ranks: Array  # members before each word, then the member count, int64

    @classmethod
    def of(cls, slots: Array, count: int) -> RankedBitmap:
        """``slots``: the members' slots, ascending and distinct, of ``count``."""
        words = np.zeros(max(1, -(-count // 64)), dtype=np.uint64)
        for start in range(0, len(slots), CHUNK):
            chunk = slots[start : start + CHUNK]
            word = chunk >> _SIX
            firsts = np.flatnonzero(np.concatenate(([True], word[1:] != word[:-1])))
            # The slots of a word are distinct bits: their sum is their union.
            words[word[firsts]] |= np.add.reduceat(_ONE << (chunk & _LOW6), firsts)
        ranks = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum(popcount(words), out=ranks[1:])
        return cls(words, ranks)

    def numbers(self, slot: Array) -> Array:
        index = slot >> _SIX
        word = self.words[index]
        bit = slot & _LOW6
        number = self.ranks[index] + popcount(word & ((_ONE << bit) - _ONE))
        return np.where(((word >> bit) & _ONE).astype(bool), number, -1)

    def listed(self, start: int, stop: int) -> tuple[Array, Array]:
        """The numbers and slots of the members in slots [start, stop) (multiples of 64)."""
        words = self.words[start // 64 : -(-stop // 64)]
        octets = np.ascontiguousarray(words, dtype="<u8").view(np.uint8)
        bits = np.unpackbits(octets, bitorder="little")
        slots = np.flatnonzero(bits).astype(np.uint64) + np.uint64(start)
        first = int(self.ranks[start // 64])
        return np.arange(first, first + len(slots)), slots


def popcount(words: Array) -> Array:
    """The set bits of each uint64, as int64 (numpy >= 2 counts them itself)."""
    count = getattr(np, "bitwise_count", None)
    if count is not None:
        return count(words).astype(np.int64)  # type: ignore[no-any-return]
    octets = np.ascontiguousarray(words, dtype="<u8").view(np.uint8)
    return _BYTE_BITS[octets].reshape(-1, 8).sum(axis=1, dtype=np.int64)  # type: ignore[no-any-return]


def group_values(indexes: Sequence[SampleIndex]) -> tuple[pl.Series, int]:
    """Number the group values of all ``indexes`` together (sorted, null last,
    and a null added when none has one: the group of a draw outside its
    population), renumbering each; returns the values and the null's code."""
    values = (
        pl.concat([index.values.to_frame() for index in indexes], how="vertical_relaxed")
        .to_series()
        .unique()
        .sort(nulls_last=True)
    )
    if not values.has_nulls():
        values = pl.concat([values, pl.Series(values.name, [None], dtype=values.dtype)])
    for index in indexes:
        index.renumber(values)
    return values, len(values) - 1


def _read(
    slices: Sequence[pl.DataFrame],
    group: str,
    values: pl.Series,
    caches: Array,
    offsets: Array,
    *,
    weighted: bool,
) -> tuple[Array, Array, Array]:
    """Each row's group code (its value's index in ``values``) and slot, and each
    code's mass: its weights' `math.fsum` (``weighted``) or its rows."""
    kind, dtype = (
        (pl.UInt8(), np.uint8)
        if len(values) <= 1 << 8
        else (pl.UInt16(), np.uint16)
        if len(values) <= 1 << 16
        else (pl.UInt32(), np.uint32)
    )
    numbers = pl.int_range(len(values), eager=True)
    rows = sum(len(piece) for piece in slices)
    codes = np.empty(rows, dtype=dtype)
    slots = np.empty(rows, dtype=np.uint64)
    weights = _WeightsByCode(len(values)) if weighted else None
    first = 0
    for piece in slices:
        these = slice(first, first + len(piece))
        first += len(piece)
        mine = piece.get_column(group).replace_strict(values, numbers, return_dtype=kind)
        codes[these] = mine.to_numpy()
        cache_ids = np.asarray(piece.get_column("cache_id").to_numpy(), dtype=np.uint64)
        sample_ids = np.asarray(piece.get_column("sample_id").to_numpy(), dtype=np.uint64)
        np.add(offsets[np.searchsorted(caches, cache_ids)], sample_ids, out=slots[these])
        if weights is not None:
            weights.add(codes[these], piece.get_column("weight").to_numpy())
    if weights is not None:
        return codes, slots, weights.sums()
    return codes, slots, np.bincount(codes, minlength=len(values)).astype(np.float64)


class _WeightsByCode:
    """A population's weights by group code, for `math.fsum`: correctly rounded,
    so a group's weight is the same number however the rows are ordered or
    chunked. (The weights are kept as float64, not as Python floats.)"""

    def __init__(self, count: int) -> None:
        self._pieces: list[list[Array]] = [[] for _ in range(count)]

    def add(self, codes: Array, weights: Array) -> None:
        order = np.argsort(codes, kind="stable")
        grouped = np.asarray(weights, dtype=np.float64)[order]
        ends = np.cumsum(np.bincount(codes, minlength=len(self._pieces))).tolist()
        for code, (start, end) in enumerate(itertools.pairwise([0, *ends])):
            if end > start:
                self._pieces[code].append(grouped[start:end])

    def sums(self) -> Array:
        return np.array(
            [
                math.fsum(
                    itertools.chain.from_iterable(
                        piece[i : i + _FSUM_CHUNK].tolist()
                        for piece in pieces
                        for i in range(0, len(piece), _FSUM_CHUNK)
                    )
                )
                for pieces in self._pieces
            ],
            dtype=np.float64,
        )
