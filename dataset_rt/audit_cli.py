"""``python -m dataset_rt audit``: the manifest and the mixture report of a run.

A run is described by a saved loader state (JSON, or a torch checkpoint with
the state under ``"loader"``) or by its keys (``--dataset``, ``--seed``,
``--batch-size``, ...). Streams come from caches opened here (``--cache`` and
``--state-dir``: no server needed) or from a server (``--server``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import polars as pl

from dataset_rt._native import check_name
from dataset_rt.audit import MANIFEST_COLUMNS, MAX_EPOCHS, RunDescription, write_manifest
from dataset_rt.errors import InvalidArgumentError
from dataset_rt.loader import LocalSource, StreamSource
from dataset_rt.progress import progress_bar

#: Exit status of a bad input (what the caller got wrong: a malformed state, a
#: wrong name, a missing store), as argparse's own usage errors.
EXIT_BAD_INPUT = 2

#: Exit status when a group deviates more than ``--max-sigma``.
EXIT_DEVIATION = 3

#: The largest loader state file read (a state is a few hundred bytes, plus 40
#: per population switch).
MAX_STATE_BYTES = 64 << 20

DESCRIPTION = """\
Recompute what a training run saw, without reading one payload: the manifest
(epoch, rank, step, position, cache_id, sample_id per sample) and the mixture
report (per group of a column: expected share from the weights, observed share,
deviation in binomial sigma, distinct samples, repeats, never drawn), with a
fingerprint of the data. Exits 3 when --max-sigma is given and a group deviates
more; 2 on a bad input (a malformed state, a wrong name, a missing population
store); 1 when something else fails (a damaged cache).
"""

EXAMPLES = """\
examples:
  # a run from its saved loader state, against the caches here
  python -m dataset_rt audit state.json --cache data/train --state-dir state \\
      --group label --plot mixture.png --max-sigma 5
  # the same through a server, a run given by its keys, only the first 100 steps
  python -m dataset_rt audit --server grpc://127.0.0.1:8815 --dataset demo \\
      --seed 7 --batch-size 32 --world-size 4 --epochs 0-1 --steps 0:100 --group label
