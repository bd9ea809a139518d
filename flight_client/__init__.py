"""A friendly Python client for the DatasetRT Flight service."""

from flight_client.client import DatasetClient, EpochSample, EveryLocationFailedError
from flight_client.source import FlightSource

__all__ = ["DatasetClient", "EpochSample", "EveryLocationFailedError", "FlightSource"]
