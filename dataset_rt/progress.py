"""Progress for a user who waits: rich bars and status lines on stderr.

One rule everywhere: drawn only when stderr is a terminal and the caller did not
turn it off (``show_progress=False`` in the API, ``-q``/``--quiet`` on the
command lines); nothing at all otherwise (pipes, logs, pytest), and never on
stdout, which may carry data. The engine's own bars (the cache writer,
``upload``, a population's first fetch from object storage and the rows file
built once for a store of an older build) are indicatif's, with the same rule,
in one place (``native/src/progress.rs``).

Users: the audit's manifest and report (`dataset_rt.audit_cli`), scans of a
population (`dataset_rt.lazy.scan_batches`: ``CachedDataset.scan_metadata`` and
``DatasetClient.scan_metadata``), ``DatasetClient.get_metadata`` and puts, and
the server's start (`flight_server.cli`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def shows(enabled: bool = True) -> bool:
    """Whether progress is drawn: ``enabled`` and stderr is a terminal."""
    return enabled and sys.stderr.isatty()


class Bar:
    """What `progress_bar` yields: called with a count, it advances the bar;
    `describe` replaces its label (what the step waits for now). Both do
    nothing when no bar is drawn."""

    def __init__(self, advance: Callable[[int], None], describe: Callable[[str], None]) -> None:
        self._advance = advance
        self._describe = describe

    def __call__(self, count: int) -> None:
        self._advance(count)

    def describe(self, label: str) -> None:
        self._describe(label)


@contextmanager
def progress_bar(
    label: str, total: Callable[[], int | None], *, enabled: bool = True
) -> Iterator[Bar]:
    """A progress bar of one step (``label``) on stderr, only on a terminal and
    ``enabled``: yields the `Bar` that advances it (by rows, records, ...).
    ``total`` is asked only when the bar shows (None: not known, the bar
    pulses). The bar is removed when the step ends."""
    if not shows(enabled):
        yield Bar(lambda count: None, lambda label: None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}", markup=False),  # the label as it is, not markup
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total())
        yield Bar(
            lambda count: bar.advance(task, count),
            lambda label: bar.update(task, description=label),
        )


def status(text: str, *, enabled: bool = True) -> None:
    """One line ``text`` on stderr, only on a terminal and ``enabled``: what a
    step that is usually quick is doing (a plain line, not redrawn, so that log
    lines written meanwhile cannot garble it)."""
    if shows(enabled):
        print(text, file=sys.stderr, flush=True)


def end_engine_bar_line() -> None:
    """End the line the engine's progress bar was left on, after a step that
    drew one (on stderr, only at a terminal: the caller knows a bar was drawn).

    A finished bar (indicatif) stays on screen with the cursor after its last
    character, so the next line written (the command's "ok:", the server's
    "serving") would continue the bar's line. On a terminal that wraps at the
    bar's padded width this newline only moves to the next line, as the wrap
    would have."""
    if sys.stderr.isatty():
        sys.stderr.write("\n")
        sys.stderr.flush()
