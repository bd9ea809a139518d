"""`Partition`: one rank's share of an epoch, the one object both faces take.

The rule (docs/sampling.md) lives in Rust; `Partition(rank=..., world_size=...,
start=..., stop=..., block=..., offset=...)` validates its keys there, and
`as_partition` is the one place where the keyword arguments the APIs still
accept become one.
"""

from __future__ import annotations

from typing import Any

from dataset_rt._native import Partition
from dataset_rt.errors import InvalidArgumentError

__all__ = ["Partition", "as_partition"]


def as_partition(partition: Partition | None = None, **keys: Any) -> Partition:
    """``partition``, or one built from the keyword arguments that are not
    None (unset keys take the rule's defaults: the whole epoch, rank 0 of 1)."""
    given = {name: value for name, value in keys.items() if value is not None}
    if partition is None:
        return Partition(**given)
    if not isinstance(partition, Partition):
        raise InvalidArgumentError(
            f"'partition' must be a dataset_rt.Partition, got {type(partition).__name__}"
        )
    if given:
        raise InvalidArgumentError(
            f"give a Partition or its keys, not both: got a Partition and {sorted(given)}"
        )
    return partition
