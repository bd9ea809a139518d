"""Issue 22, finding 5 (and the free-space floor of finding 4): the HTTP side port.

``--metrics-port`` was ``http.server.ThreadingHTTPServer``: one thread per
connection, held for as long as the client stayed silent; a listen queue of 5,
so parallel scrapers lost SYNs; bound to ``--host``'s address, and ``/metrics``
open even when the Flight port needs a token. It is now waitress with bounds
(`flight_server.probes`), on loopback unless told otherwise, ``/metrics``
behind the token file's tokens, and ``/readyz`` not ready below a free-space
floor of the state volume.

Every loop here is bounded in count and every wait in time (``WAIT``, or what
the server's own bounds promise, with a margin).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from flight.conftest import DATASET, build_caches, make_catalog

import dataset_rt as drt
from flight_server import cli, probes
from flight_server.probes import ProbeServer, readiness

WAIT = 30.0  # the most any one request or wait below may take
READ_TOKEN = "read-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
#: How long the server may take to close a silent connection: its timeout, the
#: interval of its check, one turn of its loop, and a margin for a busy machine.
REAP_SECONDS = probes.CHANNEL_TIMEOUT + probes.CLEANUP_INTERVAL + probes.LOOP_SECONDS + 5.0
SILENT = probes.CONNECTION_LIMIT + 72  # more than the server takes at once
SCRAPERS = 64
SCRAPES_EACH = 20
NO_FLOOR = "0"
HUGE_FLOOR = str(2**62)  # more bytes than any volume has free


@pytest.fixture(scope="module")
def caches(
    tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime
) -> tuple[Path, ...]:
    return build_caches(tmp_path_factory.mktemp("caches"), runtime)


@pytest.fixture
def side_port(
    tmp_path: Path, runtime: drt.DatasetRuntime, caches: tuple[Path, ...]
) -> Iterator[ProbeServer]:
    """A side port on loopback over a real catalog, its metrics a fixed text."""
    catalog = make_catalog(tmp_path, runtime, caches=caches)
    server = ProbeServer(
        "127.0.0.1", 0, lambda: b"datasetrt_up 1\n", readiness(catalog, catalog.state_dir, 0)
    )
    try:
        yield server
    finally:
        server.close()


@contextmanager
def cli_probes(tmp_path: Path, caches: tuple[Path, ...], *options: str) -> Iterator[ProbeServer]:
    """The side port as ``python -m flight_server`` starts it (Flight on port 0)."""
    args = cli._parser().parse_args(
        ["--port", "0", "--metrics-port", "0", "--state-dir", str(tmp_path / "state"),
         "--dataset", f"{DATASET}={','.join(map(str, caches))}", *options]
    )  # fmt: skip
    with ExitStack() as stack:
        server = stack.enter_context(cli.build_server(args))
        side = cli.start_probes(args, server)
        assert side is not None
        stack.callback(side.close)
        yield side


def get(url: str, authorization: str | None = None, timeout: float = WAIT) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"read {READ_TOKEN}\nadmin {ADMIN_TOKEN}\n")
    return path


def closed_by_server(connection: socket.socket, deadline: float) -> bool:
    """Whether the server closes ``connection`` (which sent nothing) before ``deadline``."""
    connection.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


# -- connections -------------------------------------------------------------------


def test_silent_connections_hold_no_thread_and_are_closed(side_port: ProbeServer) -> None:
    """More silent connections than the limit: no thread each, each closed after
    the channel timeout, and the probes answer again once they are."""
    address = ("127.0.0.1", side_port.port)
    threads = threading.active_count()
    with ExitStack() as stack:
        silent = [
            stack.enter_context(socket.create_connection(address, timeout=WAIT))
            for _ in range(SILENT)
        ]
        time.sleep(0.5)  # let the server accept what it will
        assert threading.active_count() - threads < 8, "a thread per silent connection"
        # Queued behind the silent ones past the limit, answered once the first are closed.
        assert get(side_port.url + "/healthz", timeout=2 * REAP_SECONDS) == (200, "ok\n")
        # The ones accepted late are closed one timeout later.
        deadline = time.monotonic() + 2 * REAP_SECONDS
        still_open = sum(not closed_by_server(connection, deadline) for connection in silent)
        assert still_open == 0, f"{still_open} of {SILENT} silent connections still open"
    assert get(side_port.url + "/readyz") == (200, "ready\n")


def test_a_half_sent_request_is_closed_too(side_port: ProbeServer) -> None:
    with socket.create_connection(("127.0.0.1", side_port.port), timeout=WAIT) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        assert closed_by_server(slow, time.monotonic() + REAP_SECONDS)


def listen_queue_overflows() -> int | None:
    """The kernel's count of connections dropped at a full listen queue (Linux's
    ``TcpExt: ListenOverflows``, for this network namespace), None elsewhere."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            counters = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            if "ListenOverflows" in counters:
                return int(counters["ListenOverflows"])
    return None


