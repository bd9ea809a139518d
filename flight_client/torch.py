"""PyTorch loaders over a DatasetRT Flight service.

`FlightLoader` is `dataset_rt.torch.DatasetLoader` reading from a server (or
replicas) through a `FlightSource`: batches of one rank's partition, DataLoader
workers that are safe after the trainer used a Flight client, ``state_dict()`` /
``load_state_dict()`` that resume at any world size and worker count, and
``switch_population`` for mid-run reweighting. See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataset_rt.torch import DatasetLoader
from flight_client.source import FlightSource


class FlightLoader(DatasetLoader):
    """`DatasetLoader` over ``location`` (a URI or a list of replica URIs)."""

    def __init__(
        self,
        location: str | Sequence[str],
        dataset: str,
        *,
        batch_size: int,
        seed: int,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        **options: Any,
    ) -> None:
        source = FlightSource(location, token=token, tls_root_certs=tls_root_certs)
        super().__init__(source, dataset, batch_size=batch_size, seed=seed, **options)
