"""``python -m flight_server``: serve datasets over Arrow Flight.

Without ``--dataset`` it serves an embedded demo dataset, built on first start
under the data directory and reused afterwards.

SIGTERM or SIGINT stops it: no new calls are accepted, those in flight get
``--shutdown-grace`` seconds to finish, the streams that remain are cancelled,
and the process exits 0.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import dataset_rt as drt
from dataset_rt.progress import status
from flight_server.auth import TokenFile
from flight_server.catalog import Catalog, DatasetSpec
from flight_server.demo import DEMO_NAME, ensure_demo_cache
from flight_server.limits import Limits
from flight_server.logs import configure as configure_logging
from flight_server.probes import MIN_FREE_BYTES, ProbeServer, readiness
from flight_server.server import DatasetFlightServer

log = logging.getLogger("flight_server")

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
DEFAULTS = Limits()
SHUTDOWN_GRACE = 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flight_server",
        description="Serve DatasetRT datasets over Arrow Flight. Without --dataset, serve "
        "the embedded demo dataset.",
    )
    parser.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="NAME=CACHE_DIR[,CACHE_DIR...]",
        help="serve these caches as dataset NAME (repeatable)",
    )
    parser.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8815, help="port (0 = any free port)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DATASET_RT_DATA_DIR", ".data")),
        help="where the demo cache and the default state directory live (default .data)",
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        help="population store: a directory (default DATA_DIR/state), or object storage "
        "s3://BUCKET/PREFIX shared by replicas with no common file system (credentials and "
        "endpoint from AWS_* environment variables; docs/operations.md)",
    )
    parser.add_argument(
        "--mirror-dir",
        type=Path,
        default=None,
        help="this replica's local copies of what lives on object storage: the populations "
        "of --state-dir s3://... and the shards of caches given as s3://... URLs "
        "(default DATA_DIR/mirror)",
    )
    parser.add_argument(
        "--mirror-max-bytes",
        type=int,
        default=0,
        metavar="N",
        help="keep at most N bytes of cache shards in the mirror, evicting the least recently "
        "used; size it to the caches served (a smaller mirror fetches again every epoch) "
        "(default 0: no bound)",
    )
    parser.add_argument(
        "--keep-populations",
        type=int,
        default=0,
        metavar="N",
        help="after each do_put keep at most N stored populations per dataset: the active one "
        "and the most recently stored others; tickets that pin a removed one get NOT_FOUND "
        "(default 0: keep all)",
    )
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate (enables grpc+tls)")
    parser.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    parser.add_argument(
        "--token-file",
        type=Path,
        help="bearer tokens, one '<read|admin> <token> [name]' per line; every call needs one",
    )
    parser.add_argument(
        "--advertise",
        action="append",
        default=[],
        metavar="URI",
        help="locations to put in FlightInfo endpoints (repeatable; default: this server)",
    )
    parser.add_argument("--num-workers", type=int, default=2, help="Rust worker threads")
    parser.add_argument("--validate-cache", action="store_true", help="verify full checksums")
    parser.add_argument(
        "--telemetry-column",
        metavar="NAME",
        help="in the stats action, count served rows per value of this population column",
    )
    parser.add_argument(
        "--telemetry-max-groups",
        type=int,
        default=64,
        metavar="N",
        help="distinct values counted per population; the rest count as '(other)' (default 64)",
    )
    limits = parser.add_argument_group(
        "limits", "what one request, stream or client may cost (docs/flight-protocol.md#limits)"
    )
    limits.add_argument(
        "--max-endpoints",
        type=int,
        default=DEFAULTS.max_endpoints,
        metavar="N",
        help="most endpoints (world_size) in one get_flight_info answer; larger world sizes "
        f"write their tickets themselves (default {DEFAULTS.max_endpoints})",
    )
    limits.add_argument(
        "--max-streams",
        type=int,
        default=DEFAULTS.max_streams,
        metavar="N",
        help=f"do_get streams open at once; more are refused (default {DEFAULTS.max_streams})",
    )
    limits.add_argument(
        "--max-streams-per-client",
        type=int,
        default=DEFAULTS.max_streams_per_client,
        metavar="N",
        help="do_get streams open at once per client (its token with --token-file, else its "
        f"address) (default {DEFAULTS.max_streams_per_client})",
    )
    limits.add_argument(
        "--stream-idle-timeout",
        type=float,
        default=DEFAULTS.stream_idle_timeout,
        metavar="SECONDS",
        help="cancel a stream whose client took no batch for this long "
        f"(default {DEFAULTS.stream_idle_timeout:g})",
    )
    limits.add_argument(
        "--max-put-rows",
        type=int,
        default=DEFAULTS.max_put_rows,
        metavar="N",
        help=f"most rows of one do_put table (default {DEFAULTS.max_put_rows})",
    )
    limits.add_argument(
        "--max-put-bytes",
        type=int,
        default=DEFAULTS.max_put_bytes,
        metavar="BYTES",
        help=f"most Arrow bytes of one do_put table (default {DEFAULTS.max_put_bytes}, 1 TiB)",
    )
    limits.add_argument(
        "--shutdown-grace",
        type=float,
        default=SHUTDOWN_GRACE,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long calls in flight may finish before the streams left "
        f"are cancelled (default {SHUTDOWN_GRACE:g})",
    )
    signals = parser.add_argument_group(
        "signals", "metrics, probes and logs for operators (docs/operations.md)"
    )
    signals.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve HTTP /metrics (Prometheus), /healthz and /readyz on this port "
        "(0 = any free port; default: off)",
    )
    signals.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address of the metrics port (default 127.0.0.1, loopback only, whatever --host "
        "is; 0.0.0.0 to let a scraper on another machine reach it)",
    )
    signals.add_argument(
        "--metrics-auth",
        default=None,
        choices=["token", "none"],
        help="token: /metrics needs a token of --token-file (read or admin) as "
        "'authorization: Bearer <token>'; none: /metrics is open (default: token with "
        "--token-file, else none); /healthz and /readyz never need one",
    )
    signals.add_argument(
        "--min-free-bytes",
        type=int,
        default=MIN_FREE_BYTES,
        metavar="BYTES",
        help="/readyz fails while the state directory's volume has less free space "
        f"(default {MIN_FREE_BYTES}, 512 MiB; 0: no floor)",
    )
    signals.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="log lines for people (text, default) or machines (json: one object per line, "
        "one line per request with its fields)",
    )
    signals.add_argument(
        "-q",
        "--quiet",
        "--no-progress",
        dest="quiet",
        action="store_true",
        help="no progress on stderr (without it, when stderr is a terminal: a line saying "
        "what the start opens, the demo cache's progress bar when it is written, and a bar "
        "while a population is fetched from object storage or its rows file is built)",
    )
    signals.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default INFO; WARNING leaves out the line of each request "
        "that succeeded)",
    )
    return parser


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_server(args: argparse.Namespace) -> DatasetFlightServer:
    """Validate the arguments and construct (but do not start serving) the server."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key must be given together")
    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port must be between 0 and 65535, got {args.port}")
    if args.telemetry_max_groups < 1:
        raise ValueError(f"--telemetry-max-groups must be >= 1, got {args.telemetry_max_groups}")
    if args.telemetry_column in ("", "payload"):
        raise ValueError(
            f"--telemetry-column cannot be {args.telemetry_column!r}; name a population column"
        )
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port must be between 0 and 65535, got {args.metrics_port}")
    if args.metrics_auth == "token" and args.token_file is None:
        raise ValueError("--metrics-auth token needs --token-file (the tokens /metrics accepts)")
    if args.min_free_bytes < 0:
        raise ValueError(f"--min-free-bytes must be >= 0 (0: no floor), got {args.min_free_bytes}")
    if args.keep_populations < 0:
        raise ValueError(
            f"--keep-populations must be >= 0 (0: keep all), got {args.keep_populations}"
        )
    if not args.shutdown_grace >= 0:
        raise ValueError(f"--shutdown-grace must be >= 0 seconds, got {args.shutdown_grace}")
    limits = Limits(
        max_endpoints=args.max_endpoints,
        max_streams=args.max_streams,
        max_streams_per_client=args.max_streams_per_client,
        stream_idle_timeout=args.stream_idle_timeout,
        max_put_rows=args.max_put_rows,
        max_put_bytes=args.max_put_bytes,
    )
    tokens = TokenFile.load(args.token_file) if args.token_file else None
    host = args.host or "127.0.0.1"
    if not _is_loopback(host) and tokens is None:
        log.warning(
            "binding %s without --token-file: anyone who can reach this address can read "
            "and replace populations",
            host,
        )
    if args.mirror_max_bytes < 0:
        raise SystemExit("--mirror-max-bytes must be 0 (no bound) or a positive byte count")
    drt._native.set_mirror_budget(args.mirror_max_bytes)
    runtime = drt.DatasetRuntime(num_workers=args.num_workers)
    specs = [DatasetSpec.parse(text) for text in args.dataset]
    state_dir = args.state_dir or str(args.data_dir / "state")
    status(f"starting: opening {_what_opens(specs, state_dir)}", enabled=not args.quiet)
    if not specs:
        demo = ensure_demo_cache(runtime, args.data_dir, show_progress=not args.quiet)
        specs = [DatasetSpec(DEMO_NAME, (demo,))]
    catalog = Catalog(
        specs,
        state_dir,
        runtime,
        validate_cache=args.validate_cache,
        mirror_dir=args.mirror_dir or args.data_dir / "mirror",
        show_progress=not args.quiet,
    )
    for name in catalog.names():
        catalog.get(name).set_keep_populations(args.keep_populations)
    tls = None
    scheme = "grpc"
    if args.tls_cert is not None:
        tls = [(args.tls_cert.read_bytes(), args.tls_key.read_bytes())]
        scheme = "grpc+tls"
    bind = f"[{host}]" if ":" in host else host
    return DatasetFlightServer(
        catalog,
        f"{scheme}://{bind}:{args.port}",
        tokens=tokens,
        tls_certificates=tls,
        advertise=args.advertise or None,
        telemetry_column=args.telemetry_column,
        telemetry_max_groups=args.telemetry_max_groups,
        limits=limits,
    )