def test_parallel_scrapers_all_succeed(side_port: ProbeServer) -> None:
    """64 scrapers at once, each a fresh connection per scrape: every scrape
    answered, and none dropped at a full listen queue (which costs the client a
    1 s SYN retransmit, or the scrape: 5 % and 13 in 1,500 with a queue of 5)."""

    def scrape(_: int) -> list[int | str]:
        answers: list[int | str] = []
        for _ in range(SCRAPES_EACH):
            try:
                answers.append(get(side_port.url + "/metrics")[0])
            except OSError as error:
                answers.append(type(error).__name__)
        return answers

    before = listen_queue_overflows()
    with ThreadPoolExecutor(SCRAPERS) as pool:
        answers = [a for scraper in pool.map(scrape, range(SCRAPERS)) for a in scraper]
    assert len(answers) == SCRAPERS * SCRAPES_EACH
    failed = [answer for answer in answers if answer != 200]
    assert not failed, f"{len(failed)} of {len(answers)} scrapes failed: {failed[:10]}"
    after = listen_queue_overflows()
    if before is not None and after is not None:
        assert after == before, f"{after - before} connections overflowed a listen queue"


# -- where it listens ----------------------------------------------------------------


def test_the_side_port_is_on_loopback_whatever_the_flight_host(
    tmp_path: Path, caches: tuple[Path, ...]
) -> None:
    with cli_probes(
        tmp_path, caches, "--host", "0.0.0.0", "--token-file", str(token_file(tmp_path))
    ) as side:
        assert urlsplit(side.url).hostname == "127.0.0.1", side.url
        assert get(side.url + "/healthz") == (200, "ok\n")
    args = cli._parser().parse_args(["--host", "0.0.0.0", "--metrics-port", "9815"])
    assert args.metrics_host == "127.0.0.1"


# -- who may read /metrics -----------------------------------------------------------


def test_metrics_need_a_token_of_the_token_file_and_probes_do_not(
    tmp_path: Path, caches: tuple[Path, ...]
) -> None:
    with cli_probes(tmp_path, caches, "--token-file", str(token_file(tmp_path))) as side:
        url = side.url + "/metrics"
        for refused in (None, "", "Bearer", "Bearer wrong-token-0123456789abcdef",
                        f"Basic {READ_TOKEN}", f"Bearer {READ_TOKEN}x", READ_TOKEN):  # fmt: skip
            request = urllib.request.Request(url)
            if refused is not None:
                request.add_header("Authorization", refused)
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(request, timeout=WAIT)
            assert answer.value.code == 401, refused
            assert answer.value.headers["WWW-Authenticate"] == "Bearer", refused
            assert "datasetrt_" not in answer.value.read().decode(), refused
        for spelling in (f"Bearer {READ_TOKEN}", f"bearer {READ_TOKEN}", f"BEARER {READ_TOKEN}",
                         f"  Bearer   {READ_TOKEN}  ", f"Bearer {ADMIN_TOKEN}"):  # fmt: skip
            status, text = get(url, spelling)
            assert status == 200, spelling
            assert "datasetrt_requests_total" in text, spelling
        assert get(side.url + "/healthz") == (200, "ok\n")
        assert get(side.url + "/readyz") == (200, "ready\n")
        assert get(side.url + "/readyz", "Bearer wrong-token-0123456789abcdef")[0] == 200


def test_metrics_auth_none_opens_metrics_beside_a_token_file(
    tmp_path: Path, caches: tuple[Path, ...]
) -> None:
    options = ("--token-file", str(token_file(tmp_path)), "--metrics-auth", "none")
    with cli_probes(tmp_path, caches, *options) as side:
        assert get(side.url + "/metrics")[0] == 200


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--metrics-auth", "token"], "--metrics-auth token needs --token-file"),
        (["--min-free-bytes", "-1"], "--min-free-bytes must be >= 0"),
    ],
)
def test_bad_side_port_options_are_refused_naming_them(
    tmp_path: Path, caches: tuple[Path, ...], options: list[str], problem: str
) -> None:
    args = cli._parser().parse_args(
        ["--port", "0", "--metrics-port", "0", "--dataset", f"{DATASET}={caches[0]}", *options]
    )
    with pytest.raises(ValueError, match=problem):
        cli.build_server(args)


def test_min_free_bytes_is_an_integer() -> None:
    for bad in ("lots", "1.5"):
        with pytest.raises(SystemExit):
            cli._parser().parse_args(["--min-free-bytes", bad])
    assert cli._parser().parse_args([]).min_free_bytes == probes.MIN_FREE_BYTES


# -- the free-space floor ------------------------------------------------------------


def test_not_ready_below_the_free_space_floor(
    tmp_path: Path, runtime: drt.DatasetRuntime, caches: tuple[Path, ...]
) -> None:
    catalog = make_catalog(tmp_path, runtime, caches=caches)
    problem = readiness(catalog, catalog.state_dir, int(HUGE_FLOOR))()
    assert problem is not None
    assert problem.startswith("the state volume has "), problem
    assert " bytes free " in problem, problem
    assert f"below --min-free-bytes {HUGE_FLOOR}" in problem, problem
    assert readiness(catalog, catalog.state_dir, 0)() is None
    assert readiness(catalog, catalog.state_dir, 1)() is None


@pytest.mark.parametrize(("floor", "ready"), [(HUGE_FLOOR, False), (NO_FLOOR, True)])
def test_readyz_answers_the_floor_of_the_cli(
    tmp_path: Path, caches: tuple[Path, ...], floor: str, ready: bool
) -> None:
    with cli_probes(tmp_path, caches, "--min-free-bytes", floor) as side:
        status, text = get(side.url + "/readyz")
        assert get(side.url + "/healthz") == (200, "ok\n")  # alive, whatever the disk
    if ready:
        assert (status, text) == (200, "ready\n")
    else:
        assert status == 503
        assert text.startswith("not ready: the state volume has "), text
        assert "--min-free-bytes" in text
