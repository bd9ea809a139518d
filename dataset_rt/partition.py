"""`Partition`: one rank's share of an epoch, the one object both faces take.

The rule (docs/sampling.md) lives in Rust; `Partition(rank=..., world_size=...,
start=..., stop=..., block=..., offset=...)` validates its keys there. The
public methods take it as ``partition=``; `as_partition` is the one place where
the six keys, still accepted as keyword arguments for one release (deprecated),
are checked, warned about and built into one.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping

from dataset_rt._native import Partition
from dataset_rt.errors import InvalidArgumentError

__all__ = ["PARTITION_KEYS", "Partition", "as_partition"]

#: The keys of a `Partition`, in its constructor's order.
PARTITION_KEYS = ("rank", "world_size", "start", "stop", "block", "offset")


def as_partition(
    partition: Partition | None,
    keys: Mapping[str, int | None],
    *,
    method: str,
    takes: Collection[str] = PARTITION_KEYS,
) -> Partition:
    """``partition``, or one built from ``keys``, the deprecated keyword
    arguments that ``method`` (e.g. ``"CachedDataset.epoch"``) received.

    A key ``method`` does not take is a `TypeError` worded as Python's own; any
    key given emits one `DeprecationWarning` pointing at the line that called
    ``method``; keys that are None are unset (they take the rule's defaults: the
    whole epoch, rank 0 of 1). A `Partition` and keys together are refused.
    """
    for name in keys:
        if name not in takes:
            raise TypeError(f"{method}() got an unexpected keyword argument '{name}'")
    if partition is not None and not isinstance(partition, Partition):
        raise InvalidArgumentError(
            f"'partition' must be a dataset_rt.Partition, got {type(partition).__name__}"
        )
    given = {name: value for name, value in keys.items() if value is not None}
    if partition is not None and given:
        raise InvalidArgumentError(
            f"give a Partition or its keys, not both: got a Partition and {sorted(given)}"
        )
    if keys:
        named = ", ".join(f"{name}=..." for name in PARTITION_KEYS if name in keys)
        warnings.warn(
            f"{method}({named}) is deprecated and will be removed in the next release; "
            f"pass partition=dataset_rt.Partition({named})",
            DeprecationWarning,
            # as_partition <- the public method <- the caller's line.
            stacklevel=3,
        )
    return partition if partition is not None else Partition(**given)