def _what_opens(specs: list[DatasetSpec], state_dir: str) -> str:
    """The start's status line: the datasets, their caches and the store."""
    if specs:
        caches = sum(len(spec.caches) for spec in specs)
        datasets = ", ".join(spec.name for spec in specs)
        what = f"{datasets} ({caches} cache{'s' if caches > 1 else ''})"
    else:
        what = f"the demo dataset {DEMO_NAME} (its cache is written on a first start)"
    return f"{what} and the population store {state_dir}"


class StopSignals:
    """SIGINT and SIGTERM, at any moment after construction and whichever thread
    receives them, end `wait`. Python's C-level handler writes each signal to a
    pipe (``signal.set_wakeup_fd``) that `wait` reads: a signal that comes before
    the wait stays in the pipe, and one received by a gRPC or engine thread is
    not lost (the Python-level handler only runs in the main thread, between
    bytecodes, which a thread blocked in C never reaches)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write)
        self._previous = {sig: signal.signal(sig, _noted) for sig in STOP_SIGNALS}

    def wait(self) -> signal.Signals:
        while True:
            for number in os.read(self._read, 64):
                if number in STOP_SIGNALS:
                    return signal.Signals(number)

    def restore(self) -> None:
        """Back to the handlers before (for a caller that goes on living)."""
        signal.set_wakeup_fd(self._previous_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        os.close(self._read)
        os.close(self._write)


def _noted(signum: int, frame: object) -> None:
    """The Python-level handler: nothing to do, the wakeup pipe has the signal."""


def start_probes(args: argparse.Namespace, server: DatasetFlightServer) -> ProbeServer | None:
    """The HTTP side port of ``--metrics-port``, or None when it is off."""
    if args.metrics_port is None:
        return None
    auth = args.metrics_auth or ("token" if args.token_file else "none")
    return ProbeServer(
        args.metrics_host,
        args.metrics_port,
        server.metrics.exposition,
        readiness(server.catalog, server.catalog.local_dir, args.min_free_bytes),
        tokens=TokenFile.load(args.token_file) if auth == "token" else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    stop_signals = StopSignals()
    probes = None
    try:
        server = build_server(args)
        probes = start_probes(args, server)
    except (ValueError, OSError, drt.DatasetRTError) as error:
        stop_signals.restore()
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # pyarrow raises its own types for bind failures
        stop_signals.restore()
        print(f"error: cannot start the server: {error}", file=sys.stderr)
        return 2
    if args.token_file:
        auth = "bearer tokens"
    elif _is_loopback(args.host or "127.0.0.1"):
        auth = "no auth: bound to loopback only"
    else:
        auth = "no auth"
    print(f"serving {', '.join(server.catalog.names())} at {server.location} ({auth})", flush=True)
    if probes is not None:
        locked = "; /metrics needs a bearer token" if probes.tokens_required else ""
        print(
            f"metrics and probes at {probes.url} (/metrics, /healthz, /readyz{locked})", flush=True
        )
    print(
        'try: python -c "import pyarrow.flight as f; '
        f"print([i.descriptor.path for i in f.connect('{server.location}').list_flights()])\"",
        flush=True,
    )
    received = stop_signals.wait()
    log.info("%s: stopping (in-flight calls get %g s)", received.name, args.shutdown_grace)
    stopped = server.stop(args.shutdown_grace)
    if probes is not None:
        probes.close()
    if stopped:
        return 0
    # pyarrow cannot cancel a gRPC write to a client that stopped reading;
    # leaving the process closes those connections (the clients see UNAVAILABLE).
    log.warning(
        "exiting with %d streams still waiting for clients that stopped reading",
        sum(server.streams.counts().values()),
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
