"""Datasets of many caches (issue 48): parts written by any task, one commit, one
location that every entry point opens (dataset_rt.parts, docs/distributed.md).

On a local directory here; on the real radosgw in tests/test_object_store_parts.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dataset_rt as drt
from dataset_rt.parts import DatasetWrite, Part, read_descriptor, remove_uncommitted

READER = drt.ReaderConfig(seed=0, shuffle=False)
QUIET = drt.WriterConfig(show_progress=False)


def rows(start: int, count: int) -> pa.Table:
    """Rows ``start..start+count``: a payload that names its row, a label, a score."""
    ids = range(start, start + count)
    return pa.table(
        {
            "payload": pa.array([f"row-{i}".encode() * (1 + i % 3) for i in ids], pa.binary()),
            "label": pa.array([i % 5 for i in ids], pa.int64()),
            "score": pa.array([i / 7 for i in ids], pa.float64()),
        }
    )


def write_parts(write: DatasetWrite, runtime: drt.DatasetRuntime, sizes: list[int]) -> list[Part]:
    parts, start = [], 0
    for index, size in enumerate(sizes):
        parts.append(
            write.write_part(
                f"part-{index:05d}",
                rows(start, size),
                payload_column="payload",
                runtime=runtime,
                writer_config=QUIET,
            )
        )
        start += size
    return parts


def payloads(dataset: drt.CachedDataset) -> list[bytes]:
    return [sample.data for sample in dataset]


def test_parts_written_apart_and_committed_open_as_one_dataset(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    location = tmp_path / "train"
    write = DatasetWrite.begin(location)
    # Written out of order, as tasks finish: the dataset's order is the parts' names.
    parts = write_parts(write, runtime, [300, 200, 100])
    committed = write.commit(list(reversed(parts)), name="train", input={"files": ["a.parquet"]})
    assert (committed.caches, committed.records, committed.created) == (3, 600, True)
    descriptor = read_descriptor(location)
    assert descriptor is not None
    assert descriptor["name"] == "train"
    assert [c["location"].rsplit("/", 1)[1] for c in descriptor["caches"]] == [
        "part-00000",
        "part-00001",
        "part-00002",
    ]
    assert descriptor["input"] == {"files": ["a.parquet"]}

    dataset = runtime.open_dataset(location, reader_config=READER)
    assert dataset.num_rows == 600
    assert dataset._engine.cache_ids == [p.cache_id for p in parts]
    assert payloads(dataset) == rows(0, 600).column("payload").to_pylist()
    # Its caches are the parts themselves, read in place.
    assert [p.name for p in dataset.cache_paths] == [p.name for p in parts]
    assert all(p.parent.parent.parent == location for p in dataset.cache_paths)


def test_a_retried_part_is_the_same_cache_and_other_rows_are_refused(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    write = DatasetWrite.begin(tmp_path / "set")
    (first,) = write_parts(write, runtime, [50])
    (again,) = write_parts(write, runtime, [50])
    assert again == first
    part_dir = tmp_path / "set" / "parts" / write.write_id
    assert sorted(p.name for p in part_dir.iterdir()) == ["part-00000"]
    with pytest.raises(drt.InvalidArgumentError, match="already exists and holds other records"):
        write.write_part(
            "part-00000",
            rows(1, 50),
            payload_column="payload",
            runtime=runtime,
            writer_config=QUIET,
        )
    assert write.commit([first], name="set").records == 50


def test_the_same_rows_in_two_writes_have_the_same_ids(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    """A part's id depends only on its rows and its name (not on the write)."""
    one = write_parts(DatasetWrite.begin(tmp_path / "a"), runtime, [40, 60])
    two = write_parts(DatasetWrite.begin(tmp_path / "b"), runtime, [40, 60])
    assert one == two
    assert one[0].cache_id != one[1].cache_id


