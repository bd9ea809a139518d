"""``python -m dataset_rt``: inspect, verify, write and import caches, or run the demo.

With no arguments it runs a small self-contained demo (writes a cache under
``./.data/demo``, reweights it with Polars and reads a balanced epoch).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path

from dataset_rt import _native
from dataset_rt.audit_cli import add_parser as add_audit_parser
from dataset_rt.errors import (
    DatasetRTError,
    InvalidArgumentError,
    SchemaMismatchError,
    SourceError,
)
from dataset_rt.progress import end_engine_bar_line
from dataset_rt.records import CacheInput


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _inspect(args: argparse.Namespace) -> int:
    info = _native.inspect_cache(str(args.cache))
    if args.json:
        print(info.to_json())
        return 0
    stored = sum(shard.bytes for shard in info.shards)
    print(f"cache         {info.path}")
    print(f"source        {info.source_name}")
    print(f"cache_id      {info.cache_id}")
    print(f"format        version {info.format_version} ({info.writer})")
    print(f"records       {info.record_count}")
    print(f"compression   {info.codec} (level {info.level})")
    print(f"payload       {_human_bytes(info.payload_bytes)} raw, {_human_bytes(stored)} stored")
    print(f"shards        {len(info.shards)}")
    for shard in info.shards:
        print(f"  {shard.file}  {shard.records} records  {_human_bytes(shard.bytes)}")
    print("columns")
    print("  sample_id: uint64")
    for name, dtype in info.columns:
        print(f"  {name}: {dtype}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    report = _native.verify_cache(str(args.cache))
    print(
        f"ok: {report.path}: {report.records} records, {report.files} files, "
        f"{_human_bytes(report.bytes)} verified"
    )
    return 0


def _upload(args: argparse.Namespace) -> int:
    """Publish a cache on object storage (credentials from the AWS_* environment)."""
    report = _native.upload_cache(str(args.cache), args.url, show_progress=sys.stderr.isatty())
    if report.uploaded:  # else no bar was drawn
        end_engine_bar_line()
    done = "uploaded" if report.uploaded else "already published, nothing sent"
    print(
        f"ok: {args.cache} -> {report.url}: {done} ({_human_bytes(report.bytes)}, "
        f"cache_id {report.cache_id}, version {report.version})"
    )
    return 0


def _remove_uncommitted(args: argparse.Namespace) -> int:
    """Remove the parts of a dataset location that no committed descriptor names."""
    from dataset_rt.parts import remove_uncommitted

    removal = remove_uncommitted(
        args.location, min_age_seconds=args.min_age_seconds, dry_run=args.dry_run
    )
    verb = "would remove" if args.dry_run else "removed"
    for part in removal.parts:
        print(f"{verb}: {part}")
    for part in removal.recent:
        print(f"kept (written less than {args.min_age_seconds:g} s ago): {part}")
    print(
        f"ok: {args.location}: {verb} {len(removal.parts)} uncommitted parts "
        f"({_human_bytes(removal.bytes)}), kept {len(removal.recent)} recent ones"
    )
    return 0


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0.0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _load_sources(spec: str) -> list[object]:
    """``module:attr`` -> the sources it names (an instance, a class, a factory or a list)."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"source {spec!r} is malformed; expected MODULE:ATTRIBUTE")
    target: object = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if isinstance(target, type) or (callable(target) and not hasattr(target, "__iter__")):
        target = target()
    return list(target) if isinstance(target, (list, tuple)) else [target]


def _write(args: argparse.Namespace) -> int:
    import dataset_rt as drt

    sys.path.insert(0, str(Path.cwd()))
    runtime = drt.DatasetRuntime(num_workers=args.num_workers)
    results = runtime.ensure_caches(_load_sources(args.source), args.base_dir)  # type: ignore[arg-type]
    failed = False
    for result in results:
        if isinstance(result, drt.CacheWriteSuccess):
            print(f"ok: {result.source_name} -> {result.path}")
        else:
            failed = True
            print(f"error: {result.source_name}: {result.message}", file=sys.stderr)
    return 1 if failed else 0


