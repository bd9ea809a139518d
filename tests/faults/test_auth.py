"""Issue 22, findings 2 and 6: who a client is, and failed logins in the metrics.

Finding 2: the per-client stream limit was keyed on the raw ``authorization``
header, so re-spelling one token (``bearer``, ``BEARER``, extra spaces) gave it
a fresh quota. A client is now its token's name (from the token file, or a
default derived from the token), however the header spells it.

Finding 6: a call refused for its token failed in the middleware, before any
handler, and no metric counted it. It is now counted as
``datasetrt_requests_total{method, status="UNAUTHENTICATED"}`` and logged,
never with the offered token.

Every stream opened here is held idle (one batch read) and cancelled before the
server shuts down; every loop is bounded in count, every wait in time.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest
from flight.conftest import DATASET, build_caches, make_catalog, message, serve, ticket
from prometheus_client.parser import text_string_to_metric_families

import dataset_rt as drt
from flight_server import Catalog, DatasetFlightServer
from flight_server.auth import TokenFile
from flight_server.limits import Limits

WAIT = 30.0  # the most any one call or wait below may take
LONG = {"dataset": DATASET, "seed": 7, "epoch": 0, "epoch_len": 10**7}  # never read to the end

READ_TOKEN = "read-token-0123456789abcdef"
OTHER_TOKEN = "other-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-fedcba9876543210"
TOKEN_FILE = f"""# one name per token
read {READ_TOKEN} trainer-1
read {OTHER_TOKEN}  trainer-2   # two readers
admin {ADMIN_TOKEN}
"""
#: One token, every spelling of the header that names it.
SPELLINGS = [
    f"Bearer {READ_TOKEN}",
    f"bearer {READ_TOKEN}",
    f"BEARER {READ_TOKEN}",
    f"Bearer   {READ_TOKEN}  ",
]


def options(header: str | None) -> flight.FlightCallOptions:
    headers = [] if header is None else [(b"authorization", header.encode())]
    return flight.FlightCallOptions(headers=headers, timeout=WAIT)


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Any:
    return build_caches(tmp_path_factory.mktemp("auth-caches"), runtime)


@pytest.fixture
def catalog(tmp_path: Path, runtime: drt.DatasetRuntime, caches: Any) -> Catalog:
    return make_catalog(tmp_path, runtime, caches=caches)


@pytest.fixture
def tokens(tmp_path: Path) -> TokenFile:
    path = tmp_path / "tokens.txt"
    path.write_text(TOKEN_FILE)
    return TokenFile.load(path)


class IdleStreams:
    """Streams opened and left idle after their first batch; all cancelled (and
    their connections closed) on exit, before the server shuts down."""

    def __init__(self, location: str) -> None:
        self._location = location
        self._clients: list[flight.FlightClient] = []
        self._readers: list[flight.FlightStreamReader] = []

    def open(self, header: str) -> None:
        """One more stream with ``header`` on a connection of its own."""
        client = flight.connect(self._location)
        self._clients.append(client)
        reader = client.do_get(ticket(LONG), options=options(header))
        assert reader.read_chunk().data.num_rows > 0
        self._readers.append(reader)

    def __enter__(self) -> IdleStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        for reader in self._readers:
            reader.cancel()
        for client in self._clients:
            client.close()


def refused(streams: IdleStreams, header: str) -> str:
    """The message of the UNAVAILABLE that a new stream with ``header`` gets."""
    with pytest.raises(flight.FlightUnavailableError) as error:
        streams.open(header)
    return message(error.value)


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {WAIT} s waiting for {what}"
        time.sleep(0.05)


# -- finding 2: one token, one quota -------------------------------------------------


def test_every_spelling_of_one_token_shares_its_stream_quota(
    catalog: Catalog, tokens: TokenFile
) -> None:
    limits = Limits(max_streams=16, max_streams_per_client=3, stream_idle_timeout=60)
    with (
        serve(catalog, tokens=tokens, limits=limits) as server,
        IdleStreams(server.location) as streams,
    ):
        for header in SPELLINGS[:3]:
            streams.open(header)
        for header in SPELLINGS:  # the quota is the token's, whichever spelling asks
            assert "--max-streams-per-client 3" in refused(streams, header)
        assert server.streams.counts()["open"] == 3
        streams.open(f"Bearer {ADMIN_TOKEN}")  # another token is another client
        assert server.streams.counts()["open"] == 4


def test_two_tokens_have_quotas_of_their_own(catalog: Catalog, tokens: TokenFile) -> None:
    limits = Limits(max_streams=16, max_streams_per_client=2, stream_idle_timeout=60)
    with (
        serve(catalog, tokens=tokens, limits=limits) as server,
        IdleStreams(server.location) as streams,
    ):
        for token in (READ_TOKEN, OTHER_TOKEN):
            streams.open(f"Bearer {token}")
            streams.open(f"bearer  {token}")
            assert "--max-streams-per-client 2" in refused(streams, f"BEARER {token}")
        assert server.streams.counts()["open"] == 4


# -- finding 2: the names of the token file ------------------------------------------


def test_a_token_is_identified_by_its_name(tokens: TokenFile) -> None:
    identity = tokens.identify(READ_TOKEN)
    assert identity is not None
    assert (identity.role, identity.name) == ("read", "trainer-1")
    assert tokens.identify(READ_TOKEN[:-1]) is None
    assert tokens.role_of(OTHER_TOKEN) == "read"  # role_of stays
    assert tokens.role_of(ADMIN_TOKEN) == "admin"


def test_a_token_without_a_name_gets_a_stable_name_that_hides_it(
    tokens: TokenFile, tmp_path: Path
) -> None:
    identity = tokens.identify(ADMIN_TOKEN)
    assert identity is not None
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
    assert identity.name == f"admin-{digest[:12]}"
    assert ADMIN_TOKEN not in identity.name
    assert "fedcba" not in identity.name
    # Stable: another load of another file with the line elsewhere, and a
    # TokenFile built in code, name it alike.
    path = tmp_path / "reordered.txt"
    path.write_text(f"admin {ADMIN_TOKEN}\nread {READ_TOKEN}\n")
    again = TokenFile.load(path).identify(ADMIN_TOKEN)
    built = TokenFile(((ADMIN_TOKEN, "admin"),)).identify(ADMIN_TOKEN)
    assert again is not None
    assert built is not None
    assert again.name == built.name == identity.name


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        (
            f"read {READ_TOKEN} trainer\n# a comment\nadmin {ADMIN_TOKEN} trainer\n",
            3,
            "'trainer' is already the name of the token on line 1",
        ),
        # An explicit name that is another line's default name.
        (
            f"read {READ_TOKEN}\n"
            f"admin {ADMIN_TOKEN} read-{hashlib.sha256(READ_TOKEN.encode()).hexdigest()[:12]}\n",
            2,
            "already the name of the token on line 1",
        ),
        (f"read {READ_TOKEN} trainer:1\n", 1, "not plain"),
        (f"read {READ_TOKEN} {'n' * 65}\n", 1, "not plain"),
        (f"read {READ_TOKEN} one\nadmin {READ_TOKEN} two\n", 2, "already on line 1"),
        (f"read {READ_TOKEN} a name\n", 1, "[name]"),
    ],
    ids=[
        "duplicate name",
        "another's default name",
        "not plain",
        "too long",
        "one token twice",
        "four fields",
    ],
)
def test_a_bad_token_name_is_refused_with_its_line(
    tmp_path: Path, text: str, line: int, says: str
) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line}:")) as error:
        TokenFile.load(path)
    assert says in str(error.value)
    assert READ_TOKEN not in str(error.value)  # the message names the line, not the secret


def test_names_given_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="one name"):
        TokenFile(((READ_TOKEN, "read"), (ADMIN_TOKEN, "admin")), ("same", "same"))


# -- finding 6: failed logins are counted --------------------------------------------

#: Calls a token guesser might make, each with a header that fails.
BAD_CALLS = {
    "list_flights": lambda c, o: list(c.list_flights(options=o)),
    "get_flight_info": lambda c, o: c.get_flight_info(flight.FlightDescriptor.for_path(DATASET), o),
    "do_get": lambda c, o: c.do_get(ticket(LONG), o).read_all(),
    "do_action": lambda c, o: list(c.do_action(flight.Action("health", b""), o)),
    "list_actions": lambda c, o: c.list_actions(options=o),
}
BAD_HEADERS = [
    None,
    f"Bearer {ADMIN_TOKEN[:-1]}",
    f"Basic {ADMIN_TOKEN}",
    f"bearer {READ_TOKEN}x",
]


def samples(server: DatasetFlightServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's metrics exposition as {(sample name, sorted labels): value}."""
    text = server.metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def requests(server: DatasetFlightServer, method: str, status: str) -> float:
    key = ("datasetrt_requests_total", (("method", method), ("status", status)))
    return samples(server).get(key, 0.0)


