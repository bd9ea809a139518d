"""`FlightSource`: a training loader's streams from a DatasetRT Flight service.

Picklable and fork-safe: it holds only where to connect, and each process (the
trainer, every DataLoader worker) opens its own `DatasetClient` on first use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from dataset_rt.service import StreamRequest
from flight_client.client import DatasetClient


class FlightSource:
    """Streams from one server or several replicas (``location``: a URI or a list).

    A rank's stream starts at replica ``rank mod n`` and fails over to the others,
    resuming at the offset reached, so a lost replica changes nothing in what a
    rank receives.
    """

    def __init__(
        self,
        location: str | Sequence[str],
        *,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        retries: int = 3,
        backoff: float = 0.1,
    ) -> None:
        self.locations = [location] if isinstance(location, str) else list(location)
        self.token = token
        self.tls_root_certs = tls_root_certs
        self.retries = retries
        self.backoff = backoff
        self._opened: tuple[int, DatasetClient] | None = None

    @property
    def client(self) -> DatasetClient:
        """This process's client (a worker process opens its own)."""
        if self._opened is None or self._opened[0] != os.getpid():
            client = DatasetClient(
                self.locations,
                token=self.token,
                tls_root_certs=self.tls_root_certs,
                retries=self.retries,
                backoff=self.backoff,
            )
            self._opened = (os.getpid(), client)
        return self._opened[1]

    @property
    def restarts(self) -> int:
        """Streams this process's client resumed on another location (failovers)."""
        if self._opened is None or self._opened[0] != os.getpid():
            return 0
        return len(self._opened[1].failovers)

    def failover_notes(self, seen: int) -> list[str]:
        """This process's stream failovers after the first ``seen``, in words."""
        if self._opened is None or self._opened[0] != os.getpid():
            return []
        return self._opened[1].failover_notes[seen:]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_opened"} | {"_opened": None}

    #: Seconds between a loader's checks that its run was not resumed elsewhere
    #: (each is a round trip to the server).
    fence_interval = 1.0

    def resolve(self, request: StreamRequest) -> StreamRequest:
        return self.client.pin(request)[0]

    def open(
        self, request: StreamRequest, *, batch_rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        # ``batch_rows`` is a hint the server does not take: it batches as configured.
        locations = self.client.locations
        first = request.rank % len(locations)
        return self.client.stream_ticket(request, locations[first:] + locations[:first])

    def population(self, dataset: str, population: str) -> pl.DataFrame:
        # No bar of its own: its callers (a loader, the audit) draw theirs.
        return self.client.get_metadata(dataset, population, show_progress=False)

    def claim_run(
        self, dataset: str, run: str, *, after: int, epoch: int, position: int, fresh: bool = False
    ) -> int:
        return self.client.claim_run(
            dataset, run, after=after, epoch=epoch, position=position, fresh=fresh
        )

    def check_run(self, dataset: str, run: str, generation: int) -> None:
        self.client.check_run(dataset, run, generation)