"""


def add_parser(commands: Any) -> None:
    audit = commands.add_parser(
        "audit",
        help="the manifest and mixture report of a training run",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    audit.add_argument(
        "state",
        nargs="?",
        type=Path,
        help="a saved loader state: a JSON file (loader.state_dict(), or a dict holding it "
        "under 'loader') or a torch checkpoint (.pt) with it under 'loader'; "
        "without one, describe the run with --dataset, --seed and --batch-size",
    )
    where = audit.add_argument_group("where the streams come from (one of)")
    where.add_argument(
        "--cache",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a cache directory of the dataset, in the server's order (repeatable); "
        "needs --state-dir",
    )
    where.add_argument(
        "--state-dir", type=Path, help="the population store (a server's --state-dir)"
    )
    where.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="URI",
        help="a DatasetRT Flight server, e.g. grpc://127.0.0.1:8815 (repeatable: replicas)",
    )
    where.add_argument("--token", help="bearer token for --server")
    run = audit.add_argument_group("the run (without a state file; with one, overrides)")
    run.add_argument("--dataset", help="dataset name")
    run.add_argument("--seed", type=int, help="the run's seed")
    run.add_argument("--batch-size", type=int, help="samples per rank per step")
    run.add_argument("--world-size", type=int, help="number of ranks (default 1)")
    run.add_argument("--epoch-len", type=int, help="positions per epoch (default: the active)")
    run.add_argument("--population", help="population id (default: the active one)")
    run.add_argument(
        "--shuffle",
        choices=["true", "false", "permutation"],
        default="true",
        help="the run's stream mode: weighted draws (true, the default), table order "
        "(false) or every row once per cycle (permutation)",
    )
    run.add_argument(
        "--epochs",
        type=_epochs,
        help="epochs to cover: '3', '0,2' or '0-4' (default: the state's epoch, or 0)",
    )
    run.add_argument(
        "--seen",
        action="store_true",
        help="with a state file from a checkpoint: what the run had consumed when it "
        "saved it (epochs 0 to the state's, the last until its position); without, "
        "what follows the state (a resume point)",
    )
    out = audit.add_argument_group("what to produce")
    out.add_argument("--manifest", type=Path, help="write the manifest to this Parquet file")
    out.add_argument(
        "--read-manifest",
        type=Path,
        metavar="PATH",
        help="report on this manifest (written earlier, e.g. while training) instead of "
        "recomputing it: checks what was recorded against the run's weights",
    )
    out.add_argument(
        "--columns",
        type=lambda text: [c for c in text.split(",") if c],
        default=[],
        metavar="A,B",
        help="population columns to add to the manifest",
    )
    out.add_argument("--group", help="grouping column for the mixture report (e.g. label)")
    out.add_argument(
        "--steps",
        type=_steps,
        metavar="FIRST:STOP",
        help="report on steps FIRST <= step < STOP of each epoch (default all)",
    )
    out.add_argument("--report", type=Path, help="write the report (.json or .parquet)")
    out.add_argument("--plot", type=Path, help="draw the report to this PNG file")
    out.add_argument(
        "--max-sigma",
        type=float,
        help=f"exit {EXIT_DEVIATION} if a group deviates more than this many sigma",
    )
    out.add_argument(
        "-q",
        "--quiet",
        "--no-progress",
        dest="quiet",
        action="store_true",
        help="no progress bars (without it they show on stderr when it is a terminal: "
        "the manifest's rows as it is computed, the report's draws as they are counted)",
    )
    audit.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    """`run_audit`, with every bad input answered by one line on stderr and
    exit 2. (What broke inside, such as a damaged cache, is left to the CLI's
    own handler: exit 1.)"""
    try:
        return run_audit(args)
    except (ValueError, LookupError, OverflowError, RecursionError) as error:
        # The engine's user errors are ValueError (InvalidArgumentError, ...) or
        # LookupError (NotFoundError); one line, whatever the message holds.
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        raise  # stdout's reader went away: `cli.main` stops quietly
    except OSError as error:
        # A damaged cache, a failed write: not the input's fault (exit 1), one line.
        print(f"error: {_one_line(error)}", file=sys.stderr)
        return 1


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run_audit(args: argparse.Namespace) -> int:
    needs_group = args.report or args.plot or args.max_sigma is not None or args.steps
    if needs_group and not args.group:
        raise InvalidArgumentError("--report, --plot, --steps and --max-sigma need --group")
    if not args.manifest and not args.group:
        raise InvalidArgumentError("nothing to do: give --manifest PATH and/or --group COLUMN")
    if args.read_manifest and (args.manifest or not args.group):
        raise InvalidArgumentError("--read-manifest needs --group and excludes --manifest")
    # The state is read and checked whole before anything is opened: a name
    # from it reaches a path only once the core's rule has passed it.
    saved = _from_state(args, _read_state(args.state)) if args.state else None
    dataset = args.dataset or (saved.state.dataset if saved else None)
    if dataset is None:
        raise InvalidArgumentError("name the run's dataset: a state file or --dataset")
    check_name("dataset", dataset)
    _check_outputs(args)
    source = _source(args, dataset)
    run = saved or _from_keys(args, source, dataset)
    if args.group:
        _check_selection(args, run)

    from dataset_rt.mixture import count_draws, mixture_report

    show = not args.quiet
    with ExitStack() as stack:
        manifest = args.read_manifest or args.manifest
        if manifest is None:  # a report only: its manifest is a temporary file
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="dataset-rt-audit-"))
            manifest = Path(scratch) / "manifest.parquet"
        if args.read_manifest is None:
            columns = args.columns if args.manifest else []
            with progress_bar("manifest", run.rows, enabled=show) as advance:
                rows = write_manifest(source, run, manifest, columns=columns, progress=advance)
            if args.manifest is not None:
                print(f"manifest: {rows:,} rows -> {manifest}", file=sys.stderr)
        if not args.group:
            return 0
        where = None
        if args.steps:
            first, stop = args.steps
            where = (pl.col("step") >= first) & (pl.col("step") < stop)
        with progress_bar("report", lambda: count_draws(manifest, where), enabled=show) as advance:
            report = mixture_report(
                source, run, args.group, manifest=manifest, where=where, progress=advance
            )
    _print_report(report)
    if args.report:
        report.write(args.report)
        print(f"report -> {args.report}", file=sys.stderr)
    if args.plot:
        width, height = report.plot(args.plot)
        print(f"plot ({width}x{height}) -> {args.plot}", file=sys.stderr)
    if args.max_sigma is not None and report.max_abs_sigma > args.max_sigma:
        print(
            f"FAIL: a group deviates {report.max_abs_sigma:.2f} sigma from its expected "
            f"share (--max-sigma {args.max_sigma})",
            file=sys.stderr,
        )
        return EXIT_DEVIATION
    return 0


def _source(args: argparse.Namespace, dataset: str) -> StreamSource:
    if bool(args.server) == bool(args.cache):
        raise InvalidArgumentError(
            "give the streams' source: --cache DIR [--cache DIR ...] --state-dir DIR, "
            "or --server URI"
        )
    if args.server:
        from flight_client.source import FlightSource

        return FlightSource(args.server, token=args.token)
    if args.state_dir is None:
        raise InvalidArgumentError("--cache needs --state-dir (where the populations are)")
    # The audit reads a store, never starts one: a wrong name or state dir is
    # NotFound, not a new store there.
    return LocalSource(
        args.cache, args.state_dir, name=dataset, create=False, show_progress=not args.quiet
    )


def _from_state(args: argparse.Namespace, state: dict[str, Any]) -> RunDescription:
    if args.population or args.epoch_len or args.seed is not None or args.shuffle != "true":
        raise InvalidArgumentError(
            "a state file fixes --seed, --population, --epoch-len and --shuffle; "
            "only --epochs, --world-size and --batch-size may override it"
        )
    return RunDescription.from_state(
        state,
        epochs=args.epochs,
        world_size=args.world_size,
        batch_size=args.batch_size,
        seen=args.seen,
    )


def _from_keys(args: argparse.Namespace, source: StreamSource, dataset: str) -> RunDescription:
    if args.seen:
        raise InvalidArgumentError("--seen needs a state file (a checkpoint's loader state)")
    missing = [
        flag for flag, v in (("--seed", args.seed), ("--batch-size", args.batch_size)) if v is None
    ]
    if missing:
        raise InvalidArgumentError(f"without a state file the run needs {' and '.join(missing)}")
    return RunDescription.new(
        source,
        dataset,
        seed=args.seed,
        batch_size=args.batch_size,
        world_size=args.world_size or 1,
        epochs=args.epochs or [0],
        epoch_len=args.epoch_len,
        population=args.population,
        shuffle={"true": True, "false": False}.get(args.shuffle, "permutation"),
    )


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file to write has a directory to go to (and the report a format),
    before the run is computed."""
    if args.report is not None and args.report.suffix not in (".json", ".parquet"):
        raise InvalidArgumentError(f"--report is a .json or .parquet file, got {args.report}")
    for flag, path in (
        ("--manifest", args.manifest),
        ("--report", args.report),
        ("--plot", args.plot),
    ):
        if path is not None and not path.absolute().parent.is_dir():
            raise InvalidArgumentError(
                f"{flag} {path}: its directory {path.absolute().parent} does not exist"
            )


