"""A friendly Python client for the DatasetRT Flight service."""

from flight_client.client import DatasetClient, EpochSample, EveryLocationFailedError

__all__ = ["DatasetClient", "EpochSample", "EveryLocationFailedError"]
