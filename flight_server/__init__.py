"""An Arrow Flight service over DatasetRT datasets.

Streams deterministic epoch partitions to any Flight client and accepts edited
metadata tables by ``do_put``. See ``docs/flight-protocol.md``.
"""

from flight_server.catalog import Catalog, DatasetSpec
from flight_server.server import DatasetFlightServer

__all__ = ["Catalog", "DatasetFlightServer", "DatasetSpec"]
