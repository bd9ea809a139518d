"""``python -m flight_server``: serve datasets over Arrow Flight.

Without ``--dataset`` it serves an embedded demo dataset, built on first start
under the data directory and reused afterwards.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import dataset_rt as drt
from flight_server.auth import TokenFile
from flight_server.catalog import Catalog, DatasetSpec
from flight_server.demo import DEMO_NAME, ensure_demo_cache
from flight_server.server import DatasetFlightServer

log = logging.getLogger("flight_server")


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
        "--state-dir", type=Path, default=None, help="population store (default DATA_DIR/state)"
    )
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate (enables grpc+tls)")
    parser.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    parser.add_argument(
        "--token-file",
        type=Path,
        help="bearer tokens, one '<read|admin> <token>' per line; every call needs one",
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
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default INFO)",
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
    tokens = TokenFile.load(args.token_file) if args.token_file else None
    host = args.host or "127.0.0.1"
    if not _is_loopback(host) and tokens is None:
        log.warning(
            "binding %s without --token-file: anyone who can reach this address can read "
            "and replace populations",
            host,
        )
    runtime = drt.DatasetRuntime(num_workers=args.num_workers)
    specs = [DatasetSpec.parse(text) for text in args.dataset]
    if not specs:
        specs = [DatasetSpec(DEMO_NAME, (ensure_demo_cache(runtime, args.data_dir),))]
    state_dir = args.state_dir or args.data_dir / "state"
    catalog = Catalog(specs, state_dir, runtime, validate_cache=args.validate_cache)
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
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        server = build_server(args)
    except (ValueError, OSError, drt.DatasetRTError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # pyarrow raises its own types for bind failures
        print(f"error: cannot start the server: {error}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.token_file:
        auth = "bearer tokens"
    elif _is_loopback(args.host or "127.0.0.1"):
        auth = "no auth: bound to loopback only"
    else:
        auth = "no auth"
    print(f"serving {', '.join(server.catalog.names())} at {server.location} ({auth})", flush=True)
    print(
        'try: python -c "import pyarrow.flight as f; '
        f"print([i.descriptor.path for i in f.connect('{server.location}').list_flights()])\"",
        flush=True,
    )
    server.serve()
    return 0