def test_failed_logins_are_counted_and_logged_without_the_token(
    catalog: Catalog, tokens: TokenFile, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="flight_server.requests"),
        serve(catalog, tokens=tokens) as server,
        flight.connect(server.location) as client,
    ):
        for call in BAD_CALLS.values():
            for header in BAD_HEADERS:
                with pytest.raises(flight.FlightUnauthenticatedError):
                    call(client, options(header))
        # A read token calling an admin action: UNAUTHORIZED, counted too.
        admin_only = flight.Action("set_epoch_len", b'{"dataset": "toy", "epoch_len": 5}')
        with pytest.raises(flight.FlightUnauthorizedError):
            list(client.do_action(admin_only, options(SPELLINGS[1])))
        for method in BAD_CALLS:
            assert requests(server, method, "UNAUTHENTICATED") == len(BAD_HEADERS), method
        assert requests(server, "do_action", "PERMISSION_DENIED") == 1
        exposition = server.metrics.exposition().decode()
    secrets = (READ_TOKEN, OTHER_TOKEN, ADMIN_TOKEN, ADMIN_TOKEN[:-1], READ_TOKEN[:-1])
    for (_, labels), _ in samples(server).items():
        for _, label in labels:
            assert not any(secret in label for secret in secrets), label
    assert not any(secret in exposition for secret in secrets)
    lines = [
        r for r in caplog.records if getattr(r, "request", {}).get("status") == "UNAUTHENTICATED"
    ]
    assert len(lines) == len(BAD_CALLS) * len(BAD_HEADERS)
    assert {line.levelno for line in lines} <= {logging.INFO, logging.WARNING}
    for line in caplog.records:
        assert not any(secret in line.getMessage() for secret in secrets), line.getMessage()
        assert not any(secret in str(getattr(line, "request", "")) for secret in secrets)
    reasons = {line.request["reason"] for line in lines}  # type: ignore[attr-defined]
    assert reasons == {
        "no authorization header",
        "not a Bearer authorization header",
        "unknown token",
    }


def test_a_refused_stream_call_is_counted_once(catalog: Catalog, tokens: TokenFile) -> None:
    """A do_get refused at login never opens a stream: the open gauge stays 0
    and the stream's own end is not counted a second time."""
    with serve(catalog, tokens=tokens) as server, flight.connect(server.location) as client:
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(ticket(LONG), options(f"Bearer {ADMIN_TOKEN}!")).read_all()
        wait_until(lambda: requests(server, "do_get", "UNAUTHENTICATED") >= 1, "the count")
        got = samples(server)
    do_gets = sum(
        v
        for (name, labels), v in got.items()
        if name == "datasetrt_requests_total" and ("method", "do_get") in labels
    )
    assert do_gets == 1
    assert got[("datasetrt_streams_open", (("dataset", DATASET),))] == 0
