"""Ray Data writes a dataset of many caches (issue 48, deliverable 3), on a real
local Ray cluster of two nodes (tests/ray/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dataset_rt as drt
from dataset_rt.parts import DatasetWrite, read_descriptor

ray = pytest.importorskip("ray")
from dataset_rt.ray import CacheDatasink, part_name, write_dataset  # noqa: E402

READER = drt.ReaderConfig(seed=0, shuffle=False)
QUIET = drt.WriterConfig(show_progress=False)
ROWS = 20_000
BLOCKS = 4


def source_blocks() -> list[pa.Table]:
    """``ROWS`` rows in ``BLOCKS`` tables: payloads of varied sizes, two metadata columns."""
    per = ROWS // BLOCKS
    blocks = []
    for b in range(BLOCKS):
        ids = range(b * per, (b + 1) * per)
        blocks.append(
            pa.table(
                {
                    "image": pa.array([i.to_bytes(8, "little") * (1 + i % 17) for i in ids]),
                    "label": pa.array([i % 10 for i in ids], pa.int64()),
                    "path": pa.array([f"img/{i:07d}.jpg" for i in ids]),
                }
            )
        )
    return blocks


def payloads(dataset: drt.CachedDataset) -> list[bytes]:
    return [sample.data for sample in dataset]


def test_two_ray_nodes_write_what_one_process_writes(
    ray_cluster: Any, tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    blocks = source_blocks()
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ds = ray.data.from_arrow(blocks)
    sink = CacheDatasink(
        tmp_path / "ray", name="images", payload_column="image", input={"blocks": BLOCKS}
    )
    ds.write_datasink(sink)
    committed = sink.committed
    assert committed is not None
    assert committed.created
    assert (committed.caches, committed.records) == (BLOCKS, ROWS)
    descriptor = read_descriptor(tmp_path / "ray")
    assert descriptor is not None
    assert descriptor["input"] == {"blocks": BLOCKS}

    # The library, in this process, from the same rows in the same partitioning.
    write = DatasetWrite.begin(tmp_path / "local")
    parts = [
        write.write_part(
            part_name(i), block, payload_column="image", runtime=runtime, writer_config=QUIET
        )
        for i, block in enumerate(blocks)
    ]
    write.commit(parts, name="images")
    ids = [int(c["cache_id"], 16) for c in descriptor["caches"]]
    assert ids == [p.cache_id for p in parts]

    by_ray = runtime.open_dataset(tmp_path / "ray", reader_config=READER)
    by_one = runtime.open_dataset(tmp_path / "local", reader_config=READER)
    expected = [v for block in blocks for v in block.column("image").to_pylist()]
    assert payloads(by_ray) == payloads(by_one) == expected
    assert by_ray.get_metadata().drop("cache_id").equals(by_one.get_metadata().drop("cache_id"))


class FailsOnceAfterWriting(CacheDatasink):
    """Publishes its part, then fails the task's first attempt: Ray retries it."""

    def __init__(self, *args: Any, marker_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._marker_dir = marker_dir

    def write(self, blocks: Any, ctx: Any) -> Any:
        part = super().write(blocks, ctx)
        marker = self._marker_dir / f"{ctx.task_idx}"
        if not marker.exists():
            marker.touch()
            raise RuntimeError("injected failure after the part was published")
        return part


def test_a_retried_write_task_writes_no_second_part(
    ray_cluster: Any, tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    (tmp_path / "markers").mkdir()
    blocks = source_blocks()
    sink = FailsOnceAfterWriting(
        tmp_path / "ray", name="images", payload_column="image", marker_dir=tmp_path / "markers"
    )
    ray.data.from_arrow(blocks).write_datasink(
        sink, ray_remote_args={"max_retries": 2, "retry_exceptions": True}
    )
    assert len(list((tmp_path / "markers").iterdir())) == BLOCKS  # every task failed once
    parts_dir = tmp_path / "ray" / "parts" / sink.dataset_write.write_id
    assert sorted(p.name for p in parts_dir.iterdir()) == [part_name(i) for i in range(BLOCKS)]
    dataset = runtime.open_dataset(tmp_path / "ray", reader_config=READER)
    assert dataset.num_rows == ROWS
    assert sorted(payloads(dataset)) == sorted(
        v for block in blocks for v in block.column("image").to_pylist()
    )


def test_a_failed_job_leaves_no_dataset_and_its_parts_are_removable(
    ray_cluster: Any, tmp_path: Path
) -> None:
    def poison(batch: dict[str, Any]) -> dict[str, Any]:
        if "img/0019999.jpg" in batch["path"]:  # in the last block only
            raise ValueError("a bad row")
        return batch

    ds = ray.data.from_arrow(source_blocks()).map_batches(poison, batch_format="numpy")
    sink = CacheDatasink(tmp_path / "ray", name="images", payload_column="image")
    with pytest.raises(Exception, match="a bad row"):
        ds.write_datasink(sink)
    assert sink.committed is None
    assert read_descriptor(tmp_path / "ray") is None
    with pytest.raises(drt.DatasetRTError):
        drt.DatasetRuntime(num_workers=1).open_dataset(tmp_path / "ray", reader_config=READER)
    from dataset_rt.parts import remove_uncommitted

    removal = remove_uncommitted(tmp_path / "ray", min_age_seconds=0)
    assert removal.parts  # the other tasks' parts (Ray stops the job at the first error)
    leftovers = [p for p in (tmp_path / "ray").rglob("*") if p.is_file()]
    assert leftovers == []


def test_bad_sink_arguments_fail_on_the_driver(ray_cluster: Any, tmp_path: Path) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="payload_column"):
        CacheDatasink(tmp_path, name="x", payload_column=3)  # type: ignore[arg-type]
    ds = ray.data.from_arrow(source_blocks()[:1])
    sink = CacheDatasink(tmp_path / "set", name="x", payload_column="no_such_column")
    with pytest.raises(Exception, match="no_such_column"):
        ds.write_datasink(sink)
    assert read_descriptor(tmp_path / "set") is None


def test_the_files_ray_read_are_recorded_in_the_descriptor(
    ray_cluster: Any, tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    import pyarrow.parquet as pq

    (tmp_path / "raw").mkdir()
    files = []
    for i, block in enumerate(source_blocks()):
        files.append(tmp_path / "raw" / f"{i}.parquet")
        pq.write_table(block, files[-1])
    # Ray 2.60's default Parquet reader (datasource V2) lists the files when it
    # runs and does not expose them; its V1 reader names them in the plan.
    context = ray.data.DataContext.get_current()
    context.use_datasource_v2 = False
    try:
        ds = ray.data.read_parquet(str(tmp_path / "raw"))
    finally:
        context.use_datasource_v2 = True
    committed = write_dataset(
        ds, tmp_path / "set", name="images", payload_column="image", input={"snapshot": 3}
    )
    assert committed.records == ROWS
    recorded = committed.descriptor["input"]
    assert recorded["snapshot"] == 3
    assert sorted(Path(f).name for f in recorded["files"]) == [f.name for f in files]
    assert read_descriptor(tmp_path / "set") == committed.descriptor
    dataset = runtime.open_dataset(tmp_path / "set", reader_config=READER)
    assert sorted(payloads(dataset)) == sorted(
        v for block in source_blocks() for v in block.column("image").to_pylist()
    )
