"""Load: many clients against one server for a while; throughput, errors, memory.

    uv run python benchmarks/bench_load.py                    # 16 clients, 60 s
    uv run python benchmarks/bench_load.py --clients 4 --seconds 10

One ``flight_server`` process serves a cache of ``--records`` records of 4 KiB.
Each client process loops until the time is up over a mix of calls a training
fleet makes: a rank's partition of an epoch (a fresh seed and epoch each time,
one stream in four ids-only), ``get_flight_info``, ``get_metadata`` and
``stats``. Printed: calls and errors by kind (errors by status), rows and bytes
per second, and the server's RSS at start, peak and end (sampled every 0.2 s).
Every loop is bounded by the deadline; clients talk to loopback only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flight_common import ServerProcess, human_bytes, human_count, render, write_cache

DATASET = "load"


def client(index: int, location: str, seconds: float, results: Any) -> None:
    """One client's loop; puts (calls, errors, rows, bytes) on ``results``."""
    import pyarrow.flight as flight

    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    rows = sent = 0
    chooser = random.Random(index)
    deadline = time.monotonic() + seconds
    connection = flight.connect(location)
    while time.monotonic() < deadline:
        kind = chooser.choices(["stream", "info", "metadata", "stats"], [6, 2, 1, 1])[0]
        calls[kind] += 1
        try:
            if kind == "stream":
                world = chooser.choice([1, 2, 4, 8])
                ticket = {
                    "dataset": DATASET,
                    "seed": chooser.randrange(2**32),
                    "epoch": chooser.randrange(1000),
                    "world_size": world,
                    "rank": chooser.randrange(world),
                    "payload": chooser.random() >= 0.25,
                }
                reader = connection.do_get(flight.Ticket(json.dumps(ticket).encode()))
                for chunk in reader:
                    rows += chunk.data.num_rows
                    sent += chunk.data.nbytes
            elif kind == "info":
                command = {"dataset": DATASET, "seed": 1, "epoch": 0, "world_size": 8}
                connection.get_flight_info(
                    flight.FlightDescriptor.for_command(json.dumps(command).encode())
                )
            elif kind == "metadata":
                ticket = {"dataset": DATASET, "metadata": True}
                connection.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()
            else:
                list(connection.do_action(flight.Action("stats", b"")))
        except Exception as error:  # counted, by class: the status the client saw
            errors[f"{kind}: {type(error).__name__}"] += 1
    connection.close()
    results.put((dict(calls), dict(errors), rows, sent))


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra flight_server argument"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        root = Path(tmp)
        cache, _ = write_cache("load", args.records, 4096, root / "caches")
        command = [sys.executable, "-m", "flight_server", "--port", "0"]
        command += ["--dataset", f"{DATASET}={cache}", "--state-dir", str(root / "state")]
        command += ["--data-dir", str(root / "data"), "--log-level", "WARNING", *args.server_arg]
        server = ServerProcess.start("load", command, root)
        try:
            location = server.wait_location()
            start_rss = peak = rss(server.proc.pid)
            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            workers = [
                context.Process(target=client, args=(i, location, args.seconds, results))
                for i in range(args.clients)
            ]
            began = time.monotonic()
            for worker in workers:
                worker.start()
            collected = []
            hard_stop = began + args.seconds + 120
            while len(collected) < len(workers) and time.monotonic() < hard_stop:
                peak = max(peak, rss(server.proc.pid))
                try:
                    collected.append(results.get(timeout=0.2))
                except Exception:
                    continue
            elapsed = time.monotonic() - began
            for worker in workers:
                worker.join(10)
                if worker.is_alive():
                    worker.kill()
            time.sleep(1.0)
            end_rss = rss(server.proc.pid)
            alive = server.proc.poll() is None
        finally:
            server.stop()

    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    rows = sent = 0
    for c, e, r, b in collected:
        calls.update(c)
        errors.update(e)
        rows += r
        sent += b
    print(f"{args.clients} clients for {args.seconds:.0f} s ({elapsed:.1f} s with start-up)")
    print(render(["call", "count"], [[k, str(v)] for k, v in sorted(calls.items())]))
    print()
    print(f"errors: {sum(errors.values())} of {sum(calls.values())} calls")
    for kind, count in sorted(errors.items()):
        print(f"  {kind}: {count}")
    print(f"served: {human_count(rows / elapsed)} rows/s, {human_bytes(sent / elapsed)}/s")
    print(
        f"server RSS: start {human_bytes(start_rss)}, peak {human_bytes(peak)}, "
        f"end {human_bytes(end_rss)}; still running: {alive}"
    )
    if len(collected) < len(workers):
        print(f"WARNING: {len(workers) - len(collected)} clients did not report")


if __name__ == "__main__":
    main()