def test_a_commit_is_all_or_nothing(tmp_path: Path, runtime: drt.DatasetRuntime) -> None:
    location = tmp_path / "set"
    write = DatasetWrite.begin(location)
    parts = write_parts(write, runtime, [10, 10])
    ghost = Part("part-00009", 1, 10)
    with pytest.raises(drt.NotFoundError, match=r"part-00009.*nothing was published"):
        write.commit([*parts, ghost], name="set")
    assert read_descriptor(location) is None
    with pytest.raises(drt.InvalidArgumentError, match="at least one part"):
        write.commit([], name="set")
    with pytest.raises(drt.InvalidArgumentError, match="given twice"):
        write.commit([parts[0], parts[0]], name="set")
    with pytest.raises(drt.InvalidArgumentError, match="dataset name"):
        write.commit(parts, name="../up")
    assert read_descriptor(location) is None

    assert write.commit(parts, name="set").created
    # A retried commit is the same commit; another one never replaces it.
    assert not write.commit(parts, name="set").created
    with pytest.raises(drt.InvalidArgumentError, match="never replaced"):
        write.commit(parts[:1], name="set")
    with pytest.raises(drt.InvalidArgumentError, match="already holds a committed dataset"):
        DatasetWrite.begin(location)
    assert runtime.open_dataset(location, reader_config=READER).num_rows == 20


