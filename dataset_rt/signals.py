"""Input stalls, the figure trainers watch: how long a rank waits for its data.

`InputStats` keeps the time each batch took to arrive (the time the training
loop spent waiting in ``next()``, not its own compute) over a bounded window,
and the stream restarts (failovers to another replica) of the readers that fed
it. `DatasetLoader.input_stats()` reads it; ``log_input_every`` logs it.
"""

from __future__ import annotations

import logging
import statistics
import sys
import threading
from collections import deque
from typing import Any

log = logging.getLogger("dataset_rt.input")

#: Batches whose waits are kept for the percentiles (the most recent ones).
WINDOW = 10_000


def show_input_logs() -> None:
    """Make the input logs a user asked for (``log_input_every``) visible where
    logging is not configured: this logger at INFO, and a stderr handler if no
    handler would take its records (Python drops INFO records then)."""
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)


class InputStats:
    """Waits per batch (a window of the last `WINDOW`) and stream restarts."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._waits: deque[float] = deque(maxlen=WINDOW)
        self._batches = 0
        self._waited = 0.0
        self._restarts = 0
        self._trainer_batches = 0
        # Per reader (a DataLoader worker, or -1 for this process): the restarts
        # it has reported so far (readers report running totals).
        self._seen: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a copy of a loader goes to a worker): without the lock."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def batches(self) -> int:
        return self._batches

    def waited(self, seconds: float) -> None:
        with self._lock:
            self._waits.append(seconds)
            self._batches += 1
            self._waited += seconds

    def reader_restarts(self, reader: int, total: int) -> None:
        """A reader's running total of stream restarts; ``reader`` -1 is this
        process, which read the batch itself."""
        with self._lock:
            if reader == -1:
                self._trainer_batches += 1
            before = self._seen.get(reader, 0)
            if total > before:
                self._restarts += total - before
            self._seen[reader] = total

    def new_readers(self) -> None:
        """The readers were replaced (new workers count from 0 again)."""
        with self._lock:
            self._seen.clear()

    def snapshot(self) -> dict[str, Any]:
        """``rank``, ``batches``, ``wait_p50_ms``, ``wait_p99_ms``, ``wait_max_ms``
        (over the last `WINDOW` batches), ``wait_total_s``, ``stream_restarts``
        and ``trainer_batches`` (read by this process itself: every batch
        without workers; with them, those read while the workers started)."""
        with self._lock:
            waits = sorted(self._waits)
            batches, waited, restarts = self._batches, self._waited, self._restarts
            trainer_batches = self._trainer_batches

        def percentile(q: int) -> float | None:
            if not waits:
                return None
            if len(waits) == 1:
                return round(waits[0] * 1e3, 3)
            return round(statistics.quantiles(waits, n=100, method="inclusive")[q - 1] * 1e3, 3)

        return {
            "rank": self.rank,
            "batches": batches,
            "wait_p50_ms": percentile(50),
            "wait_p99_ms": percentile(99),
            "wait_max_ms": round(waits[-1] * 1e3, 3) if waits else None,
            "wait_total_s": round(waited, 6),
            "stream_restarts": restarts,
            "trainer_batches": trainer_batches,
        }

    def log(self) -> None:
        stats = self.snapshot()
        log.info(
            "rank %d input: %d batches, wait p50 %s ms p99 %s ms (total %.3f s), %d restarts",
            stats["rank"],
            stats["batches"],
            stats["wait_p50_ms"],
            stats["wait_p99_ms"],
            stats["wait_total_s"],
            stats["stream_restarts"],
            extra={"input": stats},
        )
