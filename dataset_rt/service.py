"""The engine's serving surface, for the Flight server and client built on it.

`StreamRequest` is the one description of a stream (a ``get_flight_info``
command, or a ``do_get`` ticket when it has a rank), parsed and validated in
Rust; `parse_ticket` reads a ticket into a `StreamRequest` or a
`MetadataRequest`; `DatasetService` serves one dataset's populations and streams.
See docs/flight-protocol.md for the keys.
"""

from __future__ import annotations

from dataset_rt._native import (
    BASE_COLUMNS,
    MAX_MESSAGE_BYTES,
    ActivePopulation,
    BatchStream,
    DatasetService,
    MetadataRequest,
    RunAction,
    ServiceStats,
    StreamRequest,
    check_cache,
    check_name,
    local_path,
    parse_run_action,
    parse_ticket,
    state_local_dir,
    validate_source_name,
)

__all__ = [
    "BASE_COLUMNS",
    "MAX_MESSAGE_BYTES",
    "ActivePopulation",
    "BatchStream",
    "DatasetService",
    "MetadataRequest",
    "RunAction",
    "ServiceStats",
    "StreamRequest",
    "check_cache",
    "check_name",
    "local_path",
    "parse_run_action",
    "parse_ticket",
    "state_local_dir",
    "validate_source_name",
]