def test_uncommitted_parts_are_removed_by_the_command(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    location = tmp_path / "set"
    crashed = DatasetWrite.begin(location)
    write_parts(crashed, runtime, [10, 10])  # never committed
    write = DatasetWrite.begin(location)
    parts = write_parts(write, runtime, [10])
    write.commit(parts, name="set")

    command = [sys.executable, "-m", "dataset_rt", "remove-uncommitted", str(location)]
    kept = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "removed 0 uncommitted parts" in kept.stdout
    assert kept.stdout.count("kept (written less than 3600 s ago)") == 2
    dry = subprocess.run(
        [*command, "--min-age-seconds", "0", "--dry-run"], capture_output=True, text=True
    )
    assert dry.returncode == 0
    assert dry.stdout.count("would remove: parts/") == 2
    assert (location / "parts" / crashed.write_id).is_dir()
    done = subprocess.run([*command, "--min-age-seconds", "0"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "removed 2 uncommitted parts" in done.stdout
    assert not any((location / "parts" / crashed.write_id).iterdir())
    assert runtime.open_dataset(location, reader_config=READER).num_rows == 10
    assert remove_uncommitted(location, min_age_seconds=0).parts == []

    bad = subprocess.run([*command, "--min-age-seconds", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "expected a number of seconds >= 0" in bad.stderr


def test_a_damaged_descriptor_or_a_replaced_part_is_refused(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    location = tmp_path / "set"
    write = DatasetWrite.begin(location)
    parts = write_parts(write, runtime, [10, 10])
    write.commit(parts, name="set")
    descriptor_path = location / "descriptor.json"
    good = descriptor_path.read_bytes()

    descriptor_path.write_bytes(good[: len(good) // 2])
    with pytest.raises(drt.CorruptCacheError, match="not a dataset descriptor"):
        runtime.open_dataset(location, reader_config=READER)
    hostile = json.loads(good)
    hostile["caches"][0]["location"] = "../../etc"
    descriptor_path.write_text(json.dumps(hostile))
    with pytest.raises(drt.CorruptCacheError, match=r"starts with '\.'"):
        runtime.open_dataset(location, reader_config=READER)
    descriptor_path.write_bytes(good)

    # A part replaced by another cache of the same name (other rows).
    part_dir = location / "parts" / write.write_id
    shutil.rmtree(part_dir / "part-00001")
    other = DatasetWrite(str(location), write.write_id)
    other.write_part(
        "part-00001", rows(999, 10), payload_column="payload", runtime=runtime, writer_config=QUIET
    )
    with pytest.raises(drt.CorruptCacheError, match="replaced after the dataset was committed"):
        runtime.open_dataset(location, reader_config=READER)


def test_bad_arguments_say_what_is_valid(tmp_path: Path, runtime: drt.DatasetRuntime) -> None:
    with pytest.raises(drt.InvalidArgumentError, match="32 lowercase hex"):
        DatasetWrite(str(tmp_path), "not-an-id").write_part(
            "p", rows(0, 1), payload_column="payload", runtime=runtime
        )
    write = DatasetWrite.begin(tmp_path / "set")
    with pytest.raises(drt.InvalidArgumentError, match="source name"):
        write.write_part("../p", rows(0, 1), payload_column="payload", runtime=runtime)
    with pytest.raises(drt.InvalidArgumentError, match="a location is"):
        DatasetWrite.begin(3)  # type: ignore[arg-type]
    with pytest.raises(drt.SourceError, match="no samples"):
        write.write_part("p", rows(0, 0), payload_column="payload", runtime=runtime)
    with pytest.raises(drt.NotFoundError):
        runtime.open_dataset(tmp_path / "nothing-here", reader_config=READER)


def test_the_server_serves_a_dataset_by_its_location(
    tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    from dataset_rt.service import DatasetService, StreamRequest

    location = tmp_path / "set"
    write = DatasetWrite.begin(location)
    write.commit(write_parts(write, runtime, [30, 20]), name="set")
    service = DatasetService(runtime.native, "set", [str(location)], str(tmp_path / "state"))
    assert len(service.cache_ids) == 2
    request = service.pin(StreamRequest(dataset="set", seed=0, epoch=0, shuffle=False))
    table = pa.RecordBatchReader.from_stream(service.stream(request.for_rank(0))).read_all()
    assert table.column("payload").to_pylist() == rows(0, 50).column("payload").to_pylist()
    assert os.path.isdir(location / "parts")


# -- on object storage: the real radosgw of the session (tests/ceph_s3.py) ---------


@pytest.fixture
def s3_location(ceph: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket prefix, with our engine's environment pointing at the store."""
    for key, value in ceph.environment().items():
        monkeypatch.setenv(key, value)
    name = f"drt-{uuid.uuid4().hex[:12]}"
    ceph.create_bucket(name)
    return f"s3://{name}/datasets/train"


def test_a_dataset_on_object_storage_is_written_committed_and_served(
    s3_location: str, tmp_path: Path, runtime: drt.DatasetRuntime
) -> None:
    from dataset_rt.service import DatasetService, StreamRequest

    write = DatasetWrite.begin(s3_location)
    scratch = tmp_path / "scratch"
    parts = [
        write.write_part(
            f"part-{i:05d}",
            rows(i * 40, 40),
            payload_column="payload",
            runtime=runtime,
            writer_config=QUIET,
            scratch_dir=scratch,
        )
        for i in range(3)
    ]
    assert not any(scratch.iterdir())  # each part was uploaded, then removed here
    # A retried task uploads nothing new and is the same part.
    again = write.write_part(
        "part-00001",
        rows(40, 40),
        payload_column="payload",
        runtime=runtime,
        writer_config=QUIET,
        scratch_dir=scratch,
    )
    assert again == parts[1]
    with pytest.raises(drt.NotFoundError, match="part-00007"):
        write.commit([*parts, Part("part-00007", 7, 1)], name="train")
    assert read_descriptor(s3_location) is None
    assert write.commit(parts, name="train").created

    expected = rows(0, 120).column("payload").to_pylist()
    dataset = runtime.open_dataset(s3_location, reader_config=READER, mirror_dir=tmp_path / "m")
    assert payloads(dataset) == expected
    with pytest.raises(drt.InvalidArgumentError, match="give a mirror directory"):
        runtime.open_dataset(s3_location, reader_config=READER)

    service = DatasetService(
        runtime.native,
        "train",
        [s3_location],
        str(tmp_path / "state"),
        mirror_dir=str(tmp_path / "server-mirror"),
    )
    request = service.pin(StreamRequest(dataset="train", seed=0, epoch=0, shuffle=False))
    table = pa.RecordBatchReader.from_stream(service.stream(request.for_rank(0))).read_all()
    assert table.column("payload").to_pylist() == expected

    # An abandoned write on the bucket is removed; the committed one stays.
    crashed = DatasetWrite(s3_location, uuid.uuid4().hex)
    crashed.write_part(
        "part-00000",
        rows(0, 5),
        payload_column="payload",
        runtime=runtime,
        writer_config=QUIET,
        scratch_dir=scratch,
    )
    removal = remove_uncommitted(s3_location, min_age_seconds=0)
    assert removal.parts == [f"parts/{crashed.write_id}/part-00000"]
    assert removal.bytes > 0
    assert remove_uncommitted(s3_location, min_age_seconds=0).parts == []
    fresh = runtime.open_dataset(s3_location, reader_config=READER, mirror_dir=tmp_path / "m2")
    assert fresh.num_rows == 120