def _import(args: argparse.Namespace) -> int:
    """Write a cache from Parquet; bad input (path, column, type, name, an existing
    cache of other records) exits 2, an existing cache of the same records is reused."""
    from dataset_rt.config import WriterConfig
    from dataset_rt.runtime import DatasetRuntime, write_arrow_cache

    try:
        _native.validate_source_name(args.name)
        runtime = DatasetRuntime(num_workers=args.num_workers)
        path, reused = write_arrow_cache(
            runtime.native,
            args.path,
            args.base_dir,
            args.name,
            args.payload_column,
            WriterConfig(),
            args.batch_size,
        )
    except (InvalidArgumentError, SourceError, SchemaMismatchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    end_engine_bar_line()
    # From the manifest the writer just published (or the existing cache's, checked
    # before it was reused): opening the cache would map and hash index.bin and
    # metadata.arrow again, gigabytes at 10^8 rows.
    info = _native.describe_manifest(str(path))
    done = "reused (it holds these records), " if reused else ""
    print(
        f"ok: {args.name} -> {path}: {done}{info.record_count} records, "
        f"{_human_bytes(info.payload_bytes)}, cache_id {info.cache_id}"
    )
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class _DemoSource:
    """Twelve records: nine of label 0, three of label 1."""

    name = "demo_imbalanced"

    def __iter__(self) -> Iterator[CacheInput]:
        for index in range(12):
            yield CacheInput(
                data=f"sample {index}".encode(),
                metadata={"label": int(index >= 9), "split": "train"},
            )


def _demo(args: argparse.Namespace) -> int:
    import polars as pl

    import dataset_rt as drt

    runtime = drt.DatasetRuntime(num_workers=2)
    result = runtime.from_cache_sources(
        _DemoSource(), args.data_dir, reader_config=drt.ReaderConfig(seed=42)
    )
    if isinstance(result, drt.CacheSourcesDatasetError):
        print(f"error: {result.message}", file=sys.stderr)
        return 1
    dataset = result.dataset
    table = dataset.get_metadata()
    balanced = table.with_columns((1.0 / pl.len().over("label")).alias("weight"))
    dataset.update_metadata(balanced)
    dataset.set_epoch_len(1200)
    counts = [0, 0]
    for sample in dataset:
        counts[int(sample.metadata["label"])] += 1
    print(f"cache: {dataset.cache_paths[0]}")
    print(balanced.group_by("label").agg(pl.col("weight").sum()).sort("label"))
    print(f"1200 weighted draws, class counts: {counts} (balanced: both near 600)")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dataset_rt",
        description="Inspect and verify DatasetRT caches, audit training runs. Without a "
        "command, run the demo.",
    )
    commands = parser.add_subparsers(dest="command")
    inspect_help = "summarise a cache: manifest, schema, sizes, row counts"
    inspect = commands.add_parser("inspect", help=inspect_help, description=inspect_help)
    inspect.add_argument("cache", type=Path, help="a cache directory")
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(run=_inspect)
    verify_help = (
        "verify the full checksum of every file and record of a cache; "
        "exits 1 and names the damaged file on corruption"
    )
    verify = commands.add_parser("verify", help=verify_help, description=verify_help)
    verify.add_argument("cache", type=Path, help="a cache directory")
    verify.set_defaults(run=_verify)
    write_help = (
        "write (or reuse) the caches of MODULE:ATTRIBUTE (a source, a source class, a "
        "factory or a list of sources) under BASE_DIR; a cache that exists is reused "
        "without running its source (its name stands for its records)"
    )
    write = commands.add_parser("write", help=write_help, description=write_help)
    write.add_argument("source", help="MODULE:ATTRIBUTE, importable from the current directory")
    write.add_argument("base_dir", type=Path, help="where the cache directories go")
    write.add_argument("--num-workers", type=int, default=2, help="Rust worker threads")
    write.set_defaults(run=_write)
    import_help = (
        "write the cache BASE_DIR/NAME from a Parquet file or a directory of Parquet "
        "files, one record per row: --payload-column is the payload (binary), the other "
        "columns are stored metadata; a progress bar is drawn when stderr is a terminal. "
        "An existing BASE_DIR/NAME is reused when it holds the same records (the same "
        "cache_id) and is an error (exit 2) otherwise"
    )
    ingest = commands.add_parser("import", help=import_help, description=import_help)
    ingest.add_argument("path", type=Path, help="a Parquet file or a directory of them")
    ingest.add_argument("--payload-column", required=True, help="the binary payload column")
    ingest.add_argument("--name", required=True, help="the cache (source) name")
    ingest.add_argument(
        "--base-dir", type=Path, default=Path("."), help="where the cache directory goes"
    )
    ingest.add_argument(
        "--batch-size", type=_positive_int, default=64 * 1024, help="rows per batch read"
    )
    ingest.add_argument("--num-workers", type=_positive_int, default=2, help="Rust workers")
    ingest.set_defaults(run=_import)
    upload_help = (
        "publish a cache on S3-compatible object storage as URL/NAME (URL is "
        "s3://BUCKET/PREFIX; credentials and endpoint from the AWS_* environment): verified "
        "in full, uploaded, then published at once; a published cache is never replaced"
    )
    upload = commands.add_parser("upload", help=upload_help, description=upload_help)
    upload.add_argument("cache", type=Path, help="a cache directory")
    upload.add_argument("url", help="s3://BUCKET/PREFIX (the cache goes to URL/NAME)")
    upload.set_defaults(run=_upload)
    remove_help = (
        "remove the parts at a dataset LOCATION (a directory or s3://BUCKET/PREFIX) that no "
        "committed descriptor names: what a crashed or abandoned parallel write left "
        "(docs/distributed.md); parts written in the last --min-age-seconds are kept, as a "
        "write may still be running"
    )
    remove = commands.add_parser("remove-uncommitted", help=remove_help, description=remove_help)
    remove.add_argument("location", help="the dataset's directory or s3://BUCKET/PREFIX")
    remove.add_argument(
        "--min-age-seconds",
        type=_non_negative_float,
        default=3600.0,
        help="keep parts with an object younger than this (default 3600)",
    )
    remove.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    remove.set_defaults(run=_remove_uncommitted)
    add_audit_parser(commands)
    demo_help = "write a demo cache (or reuse it), reweight it with Polars, read a balanced epoch"
    demo = commands.add_parser("demo", help=demo_help, description=demo_help)
    demo.add_argument(
        "--data-dir", type=Path, default=Path(".data"), help="where the demo cache is written"
    )
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["demo"])
    try:
        try:
            code = int(args.run(args))
            sys.stdout.flush()  # a reader that went away shows here, not at exit
        except (DatasetRTError, ValueError, ImportError, AttributeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    except BrokenPipeError:
        return _reader_went_away()
    return code


def _reader_went_away() -> int:
    """stdout's reader stopped reading (``inspect --json | head``): stop quietly
    and exit 1, as Unix tools do, with no traceback. stdout now points to
    /dev/null: Python flushes it again at exit, and the output it still holds
    would fail the same way."""
    with suppress(OSError, ValueError):  # ValueError: a stdout without a file
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
