"""`CachedDataset.dump_config` / `from_config`: a dataset's settings and active
population saved to a directory, and read back to build a fresh dataset. This
module knows files and settings only; `CachedDataset` builds and fills the
dataset (so the two do not import each other).

The export is two files in an existing directory that holds no export yet:
``metadata.arrow`` (the active population as an Arrow IPC file: rows, order,
duplicates, weights and extra columns) and then ``dataset.json`` (the absolute
cache paths, the `ReaderConfig`, the worker count, the epoch length and the row
count), written last so that a ``dataset.json`` is only ever next to complete
metadata. Files are created exclusively: an export never overwrites anything.
Payloads are not copied; the caches must stay where they are. The stream
position is not saved: a rebuilt dataset starts at position 0.

Loading validates the settings (pydantic) and the population (the engine, as
`update_metadata` does), then restores the epoch length.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from dataset_rt.config import ReaderConfig
from dataset_rt.errors import InvalidArgumentError

CONFIG_NAME = "dataset.json"
METADATA_NAME = "metadata.arrow"


class DatasetConfiguration(BaseModel):
    """The content of ``dataset.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["dataset_rt.dataset_config.v1"] = "dataset_rt.dataset_config.v1"
    cache_paths: tuple[Path, ...] = Field(min_length=1)
    reader_config: ReaderConfig
    num_workers: int = Field(ge=1)
    epoch_len: int = Field(ge=1)
    row_count: int = Field(ge=1)


def dump_configuration(
    directory: str | Path,
    table: pa.Table,
    *,
    cache_paths: Sequence[Path],
    reader_config: ReaderConfig,
    num_workers: int,
    epoch_len: int,
) -> Path:
    """Export a dataset's active ``table`` and settings into ``directory``;
    returns the ``dataset.json`` path."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidArgumentError(
            f"dump_config needs an existing directory, got {directory} (create it first)"
        )
    config_path, metadata_path = directory / CONFIG_NAME, directory / METADATA_NAME
    for path in (config_path, metadata_path):
        if path.exists():
            raise InvalidArgumentError(
                f"{path} already exists; an export never overwrites: use an empty directory"
            )
    configuration = DatasetConfiguration(
        cache_paths=tuple(path.resolve() for path in cache_paths),
        reader_config=reader_config,
        num_workers=num_workers,
        epoch_len=epoch_len,
        row_count=table.num_rows,
    )
    with metadata_path.open("xb") as binary, pa.ipc.new_file(binary, table.schema) as writer:
        writer.write_table(table)
    with config_path.open("x") as text:
        text.write(configuration.model_dump_json(indent=2) + "\n")
    return config_path


def load_configuration(path: str | Path) -> tuple[DatasetConfiguration, pa.Table]:
    """The settings and the population of a ``dataset.json`` written by
    `dump_configuration`, validated (the population is validated again by the
    engine when the dataset takes it)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"from_config needs an existing dataset.json, got {path}")
    configuration = DatasetConfiguration.model_validate_json(path.read_bytes())
    with pa.memory_map(str(path.parent / METADATA_NAME)) as source:
        table = pa.ipc.open_file(source).read_all()
    if table.num_rows != configuration.row_count:
        raise InvalidArgumentError(
            f"{path.parent / METADATA_NAME} has {table.num_rows} rows, {path} says "
            f"{configuration.row_count}: the export is incomplete or was modified"
        )
    return configuration, table