def _check_selection(args: argparse.Namespace, run: RunDescription) -> None:
    """A report needs draws: the run's steps (or the recorded manifest's rows)
    that ``--steps`` selects must not be none."""
    first, stop = args.steps or (0, None)
    chosen = "" if args.steps is None else f" in steps {first}:{stop}"
    if args.read_manifest is None:
        steps = max((run.steps(epoch) for epoch in run.epochs), default=0)
        if first >= steps:
            raise InvalidArgumentError(
                f"the run draws no sample{chosen}: each rank takes {steps} steps "
                f"in {_span(run.epochs)}; nothing to report on"
            )
        return
    path = args.read_manifest
    try:
        schema = pl.read_parquet_schema(path)
    except (OSError, pl.exceptions.PolarsError) as error:
        raise InvalidArgumentError(f"cannot read the manifest {path}: {error}") from None
    wrong = [name for name in MANIFEST_COLUMNS if not schema.get(name, pl.Null()).is_integer()]
    if wrong:
        raise InvalidArgumentError(
            f"{path} is not a manifest: its columns {wrong} are missing or not integers "
            f"(a manifest has {list(MANIFEST_COLUMNS)}, written by --manifest)"
        )
    rows = pl.scan_parquet(path)
    if args.steps is not None:
        rows = rows.filter((pl.col("step") >= first) & (pl.col("step") < stop))
    try:
        drawn = rows.select(pl.len()).collect().item()
    except pl.exceptions.PolarsError as error:
        raise InvalidArgumentError(f"cannot read the manifest {path}: {error}") from None
    if not drawn:
        raise InvalidArgumentError(f"the manifest {path} records no sample{chosen}")


def _span(epochs: Sequence[int]) -> str:
    if len(epochs) == 1:
        return f"epoch {epochs[0]}"
    return f"epochs {epochs[0]}-{epochs[-1]}" if epochs else "no epoch"


