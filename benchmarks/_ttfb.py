"""Time to first batch: ``get_flight_info`` + the first batch of ``do_get``.

What a training job waits for at the start of every rank's stream, and again at
every resume: `measure` times ``requests`` fresh requests at each of two stream
positions, alternating them, against a running server, and reports p50 and p99.
A position deep in an epoch (10^12) must cost what position 0 costs: positions
are computed, never walked to.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

#: Stream positions measured: the start, and 10^12 samples into an epoch.
POSITIONS = (0, 10**12)
#: An epoch long enough to hold the deep position.
EPOCH_LEN = 2 * 10**12


@dataclass
class TtfbResult:
    """Seconds per request at each position, in request order."""

    requests: int
    seconds: dict[int, list[float]]

    def quantiles(self, position: int) -> tuple[float, float]:
        """(p50, p99) in seconds."""
        cuts = statistics.quantiles(self.seconds[position], n=100, method="inclusive")
        return cuts[49], cuts[98]


def measure(location: str, dataset: str, *, requests: int = 200, seed: int = 0) -> TtfbResult:
    """Time ``requests`` requests per position (a fresh seed each, so nothing is
    cached between them), alternating positions; one connection, as a client has."""
    import pyarrow.flight as flight

    client = flight.connect(location)
    seconds: dict[int, list[float]] = {p: [] for p in POSITIONS}
    try:
        for i in range(requests):
            for position in POSITIONS:
                command = {
                    "dataset": dataset,
                    "seed": seed + i,
                    "epoch": 0,
                    "epoch_len": EPOCH_LEN,
                    "start": position,
                }
                began = time.perf_counter()
                info = client.get_flight_info(
                    flight.FlightDescriptor.for_command(json.dumps(command))
                )
                reader = client.do_get(info.endpoints[0].ticket)
                chunk = reader.read_chunk()
                seconds[position].append(time.perf_counter() - began)
                reader.cancel()
                if chunk.data is None or chunk.data.num_rows == 0:
                    raise RuntimeError(f"no first batch at position {position}")
    finally:
        client.close()
    return TtfbResult(requests, seconds)


def report_rows(result: TtfbResult) -> list[list[str]]:
    """Table rows: one per position."""
    rows = []
    for position in POSITIONS:
        p50, p99 = result.quantiles(position)
        rows.append(
            [
                f"get_flight_info + first batch at position {position:.0e}".replace("e+00", ""),
                f"p50 {p50 * 1000:.1f} ms",
                f"p99 {p99 * 1000:.1f} ms",
            ]
        )
    return rows
