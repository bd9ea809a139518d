"""The dataset-rt 0.4.8 surface this package keeps (docs/migrating.md) beyond what
0.4.8's own suites check (tests/compat): configs as pydantic models with the
engine's rules, the writer profile, exports, the facade module and the torch adapter.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import ListSource, make_records, write
from pydantic import ValidationError

import dataset_rt as drt
import dataset_rt.api as api
import dataset_rt.integrations.torch as torch_integration

QUIET = drt.WriterConfig(show_progress=False)


def test_every_public_name_is_the_facade_object_and_pickles_by_it() -> None:
    for name in api.__all__:
        assert getattr(drt, name) is getattr(api, name), name
    for cls in (drt.ReaderConfig, drt.WriterConfig, drt.CachedDataset, drt.CachedSample):
        assert cls.__module__ == "dataset_rt.api"
        assert pickle.loads(pickle.dumps(cls)) is cls
    config = drt.WriterConfig(shard_compression=drt.ShardCompression(algo="zstd", level=5))
    assert pickle.loads(pickle.dumps(config)) == config


def test_configs_load_from_mappings_and_dump_back() -> None:
    mapping: dict[str, Any] = {
        "num_processes": 2,
        "shard_compression": {"algo": "lz4", "ratio": 2.0},
        "profiler": {"enabled": True, "path": "out/profile.json"},
    }
    config = drt.WriterConfig.model_validate(mapping)
    assert config.shard_compression == drt.ShardCompression(algo="lz4", ratio=2.0)
    assert config.profiler.path == Path("out/profile.json")
    assert drt.WriterConfig.model_validate(config.model_dump()) == config
    reader = drt.ReaderConfig.model_validate({"seed": 3, "shuffle": "permutation"})
    assert reader.options.shuffle == "permutation"


@pytest.mark.parametrize(
    ("cls", "kwargs", "words"),
    [
        (drt.ShardCompression, {"ratio": 2.0}, "ratio must be 1.0 when algo is 'none'"),
        (drt.ShardCompression, {"algo": "lz4", "ratio": 0.0}, "positive and finite"),
        (drt.ShardCompression, {"algo": "lz4", "ratio": float("inf")}, "positive and finite"),
        (drt.WriterConfig, {"num_processes": -1}, "num_processes"),
        (drt.WriterConfig, {"process_timeout_seconds": 0.0}, "process_timeout_seconds"),
        (drt.WriterConfig, {"num_threads": 4}, "num_threads"),
        (drt.WriterProfilerConfig, {"enabled": 1}, "enabled"),
    ],
)
def test_engine_rules_refuse_bad_values(cls: Any, kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        cls(**kwargs)


def test_profile_counts_every_stage_of_each_written_source(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    records = make_records(5, payload_size=10)
    profile_path = tmp_path / "profile.json"
    config = drt.WriterConfig(
        show_progress=False,
        profiler=drt.WriterProfilerConfig(enabled=True, path=profile_path),
    )
    sources = [ListSource("a", records), ListSource("b", records[:2])]
    results = runtime.write_cache(sources, tmp_path / "caches", writer_config=config)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in results)
    profile = json.loads(profile_path.read_text())
    assert profile["format_version"] == 1
    assert [s["source_name"] for s in profile["sources"]] == ["a", "b"]
    stages = {s["name"]: s for s in profile["sources"][0]["stages"]}
    assert stages["python_next"]["calls"] == 6  # five records, then the end
    assert (stages["python_extract"]["calls"], stages["python_extract"]["bytes"]) == (5, 50)
    assert stages["compression"]["calls"] == stages["disk_write"]["calls"] == 5
    assert stages["finish_manifest"]["calls"] == stages["publish"]["calls"] == 1
    assert all(s["seconds"] >= 0 for s in stages.values())


def test_duplicate_source_names_are_refused_before_writing(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    sources = [ListSource("x", make_records(2)), ListSource("x", make_records(2))]
    with pytest.raises(drt.InvalidArgumentError, match="duplicate generated cache path"):
        runtime.write_cache(sources, tmp_path / "base")
    assert not (tmp_path / "base").exists()


def test_dump_config_and_from_config_rebuild_the_population(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    path = write(tmp_path, ListSource("c", make_records(6)))
    dataset = runtime.cached_dataset([path], reader_config=drt.ReaderConfig(seed=5, shuffle=False))
    table = dataset.get_metadata()
    edited = pl.concat([table.tail(2), table.head(1)]).with_columns(
        pl.lit("kept").alias("note"), pl.Series("weight", [2.0, 1.0, 3.0])
    )
    dataset.update_metadata(edited)
    dataset.set_epoch_len(5)
    export = tmp_path / "export"
    export.mkdir()
    config_path = dataset.dump_config(export)
    assert config_path == export / "dataset.json"
    with pytest.raises(drt.InvalidArgumentError, match="never overwrites"):
        dataset.dump_config(export)
    rebuilt = drt.CachedDataset.from_config(config_path)
    assert rebuilt.get_metadata().equals(dataset.get_metadata())
    assert len(rebuilt) == 5
    assert rebuilt.reader_config == dataset.reader_config
    assert [s.sample_id for s in rebuilt] == [4, 5, 0, 4, 5]


def test_update_manifests_has_nothing_to_migrate(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    path = write(tmp_path, ListSource("m", make_records(3)))
    dataset = runtime.cached_dataset([path], reader_config=drt.ReaderConfig(seed=1))
    before = (path / "manifest.json").read_bytes()
    match dataset.update_manifests(3):
        case drt.Ok(value=drt.ManifestUpdateReport(entries=(entry,))):
            assert entry.status == "unchanged"
            assert entry.cache_id == dataset.get_metadata()["cache_id"][0]
        case other:
            raise AssertionError(other)
    assert (path / "manifest.json").read_bytes() == before
    assert isinstance(dataset.update_manifests(2), drt.Err)


def test_torch_adapter_refuses_dataloader_workers(
    runtime: drt.DatasetRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, ListSource("t", make_records(3)))
    dataset = runtime.cached_dataset([path], reader_config=drt.ReaderConfig(seed=1, shuffle=False))

    class FakeTorchData:
        worker: object = None

        class IterableDataset:
            pass

        @classmethod
        def get_worker_info(cls) -> object:
            return cls.worker

    monkeypatch.setattr(torch_integration, "import_module", lambda name: FakeTorchData)
    adapter = dataset.to_torch_iterable_dataset()
    assert len(adapter) == 3
    assert [s.sample_id for s in adapter] == [0, 1, 2]
    FakeTorchData.worker = object()
    with pytest.raises(RuntimeError, match=r"num workers = 0.*DatasetLoader"):
        iter(adapter)
