"""The partition keywords, deprecated: ``partition=`` is the public signature.

`CachedDataset.epoch`, `CachedDataset.iter_samples`, `DatasetClient.epoch` and
`DatasetClient.epoch_info` take one `dataset_rt.Partition`. For one release they
still take its keys as keyword arguments (``rank=``, ``world_size=``, ...,
built into one in `dataset_rt.partition.as_partition`): each such call warns
once, naming the method, the keys and the replacement, and reads what
``partition=`` reads. A keyword a method does not take is Python's own
`TypeError`. (The keys themselves: tests/test_sampling.py.)
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import ListSource, make_records

import dataset_rt as drt
from dataset_rt.partition import PARTITION_KEYS
from flight_client import DatasetClient, EpochSample
from flight_server import Catalog, DatasetFlightServer, DatasetSpec

ROWS = 40
SEED = 5
KEYS = {"rank": 1, "world_size": 3, "start": 4, "stop": ROWS - 6, "block": 3, "offset": 2}
# epoch_info takes a partition's world size, range and block (the tickets hold the ranks).
INFO_KEYS = {"world_size": 3, "start": 4, "stop": ROWS - 6, "block": 3}
MIGRATING = Path(__file__).parents[1] / "docs" / "migrating.md"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    source = ListSource("toy", make_records(ROWS))
    config = drt.WriterConfig(show_progress=False)
    (result,) = runtime.write_cache(source, tmp_path_factory.mktemp("caches"), writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime, cache: Path
) -> Iterator[DatasetClient]:
    state = tmp_path_factory.mktemp("state")
    catalog = Catalog([DatasetSpec("toy", (cache,))], state, runtime)
    with (
        DatasetFlightServer(catalog, "grpc://127.0.0.1:0") as server,
        DatasetClient(server.location) as friendly,
    ):
        yield friendly


def open_dataset(runtime: drt.DatasetRuntime, cache: Path) -> drt.CachedDataset:
    return runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=SEED))


def deprecation(method: str, keys: dict[str, Any]) -> str:
    named = ", ".join(f"{name}=..." for name in keys)
    return (
        f"{method}({named}) is deprecated and will be removed in the next release; "
        f"pass partition=dataset_rt.Partition({named})"
    )


def ids(samples: Iterator[drt.CachedSample]) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in samples]


def triples(samples: Iterator[EpochSample]) -> list[tuple[int, int, int]]:
    return [(s.position, s.cache_id, s.sample_id) for s in samples]


def tickets(info: Any) -> list[bytes]:
    return [endpoint.ticket.ticket for endpoint in info.endpoints]


# Each method: its keys, and a call of it given either the keys or partition=.
Call = Callable[[drt.CachedDataset, DatasetClient, dict[str, Any]], Any]
METHODS: dict[str, tuple[dict[str, int], Call]] = {
    "CachedDataset.epoch": (KEYS, lambda dataset, _, how: dataset.epoch(1, **how).read_all()),
    "CachedDataset.iter_samples": (
        KEYS,
        lambda dataset, _, how: ids(dataset.iter_samples(**how)),
    ),
    "DatasetClient.epoch": (
        KEYS,
        lambda _, client, how: triples(client.epoch("toy", SEED, 1, **how)),
    ),
    "DatasetClient.epoch_info": (
        INFO_KEYS,
        lambda _, client, how: tickets(client.epoch_info("toy", SEED, 1, **how)),
    ),
}


@pytest.mark.parametrize("method", METHODS)
def test_the_keywords_warn_once_and_read_what_partition_reads(
    runtime: drt.DatasetRuntime, cache: Path, client: DatasetClient, method: str
) -> None:
    keys, call = METHODS[method]
    # Two datasets at the same place of the same stream (iter_samples moves it).
    by_keys, by_partition = open_dataset(runtime, cache), open_dataset(runtime, cache)
    message = deprecation(method, keys)
    with pytest.warns(DeprecationWarning, match=f"^{re.escape(message)}$") as caught:
        old = call(by_keys, client, keys)
    assert [str(warning.message) for warning in caught] == [message]  # once
    # The warning points at the caller's line (here, the lambda in METHODS).
    assert caught[0].filename == __file__
    new = call(by_partition, client, {"partition": drt.Partition(**keys)})
    assert old == new
    assert len(old) > 0


def test_the_message_names_the_keys_given_in_the_partition_order(
    runtime: drt.DatasetRuntime, cache: Path
) -> None:
    dataset = open_dataset(runtime, cache)
    message = (
        "CachedDataset.epoch(world_size=..., offset=...) is deprecated and will be removed "
        "in the next release; pass partition=dataset_rt.Partition(world_size=..., offset=...)"
    )
    with pytest.warns(DeprecationWarning, match=f"^{re.escape(message)}$"):
        dataset.epoch(0, offset=1, world_size=2).read_all()
    # A key given as None is unset, as before (and still deprecated).
    with pytest.warns(DeprecationWarning, match=re.escape("CachedDataset.epoch(rank=...)")):
        unset = dataset.epoch(0, rank=None).read_all()
    assert unset.equals(dataset.epoch(0).read_all())


@pytest.mark.parametrize("method", METHODS)
def test_partition_alone_does_not_warn(
    runtime: drt.DatasetRuntime, cache: Path, client: DatasetClient, method: str
) -> None:
    keys, call = METHODS[method]
    dataset = open_dataset(runtime, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(dataset, client, {"partition": drt.Partition(**keys)})
        call(dataset, client, {})  # the whole epoch


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("keyword", ["x", "ranks", "columns_"])
def test_an_unknown_keyword_is_a_type_error(
    runtime: drt.DatasetRuntime, cache: Path, client: DatasetClient, method: str, keyword: str
) -> None:
    _, call = METHODS[method]
    dataset = open_dataset(runtime, cache)
    expected = f"{method}() got an unexpected keyword argument '{keyword}'"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        call(dataset, client, {keyword: 1})
    # Before any warning, also when deprecated keys come with it.
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        call(dataset, client, {"world_size": 2, keyword: 1})


def test_the_type_error_is_worded_as_pythons_own(runtime: drt.DatasetRuntime, cache: Path) -> None:
    with pytest.raises(TypeError) as python:
        open_dataset(runtime, cache).stream(x=1)  # type: ignore[call-arg]
    assert str(python.value) == "CachedDataset.stream() got an unexpected keyword argument 'x'"


@pytest.mark.parametrize("keyword", ["rank", "offset"])
def test_epoch_info_does_not_take_a_rank_or_an_offset(client: DatasetClient, keyword: str) -> None:
    expected = f"DatasetClient.epoch_info() got an unexpected keyword argument '{keyword}'"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        client.epoch_info("toy", SEED, 0, world_size=2, **{keyword: 1})


def test_a_partition_and_keys_together_are_refused(
    runtime: drt.DatasetRuntime, cache: Path, client: DatasetClient
) -> None:
    """Refused as before, and without the deprecation warning (nothing is read)."""
    dataset = open_dataset(runtime, cache)
    half = drt.Partition(rank=1, world_size=2)
    for call in (
        lambda: dataset.epoch(0, half, rank=0),
        lambda: dataset.iter_samples(half, offset=3),
        lambda: client.epoch("toy", SEED, 0, half, world_size=2),
        lambda: client.epoch_info("toy", SEED, 0, half, block=2),
    ):
        with pytest.raises(drt.InvalidArgumentError, match="not both"):
            call()


@pytest.mark.parametrize(
    "method",
    [
        drt.CachedDataset.epoch,
        drt.CachedDataset.iter_samples,
        DatasetClient.epoch,
        DatasetClient.epoch_info,
    ],
)
def test_the_signatures_show_only_partition(method: Callable[..., Any]) -> None:
    parameters = inspect.signature(method).parameters
    assert "partition" in parameters
    assert not set(PARTITION_KEYS) & set(parameters)
    assert parameters["partition_keys"].kind is inspect.Parameter.VAR_KEYWORD


def test_the_migration_note_runs(runtime: drt.DatasetRuntime, cache: Path) -> None:
    """docs/migrating.md's example: the deprecated line warns, its replacement does not."""
    section = MIGRATING.read_text().split("## Deprecated in this release", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert example is not None
    dataset = _LongEpochs(open_dataset(runtime, cache))
    message = deprecation("CachedDataset.epoch", {"rank": 1, "world_size": 4, "block": 32})
    with pytest.warns(DeprecationWarning, match=re.escape(message)) as caught:
        exec(example.group(1), {"dataset": dataset})
    assert [str(warning.message) for warning in caught] == [message]
    old, new = dataset.read
    assert old.equals(new)


class _LongEpochs:
    """A dataset whose epochs hold the example's blocks of 32, keeping what they read."""

    def __init__(self, dataset: drt.CachedDataset) -> None:
        dataset.set_epoch_len(4 * 32 * 2)
        self.dataset = dataset
        self.read: list[pa.Table] = []

    def epoch(self, *args: Any, **kwargs: Any) -> None:
        self.read.append(self.dataset.epoch(*args, **kwargs).read_all())
