"""The datasets a server serves, opened from cache directories."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dataset_rt as drt
from dataset_rt import service as engine
from flight_server.errors import ProtocolError, Redactor


@dataclass(frozen=True)
class DatasetSpec:
    """``NAME=CACHE[,CACHE...]`` from the command line: a cache directory, or a
    cache published on object storage (``s3://BUCKET/PREFIX/NAME``, kept as text)."""

    name: str
    caches: tuple[Path | str, ...]

    @classmethod
    def parse(cls, text: str) -> DatasetSpec:
        name, sep, dirs = text.partition("=")
        # The engine tells a directory from object storage (kept as text).
        paths = tuple(engine.local_path(d) or d for d in dirs.split(",") if d)
        if not sep or not name or not paths:
            raise ValueError(
                f"--dataset {text!r} is malformed; expected NAME=CACHE_DIR[,CACHE_DIR...]"
            )
        engine.check_name("dataset", name)  # the core's one rule for path parts
        return cls(name, paths)


class Catalog:
    """Dataset name -> native `DatasetService` (populations, streams, statistics)."""

    def __init__(
        self,
        specs: list[DatasetSpec],
        state_dir: str | Path,
        runtime: drt.DatasetRuntime,
        *,
        validate_cache: bool = False,
        mirror_dir: Path | None = None,
        show_progress: bool = True,
    ) -> None:
        """``show_progress``: a progress bar on stderr, on a terminal only, while a
        population is fetched from object storage on its first use here or its rows
        file is built once for a store written before rows files existed."""
        if not specs:
            raise ValueError("a server needs at least one dataset")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"dataset names must be unique, got {names}")
        self.runtime = runtime
        #: The store: a directory, or an s3:// URL.
        self.state_dir = str(state_dir)
        #: The local directory the server writes: the store, or its mirror (the
        #: engine decides which, and refuses object storage without a mirror).
        self.local_dir = engine.state_local_dir(self.state_dir, mirror_dir)
        # The server's own paths, named in what clients see instead.
        private = {self.local_dir: "<state>"}
        if mirror_dir is not None and Path(mirror_dir) != self.local_dir:
            private[Path(mirror_dir)] = "<mirror>"
        for spec in specs:
            private |= {
                Path(cache): f"<cache {Path(cache).name}>"
                for cache in spec.caches
                if isinstance(cache, Path)
            }
        self.redact = Redactor(private)
        self._services = {
            spec.name: engine.DatasetService(
                runtime.native,
                spec.name,
                [str(p) for p in spec.caches],
                self.state_dir,
                validate_cache=validate_cache,
                mirror_dir=str(mirror_dir) if mirror_dir else None,
                show_progress=show_progress,
            )
            for spec in specs
        }

    def names(self) -> list[str]:
        return list(self._services)

    def get(self, name: str) -> engine.DatasetService:
        try:
            return self._services[name]
        except KeyError:
            raise drt.NotFoundError(
                f"unknown dataset {name!r}; this server serves {sorted(self._services)}"
            ) from None

    def require(self, name: str | None) -> engine.DatasetService:
        if name is None:
            raise ProtocolError("the key 'dataset' is required")
        return self.get(name)
