"""An Arrow Flight service over DatasetRT datasets.

Streams deterministic epoch partitions to any Flight client and accepts edited
metadata tables by ``do_put``. See ``docs/flight-protocol.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flight_server.catalog import Catalog, DatasetSpec
    from flight_server.server import DatasetFlightServer

__all__ = ["Catalog", "DatasetFlightServer", "DatasetSpec"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that `python -m flight_server` can set up the
    # process (flight_server/memory.py) before pyarrow and the engine start
    # threads.
    if name in ("Catalog", "DatasetSpec"):
        from flight_server import catalog

        return getattr(catalog, name)
    if name == "DatasetFlightServer":
        from flight_server.server import DatasetFlightServer

        return DatasetFlightServer
    raise AttributeError(f"module 'flight_server' has no attribute {name!r}")
