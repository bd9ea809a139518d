"""`CachedDataset.dump_config` / `from_config`: a dataset's settings and active
population saved to a directory, and a fresh dataset built from them.

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

from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from dataset_rt.config import ReaderConfig
from dataset_rt.errors import InvalidArgumentError

if TYPE_CHECKING:
    from dataset_rt.dataset import CachedDataset

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


def dump_configuration(dataset: CachedDataset, directory: str | Path) -> Path:
    """Export ``dataset`` into ``directory``; returns the ``dataset.json`` path."""
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
    table = dataset.get_metadata().to_arrow()
    configuration = DatasetConfiguration(
        cache_paths=tuple(path.resolve() for path in dataset.cache_paths),
        reader_config=dataset.reader_config,
        num_workers=dataset.num_workers,
        epoch_len=len(dataset),
        row_count=table.num_rows,
    )
    with metadata_path.open("xb") as binary, pa.ipc.new_file(binary, table.schema) as writer:
        writer.write_table(table)
    with config_path.open("x") as text:
        text.write(configuration.model_dump_json(indent=2) + "\n")
    return config_path


def load_configuration(path: str | Path) -> CachedDataset:
    """A fresh dataset from a ``dataset.json`` written by `dump_configuration`."""
    from dataset_rt.runtime import DatasetRuntime

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
    runtime = DatasetRuntime(num_workers=configuration.num_workers)
    dataset = runtime.cached_dataset(
        list(configuration.cache_paths), reader_config=configuration.reader_config
    )
    dataset.update_metadata(table)
    dataset.set_epoch_len(configuration.epoch_len)
    return dataset
