"""Writing a cache where one exists: reuse it when identical, refuse it otherwise.

A cache directory is written once and never replaced. The engine's writer decides
what a write over an existing ``base_dir/name`` does when it publishes
(``native/src/storage/publish.rs``): it compares the ``cache_id`` of the records it
wrote with the existing cache's (docs/storage-format.md, "Identity": the name, the
column names and types, and every record in order; compression and shard size do
not enter it):

- the same id: the existing cache is kept and the new copy removed;
- another id: `InvalidArgumentError` naming the directory, both ids and what to do;

so a concurrent writer of the same records is a reuse too, never an error. The
writing calls come here first: `DatasetRuntime.write_cache`, `write_arrow` and
``python -m dataset_rt import``. An existing cache that is damaged or incomplete is
the engine's `CorruptCacheError`, naming the file, before anything is written (the
cache is never used and never deleted); a table whose row count differs from the
cache's records is refused before anything is written too.

The open-or-write calls (`from_cache_sources`, `ensure_caches`, `from_arrow`,
``python -m dataset_rt write``) do not come here: they open an existing cache
without reading their source again (its name stands for its records, as in
dataset-rt 0.4.8), which is what makes a second run cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dataset_rt import _native
from dataset_rt.errors import InvalidArgumentError


def write_or_reuse(
    base_dir: Path,
    name: str,
    write: Callable[[Path], str | os.PathLike[str]],
    *,
    full_check: bool,
    records: int | None = None,
) -> tuple[Path, bool]:
    """The cache ``base_dir/name``, written by ``write(base_dir)`` or reused; and
    whether it existed (and was kept).

    When it exists, it is checked first (every checksum with ``full_check``);
    ``records`` is the number of records ``write`` would write when the caller knows
    it exactly (a table's rows): another count is refused without writing anything.
    """
    target = base_dir / name
    existed = target.exists()
    if existed:
        _native.check_cache(str(target), full_check)
        existing = _native.describe_manifest(str(target))  # just checked
        if records is not None and records != existing.record_count:
            raise InvalidArgumentError(
                f"{target} already exists and holds other records (cache_id "
                f"{existing.cache_id}, {existing.record_count} records; the data given has "
                f"{records} records). Caches are immutable and a cache is reused only for "
                f"the same records: give these records another name (e.g. {target.name}_v2) "
                f"or another base directory, or remove {target} to write it again"
            )
    return Path(write(base_dir)), existed
