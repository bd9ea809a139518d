"""One rank's stream read as K interleaved sub-streams, merged back in order.

A single gRPC stream is one TCP flow, and one flow has a ceiling (AWS caps a
flow at 5 Gbps; on loopback one core encodes it). The partition rule
(docs/flight-protocol.md, "Partitions") gives the way to split a rank without
the server's help: at world size ``w``, rank ``r`` takes the blocks ``r, r + w,
r + 2w, ...`` of the range; at world size ``w * K``, rank ``r + w * k`` takes
blocks ``r + w * (k + K * j)``, which are exactly rank ``r``'s blocks number
``k, k + K, k + 2K, ...``. So sub-stream ``k`` is an ordinary ticket (rank ``r
+ w * k`` of ``w * K``), served by any replica and resumed there after a failure
as any stream is, and rank ``r``'s block ``m`` is sub-stream ``m mod K``'s block
``m div K``. The sub-streams cover the rank's first ``K * q`` blocks (``q`` the
blocks per rank at ``w * K``); the rank's last blocks, fewer than ``K``, are
read from the rank's own ticket resumed after them. The merged rows are the
single stream's, in its order; only the batch boundaries differ.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from dataset_rt.service import StreamRequest

#: Batches each sub-stream may hold ahead of the merge.
DEPTH = 4
#: Bytes of one merged piece, over the sub-streams: interleaving copies them.
PIECE_BYTES = 4 << 20
#: Blocks of at least this many bytes are passed on as slices, not copied.
SLICE_BYTES = 64 << 10
#: The most sub-streams one rank may open.
MAX_STREAMS = 64

OpenStream = Callable[[StreamRequest, Sequence[str]], Iterator[pa.RecordBatch]]


def interleaved(
    open_stream: OpenStream, ticket: StreamRequest, streams: int, locations: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """``ticket``'s rows (a rank's stream, from its offset) read as ``streams``
    sub-streams, each started on the next of ``locations``."""
    if streams == 1:
        yield from open_stream(ticket, locations)
        return
    width, rank, block = ticket.world_size, ticket.rank, ticket.block
    wide = ticket.replace(world_size=width * streams, rank=rank, offset=0)
    split = streams * wide.samples_per_rank()  # the rank's rows the sub-streams cover
    if ticket.offset >= split:
        yield from open_stream(ticket, locations)
        return
    first_block, into = divmod(ticket.offset, block)
    pumps = []
    try:
        for k in range(streams):
            # Sub-stream k's blocks before the first one read, and where it starts.
            before = -(-(first_block - k) // streams) if first_block > k else 0
            start = before * block + (into if first_block % streams == k else 0)
            sub = wide.for_rank(rank + width * k).resumed(start)
            rotated = [*locations[k % len(locations) :], *locations[: k % len(locations)]]
            pumps.append(_Pump(open_stream(sub, rotated), f"sub-stream {k} of {streams}"))
        yield from _merge(pumps, first_block, into, block, split // block)
    finally:
        for pump in pumps:
            pump.close()
    if split < ticket.samples_per_rank():
        yield from open_stream(ticket.resumed(split), locations)


def _merge(
    pumps: list[_Pump], first_block: int, into: int, block: int, blocks: int
) -> Iterator[pa.RecordBatch]:
    """Rank blocks ``first_block`` (from row ``into`` of it) up to ``blocks``,
    block ``m`` taken from ``pumps[m % K]``."""
    count = len(pumps)
    m = first_block
    # Block by block up to the first whole round (a resumed stream).
    while m < blocks and ((m == first_block and into > 0) or m % count != 0):
        yield from pumps[m % count].take(block - (into if m == first_block else 0))
        m += 1
    if m >= blocks:
        return
    block_bytes = block * pumps[m % count].row_bytes()
    if block_bytes >= SLICE_BYTES:
        # Large blocks: handed on as the slices they arrived in, no copy.
        for rank_block in range(m, blocks):
            yield from pumps[rank_block % count].take(block)
        return
    rounds_per_piece = max(1, PIECE_BYTES // (block_bytes * count))
    while m < blocks:  # whole rounds: `blocks` is a multiple of K
        rounds = min(rounds_per_piece, (blocks - m) // count)
        rows = rounds * block
        pieces = [pa.Table.from_batches(pump.take(rows)) for pump in pumps]
        # Row t of block u of sub-stream k goes to place (u * K + k) * block + t.
        order = (
            np.arange(rounds)[:, None, None] * block
            + np.arange(count)[None, :, None] * rows
            + np.arange(block)[None, None, :]
        ).ravel()
        yield from pa.concat_tables(pieces).take(order).combine_chunks().to_batches()
        m += rounds * count


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Pump:
    """A sub-stream read on a thread of its own, a few batches ahead."""

    def __init__(self, batches: Iterator[pa.RecordBatch], name: str) -> None:
        self._batches = batches
        self._name = name
        self._queue: queue.Queue[pa.RecordBatch | _End | _Failed] = queue.Queue(DEPTH)
        self._stop = threading.Event()
        self._held: list[pa.RecordBatch] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._batches:
                if not self._put(batch):
                    return
            self._put(_End())
        except BaseException as error:  # handed to the reader, raised there
            self._put(_Failed(error))
        finally:
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()

    def _put(self, item: pa.RecordBatch | _End | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def row_bytes(self) -> int:
        """Bytes per row of the next batch (at least 1), waiting for it."""
        if not self._held:
            self._held.append(self._next())
        size: int = self._held[0].nbytes
        rows: int = self._held[0].num_rows
        return max(1, size // max(1, rows))

    def _next(self) -> pa.RecordBatch:
        item = self._queue.get()
        if isinstance(item, _Failed):
            raise item.error
        if isinstance(item, _End):
            raise RuntimeError(
                f"{self._name} ended before the rows the partition rule gives it; the "
                "server's stream is shorter than its ticket"
            )
        return item

    def take(self, rows: int) -> list[pa.RecordBatch]:
        """The next ``rows`` rows, as slices of the batches received."""
        out: list[pa.RecordBatch] = []
        while rows > 0:
            if not self._held:
                self._held.append(self._next())
            batch = self._held.pop(0)
            if batch.num_rows > rows:
                self._held.insert(0, batch.slice(rows))
                batch = batch.slice(0, rows)
            out.append(batch)
            rows -= batch.num_rows
        return out

    def close(self) -> None:
        self._stop.set()
