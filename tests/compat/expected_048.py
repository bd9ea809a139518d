"""What we expect of dataset-rt 0.4.8's own test suites run against our `dataset_rt`.

Every 0.4.8 test we run passes, except the deliberate differences listed here.
Each entry says why we differ and gives a phrase that must appear in the test's
failure, so that a difference is checked to still fail *for that reason*
(docs/migrating.md explains each one to users).
"""

from __future__ import annotations

from typing import NamedTuple


class Difference(NamedTuple):
    """A 0.4.8 test that fails on our library on purpose."""

    reason: str
    #: A phrase of the failure (junit message) that shows the stated reason.
    marker: str


# The 0.4.8 suites that use public names only, and how many tests each has
# (a new or removed test changes the count and fails the harness: look at it).
PUBLIC_SUITES: dict[str, int] = {
    "tests/test_dataset_rt.py": 70,
    "tests/test_compatibility.py": 23,
    "tests/test_precise_types.py": 23,
}

_CACHE_ID = (
    "cache_id derives from the source name AND the cache's content (0.4.8: the name "
    "only), so another content can never reuse an id; the test hard-codes 0.4.8's ids"
)
_FORMAT = (
    "the on-disk format is ours (a checksummed manifest, a fixed-width index, raw "
    "shards: docs/storage-format.md); the test reads 0.4.8's manifest keys or record layout"
)

# test id (file::name[param]) -> why it differs.
EXPECTED_DIFFERENCES: dict[str, Difference] = {
    "tests/test_dataset_rt.py::test_write_and_read_cache": Difference(
        _CACHE_ID, "671225450407077731"
    ),
    "tests/test_dataset_rt.py::test_dataset_loads_multiple_caches_in_constructor_order": (
        Difference(_CACHE_ID, "6424818148262835032")
    ),
    "tests/test_dataset_rt.py::test_get_item_reads_filtered_sample_without_advancing_cursor": (
        Difference(_CACHE_ID, "cache_id 671225450407077731 is out of range")
    ),
    "tests/test_dataset_rt.py::test_get_item_does_not_advance_shuffled_draws": Difference(
        _CACHE_ID, "cache_id 2462074631277705190 is out of range"
    ),
    "tests/test_dataset_rt.py::test_get_item_reads_sparse_samples_across_many_rows_and_caches": (
        Difference(
            "a metadata key may not be named 'sample_id' (nor cache_id, weight, position, "
            "payload): it would be a second 'sample_id' column of the population table. 0.4.8 "
            "wrote such a cache but its get_metadata() then failed (Polars: duplicate column); "
            "we refuse the write and say to rename the key. The test also hard-codes 0.4.8's ids",
            "metadata key 'sample_id' is reserved",
        )
    ),
    "tests/test_dataset_rt.py::test_writer_manifest_records_shard_compression": Difference(
        _FORMAT, "KeyError: 'shards'"
    ),
    "tests/test_dataset_rt.py::test_writer_lz4_compresses_payloads_and_reads_original_bytes": (
        Difference(_FORMAT, "KeyError: 'shards'")
    ),
    "tests/test_dataset_rt.py::test_shard_records_embed_metadata_for_debugging": Difference(
        _FORMAT, "KeyError: 'shards'"
    ),
    "tests/test_dataset_rt.py::test_writer_config_validation_happens_in_rust": Difference(
        "we support zstd (0.4.8: none and lz4), and write_cache takes a WriterConfig, not any "
        "object with its attributes; the test's last step passes a look-alike object with "
        "algo='zstd' and expects 'unsupported shard compression'",
        "writer_config must be a WriterConfig",
    ),
}

# 0.4.8 suites not run: every test in them uses 0.4.8's private modules (the
# module imports them at the top, so none of its tests can run alone). The
# harness checks that each still imports the module named here.
PRIVATE_SUITES: dict[str, str] = {
    "tests/test_reader_contracts.py": "from dataset_rt.integrations.loading import",
    "tests/integrations/test_loader_correctness.py": "from dataset_rt.integrations import loading",
}