def _read_state(path: Path) -> dict[str, Any]:
    """A loader state from a JSON file or a torch checkpoint: a dict with
    string keys (its content is `LoaderState.from_dict`'s to check)."""
    if path.suffix in (".pt", ".pth"):
        try:
            import torch
        except ImportError:
            raise InvalidArgumentError(
                f"{path} is a torch checkpoint and torch is not installed; save the loader "
                "state as JSON (json.dump(loader.state_dict(), f)) or install torch"
            ) from None
        try:
            loaded = torch.load(path, weights_only=True)
        except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as error:
            # (RecursionError is a RuntimeError.) torch's messages run to many lines.
            first = str(error).strip().splitlines()[:1] or [type(error).__name__]
            raise InvalidArgumentError(
                f"cannot read the torch checkpoint {path}: {first[0]}"
            ) from None
    else:
        try:
            with path.open("rb") as file:
                text = file.read(MAX_STATE_BYTES + 1)
        except OSError as error:
            raise InvalidArgumentError(f"cannot read the loader state {path}: {error}") from None
        if len(text) > MAX_STATE_BYTES:
            raise InvalidArgumentError(
                f"the loader state {path} is larger than {MAX_STATE_BYTES >> 20} MiB; "
                "a loader state is a small JSON file (loader.state_dict())"
            )
        try:
            loaded = json.loads(text)
        # ValueError: malformed JSON or UTF-8, or an integer beyond Python's digit limit.
        except ValueError as error:
            raise InvalidArgumentError(f"cannot read the loader state {path}: {error}") from None
        except RecursionError:
            raise InvalidArgumentError(
                f"cannot read the loader state {path}: its JSON is nested too deeply "
                "(a loader state nests three levels)"
            ) from None
    if isinstance(loaded, dict) and "loader" in loaded and "version" not in loaded:
        loaded = loaded["loader"]
    if not isinstance(loaded, dict):
        raise InvalidArgumentError(
            f"{path} holds no loader state: expected a dict (loader.state_dict()) or a "
            f"dict with it under 'loader', got {type(loaded).__name__}"
        )
    if not all(isinstance(key, str) for key in loaded):
        raise InvalidArgumentError(
            f"{path} holds no loader state: its keys must be strings, got "
            f"{sorted(repr(key) for key in loaded)[:10]}"
        )
    return loaded


def _epochs(text: str) -> list[int]:
    try:
        if "-" in text:
            first, last = (int(x) for x in text.split("-", 1))
            if last - first >= MAX_EPOCHS:
                raise argparse.ArgumentTypeError(
                    f"epochs {text!r}: a run covers at most {MAX_EPOCHS} epochs"
                )
            chosen = list(range(first, last + 1))
        else:
            chosen = [int(x) for x in text.split(",") if x]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 0:
        raise argparse.ArgumentTypeError(
            f"epochs are '3', '0,2' or '0-4' (non-negative, ascending range), got {text!r}"
        )
    return chosen


def _steps(text: str) -> tuple[int, int]:
    first, sep, stop = text.partition(":")
    try:
        bounds = (int(first or 0), int(stop))
    except ValueError:
        bounds = (0, -1)
    if not sep or bounds[0] < 0 or bounds[1] <= bounds[0]:
        raise argparse.ArgumentTypeError(
            f"steps are FIRST:STOP with 0 <= FIRST < STOP, e.g. 0:100, got {text!r}"
        )
    return bounds


def _print_report(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{report.dataset}: {report.draws:,} draws by {report.group!r}",
        caption=f"populations {', '.join(report.populations)}",
    )
    for name in (
        report.group,
        "expected",
        "observed",
        "sigma",
        "distinct",
        "repeats",
        "never drawn",
    ):
        table.add_column(name, justify="left" if name == report.group else "right")
    for row in report.groups.iter_rows(named=True):
        sigma = row["sigma"]
        style = "red" if abs(sigma) >= 5 else "yellow" if abs(sigma) >= 2 else None
        table.add_row(
            "(null)" if row[report.group] is None else str(row[report.group]),
            f"{row['expected_share']:.4%}",
            f"{row['observed_share']:.4%} ({row['observed']:,})",
            f"{sigma:+.2f}",
            f"{row['distinct']:,}",
            f"{row['repeats']:,}",
            f"{row['never_drawn']:,}",
            style=style,
        )
    print(f"fingerprint: {report.fingerprint}")
    # A pipe gets a fixed width, so that logs show whole rows.
    Console(width=None if sys.stdout.isatty() else 120).print(table)
