"""``python -m flight_server``: start, announce, serve, stop, and refuse bad arguments.

Every server here is a real subprocess bound to 127.0.0.1 on port 0. Its output is
read by background threads, every wait is bounded, and every process is killed in
``finally`` (``ServerProcess`` is a context manager). ``ServerProcess`` is also used
by ``test_security.py`` and ``test_failover.py``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records, write

from flight_server import cli

STARTUP_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
CALL_TIMEOUT = 20.0
LOCATION_LINE = re.compile(r"^serving (?P<names>.+) at (?P<location>grpc(?:\+tls)?://\S+)")


class ServerProcess:
    """``python -m flight_server ARGS`` with stdout and stderr collected line by line.

    Use it as a context manager: on exit the process is killed (if still running)
    and reaped, and the reader threads are joined, all with bounded waits.
    """

    def __init__(self, args: list[str], *, cwd: Path | None = None) -> None:
        env = dict(os.environ)
        env.pop("DATASET_RT_DATA_DIR", None)
        self.args = args
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flight_server", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._pump, args=(self.process.stdout, self.stdout)),
            threading.Thread(target=self._pump, args=(self.process.stderr, self.stderr)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    def _pump(self, pipe: object, lines: list[str]) -> None:
        assert pipe is not None
        for line in pipe:  # type: ignore[attr-defined]
            with self._changed:
                lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        with self._changed:
            return "stdout:\n" + "\n".join(self.stdout) + "\nstderr:\n" + "\n".join(self.stderr)

    def wait_for_line(
        self,
        pattern: str | re.Pattern[str],
        *,
        stream: str = "stdout",
        timeout: float = STARTUP_TIMEOUT,
    ) -> re.Match[str]:
        """The first line of ``stream`` matching ``pattern``; fails after ``timeout`` s."""
        regex = re.compile(pattern)
        lines = self.stdout if stream == "stdout" else self.stderr
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in lines:
                    match = regex.search(line)
                    if match:
                        return match
                readers_done = not any(r.is_alive() for r in self._readers)
                remaining = deadline - time.monotonic()
                if readers_done or remaining <= 0:
                    break
                self._changed.wait(min(remaining, 0.5))
        raise AssertionError(
            f"no {stream} line matching {regex.pattern!r} within {timeout} s "
            f"(exit code {self.process.poll()}); {self.output()}"
        )

    def location(self, timeout: float = STARTUP_TIMEOUT) -> str:
        """The ``grpc://127.0.0.1:PORT`` the server announced."""
        return self.wait_for_line(LOCATION_LINE, timeout=timeout)["location"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``sig`` and return the exit code (fails if it does not exit in time)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the server did not exit within {timeout} s of signal {sig}; {self.output()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(STOP_TIMEOUT)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
        finally:
            for reader in self._readers:
                reader.join(STOP_TIMEOUT)
            for pipe in (self.process.stdout, self.process.stderr):
                if pipe is not None:
                    pipe.close()


def run_cli(args: list[str], timeout: float = STARTUP_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m flight_server ARGS`` to completion (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "flight_server", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def options() -> flight.FlightCallOptions:
    return flight.FlightCallOptions(timeout=CALL_TIMEOUT)


def epoch_ids(location: str, dataset: str, seed: int = 1) -> list[tuple[int, int, int]]:
    """``(position, cache_id, sample_id)`` of epoch 0, fetched with plain pyarrow.flight."""
    command = {"dataset": dataset, "seed": seed, "epoch": 0}
    with flight.connect(location) as client:
        info = client.get_flight_info(
            flight.FlightDescriptor.for_command(json.dumps(command)), options()
        )
        assert len(info.endpoints) == 1
        table = client.do_get(info.endpoints[0].ticket, options()).read_all()
    assert table.num_rows == info.total_records
    return list(
        zip(
            table.column("position").to_pylist(),
            table.column("cache_id").to_pylist(),
            table.column("sample_id").to_pylist(),
            strict=True,
        )
    )


def listed(location: str) -> list[str]:
    with flight.connect(location) as client:
        return [i.descriptor.path[0].decode() for i in client.list_flights(options=options())]


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


# -- the demo ------------------------------------------------------------------------


def test_demo_starts_announces_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    with ServerProcess(["--port", "0", "--data-dir", str(tmp_path / "data")]) as server:
        first = server.wait_for_line(LOCATION_LINE)
        location = first["location"]
        assert first["names"] == "demo"
        assert re.fullmatch(r"grpc://127\.0\.0\.1:\d+", location), first.string
        assert int(location.rsplit(":", 1)[1]) > 0
        example = server.wait_for_line(r"^try: ", timeout=5)
        assert location in example.string

        assert listed(location) == ["demo"]
        ids = epoch_ids(location, "demo")
        assert len(ids) == 2000
        assert [p for p, _, _ in ids] == list(range(2000))

        # The printed example is one command line that works as printed.
        words = shlex.split(example.string.removeprefix("try: "))
        assert words[:2] == ["python", "-c"]
        ran = subprocess.run(
            [sys.executable, *words[1:]], capture_output=True, text=True, timeout=60, check=False
        )
        assert ran.returncode == 0, ran.stderr
        assert "demo" in ran.stdout

        started = time.monotonic()
        assert server.stop(signal.SIGTERM) == 0, server.output()
        assert time.monotonic() - started < 5.0


def test_demo_cache_is_built_once_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ["--port", "0", "--data-dir", str(data)]
    with ServerProcess(args) as first:
        first_ids = epoch_ids(first.location(), "demo", seed=3)
        assert first.stop() == 0, first.output()
    caches = data / "caches"
    built = mtimes(caches)
    manifests = list(caches.glob("*/manifest.json"))
    assert len(manifests) == 1, built
    cache_id = json.loads(manifests[0].read_text())["manifest"]["cache_id"]
    assert {c for _, c, _ in first_ids} == {cache_id}

    with ServerProcess(args) as second:
        second_ids = epoch_ids(second.location(), "demo", seed=3)
        assert second.stop() == 0, second.output()
    assert second_ids == first_ids
    assert mtimes(caches) == built  # no file rewritten, none added


# -- existing caches -------------------------------------------------------------


def test_dataset_argument_serves_existing_caches(tmp_path: Path) -> None:
    alpha = write(tmp_path / "caches", ListSource("alpha", make_records(30)))
    beta = write(tmp_path / "caches", ListSource("beta", make_records(20, seed=5)))
    gamma = write(tmp_path / "caches", ListSource("gamma", make_records(7, seed=6)))
    args = [
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
        "--dataset",
        f"pair={alpha},{beta}",
        "--dataset",
        f"single={gamma}",
    ]
    with ServerProcess(args) as server:
        location = server.location()
        assert sorted(listed(location)) == ["pair", "single"]
        pair = epoch_ids(location, "pair")
        single = epoch_ids(location, "single")
        assert len(pair) == 50
        assert len({c for _, c, _ in pair}) == 2
        assert len(single) == 7
        assert {s for _, _, s in single} <= set(range(7))
        assert server.stop() == 0, server.output()
    assert not (tmp_path / "data" / "caches").exists()  # no demo built


# -- refused arguments --------------------------------------------------------------
#
# The command line is parsed and checked by `flight_server.cli.main`, which is what
# ``python -m flight_server`` exits with. The cases run in-process (a subprocess
# costs ~2 s of imports each); one runs as a real process to hold the exit path.


def _corrupt_cache(root: Path) -> Path:
    broken = write(root / "broken", ListSource("broken", make_records(10)))
    index = broken / "index.bin"
    index.write_bytes(index.read_bytes()[:-7])
    return broken


def _bad_token_file(root: Path) -> Path:
    path = root / "tokens.txt"
    path.write_text("admin 0123456789abcdef0123\nread short\n")
    return path


BAD_CASES: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    "malformed dataset": (lambda root, good: ["--dataset", "no-equals-sign"], r"--dataset"),
    "empty dataset dirs": (lambda root, good: ["--dataset", "toy="], r"--dataset"),
    "missing cache dir": (
        lambda root, good: ["--dataset", f"toy={root / 'does-not-exist'}"],
        r"does-not-exist",
    ),
    "corrupt cache": (
        lambda root, good: ["--dataset", f"toy={_corrupt_cache(root)}"],
        r"broken.*index\.bin|index\.bin.*broken",
    ),
    "tls cert without key": (
        lambda root, good: ["--dataset", f"toy={good}", "--tls-cert", str(root / "cert.pem")],
        r"--tls-key",
    ),
    "tls key without cert": (
        lambda root, good: ["--dataset", f"toy={good}", "--tls-key", str(root / "key.pem")],
        r"--tls-cert",
    ),
    "bad token file": (
        lambda root, good: ["--dataset", f"toy={good}", "--token-file", str(_bad_token_file(root))],
        r"tokens\.txt:2",
    ),
    "missing token file": (
        lambda root, good: ["--dataset", f"toy={good}", "--token-file", str(root / "nope.txt")],
        r"nope\.txt",
    ),
    "port too large": (lambda root, good: ["--dataset", f"toy={good}", "--port", "65536"], "port"),
    "negative port": (lambda root, good: ["--dataset", f"toy={good}", "--port", "-1"], "port"),
    "port not a number": (lambda root, good: ["--port", "eighty"], r"--port"),
}


@pytest.fixture(scope="module")
def good_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("good"), ListSource("good", make_records(10)))


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_arguments_exit_nonzero_naming_the_problem(
    tmp_path: Path, good_cache: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make_args, problem = BAD_CASES[case]
    args = ["--data-dir", str(tmp_path / "data"), "--port", "0", *make_args(tmp_path, good_cache)]
    try:
        code = cli.main(args)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    out, err = capsys.readouterr()
    assert code not in (0, None), (args, out, err)
    assert re.search(problem, err), (args, err)
    assert "Traceback" not in err, err
    assert "serving" not in out
    assert not (tmp_path / "data" / "caches").exists()  # no demo built on the way


def test_a_missing_cache_dir_is_not_called_corrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped path is a missing directory, not a damaged cache to delete."""
    missing = tmp_path / "typo"
    code = cli.main(["--data-dir", str(tmp_path / "data"), "--dataset", f"toy={missing}"])
    err = capsys.readouterr().err
    assert code != 0
    assert str(missing) in err
    assert re.search(r"does not exist|no such|not found|missing", err, re.IGNORECASE), err
    assert "corrupt" not in err.lower(), err


def test_bad_arguments_exit_nonzero_from_the_real_command(tmp_path: Path) -> None:
    result = run_cli(
        ["--data-dir", str(tmp_path / "data"), "--port", "0", "--dataset", "no-equals-sign"]
    )
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "--dataset 'no-equals-sign' is malformed" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""


def test_help_describes_the_options() -> None:
    result = run_cli(["--help"])
    assert result.returncode == 0, result.stderr
    for option in (
        "--dataset",
        "--host",
        "--port",
        "--data-dir",
        "--state-dir",
        "--tls-cert",
        "--tls-key",
        "--token-file",
        "--num-workers",
        "--log-level",
    ):
        assert option in result.stdout, option
