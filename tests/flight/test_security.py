"""Bearer tokens, roles, TLS, and the CLI's loopback default.

With a token file every RPC needs ``authorization: Bearer <token>`` (else
UNAUTHENTICATED); read tokens may read, only admin tokens may ``do_put`` and
``set_epoch_len`` (else UNAUTHORIZED), and a refused write changes nothing. TLS is
tested with a self-signed certificate for 127.0.0.1 made by the ``openssl`` CLI.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest
from conftest import ListSource, make_records

import dataset_rt as drt
from flight_client import DatasetClient, EveryLocationFailedError
from flight_server import Catalog, DatasetFlightServer
from flight_server.auth import TokenFile

from .conftest import DATASET, command, make_catalog, serve, ticket
from .test_server_cli import ServerProcess

READ_TOKEN = "read-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-fedcba9876543210"
TOKEN_FILE = f"""# tokens for the tests
read {READ_TOKEN}

admin {ADMIN_TOKEN}   # the operator
"""
CALL_TIMEOUT = 20.0


def call_options(header: str | None) -> flight.FlightCallOptions:
    headers = [] if header is None else [(b"authorization", header.encode())]
    return flight.FlightCallOptions(headers=headers, timeout=CALL_TIMEOUT)


READ = call_options(f"Bearer {READ_TOKEN}")
ADMIN = call_options(f"Bearer {ADMIN_TOKEN}")


def write_tokens(directory: Path) -> Path:
    path = directory / "tokens.txt"
    path.write_text(TOKEN_FILE)
    return path


def put(
    client: flight.FlightClient, table: pa.Table, options: flight.FlightCallOptions
) -> dict[str, Any]:
    """A whole ``do_put`` (a refusal may surface at any step, at the latest on close)."""
    writer, reader = client.do_put(command({"dataset": DATASET}), table.schema, options=options)
    try:
        writer.write_table(table)
        writer.done_writing()
        answer = reader.read()
    finally:
        writer.close()
    assert answer is not None, "do_put answered no PutResult"
    return dict(json.loads(answer.to_pybytes()))


def action(
    client: flight.FlightClient, kind: str, body: Any, options: flight.FlightCallOptions
) -> Any:
    payload = b"" if body is None else json.dumps(body).encode()
    results = list(client.do_action(flight.Action(kind, payload), options=options))
    assert len(results) == 1, results
    return json.loads(results[0].body.to_pybytes())


STREAM = {"dataset": DATASET, "seed": 3, "epoch": 0}


def edited_table(client: flight.FlightClient) -> pa.Table:
    """A table an admin may put: the metadata with every weight doubled."""
    table = client.do_get(ticket({"dataset": DATASET, "metadata": True}), ADMIN).read_all()
    index = table.schema.get_field_index("weight")
    return table.set_column(index, "weight", pc.multiply(table["weight"], 2.0))


# Every RPC, as a call that reads its whole answer.
RPCS: dict[str, Callable[[flight.FlightClient, flight.FlightCallOptions], Any]] = {
    "list_flights": lambda c, o: list(c.list_flights(options=o)),
    "get_flight_info(path)": lambda c, o: c.get_flight_info(
        flight.FlightDescriptor.for_path(DATASET), o
    ),
    "get_flight_info(command)": lambda c, o: c.get_flight_info(command(STREAM), o),
    "do_get(stream)": lambda c, o: c.do_get(ticket(STREAM), o).read_all(),
    "do_get(metadata)": lambda c, o: c.do_get(
        ticket({"dataset": DATASET, "metadata": True}), o
    ).read_all(),
    "do_put": lambda c, o: put(c, edited_table(c), o),
    "do_action(health)": lambda c, o: action(c, "health", None, o),
    "do_action(stats)": lambda c, o: action(c, "stats", None, o),
    "do_action(list_populations)": lambda c, o: action(
        c, "list_populations", {"dataset": DATASET}, o
    ),
    "do_action(set_epoch_len)": lambda c, o: action(
        c, "set_epoch_len", {"dataset": DATASET, "epoch_len": 17}, o
    ),
    "list_actions": lambda c, o: c.list_actions(options=o),
}
READ_RPCS = [name for name in RPCS if name not in ("do_put", "do_action(set_epoch_len)")]

BAD_HEADERS = {
    "no header": None,
    "unknown token": "Bearer not-a-known-token-0123456789",
    "admin token minus a character": f"Bearer {ADMIN_TOKEN[:-1]}",
    "admin token plus a character": f"Bearer {ADMIN_TOKEN}x",
    "wrong scheme": f"Basic {ADMIN_TOKEN}",
    "no scheme": ADMIN_TOKEN,
    "empty bearer": "Bearer ",
}


@pytest.fixture(scope="module")
def secured_module(
    tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime
) -> Iterator[DatasetFlightServer]:
    """One token-protected server for the read-only matrix (nothing here may write)."""
    root = tmp_path_factory.mktemp("secured")
    catalog = make_catalog(root, runtime)
    with serve(catalog, tokens=TokenFile.load(write_tokens(root))) as server:
        yield server


@pytest.fixture
def secured(tmp_path: Path, runtime: drt.DatasetRuntime) -> Iterator[DatasetFlightServer]:
    """A token-protected server of its own, for tests that write or try to."""
    catalog = make_catalog(tmp_path, runtime)
    with serve(catalog, tokens=TokenFile.load(write_tokens(tmp_path))) as server:
        yield server


def snapshot(client: flight.FlightClient, state_dir: Path) -> dict[str, Any]:
    """Everything a write could change: active population, store files, a stream."""
    stream = client.do_get(ticket(STREAM), ADMIN).read_all()
    return {
        "populations": action(client, "list_populations", {"dataset": DATASET}, ADMIN),
        "files": {
            str(p.relative_to(state_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(state_dir.rglob("*"))
            if p.is_file()
        },
        "stream": stream.select(["position", "cache_id", "sample_id"]).to_pylist(),
    }


# -- authentication ------------------------------------------------------------------


@pytest.mark.parametrize("header", list(BAD_HEADERS))
@pytest.mark.parametrize("rpc", list(RPCS))
def test_every_rpc_without_a_valid_token_is_unauthenticated(
    secured_module: DatasetFlightServer, rpc: str, header: str
) -> None:
    with flight.connect(secured_module.location) as client:
        if rpc == "do_put":
            table = edited_table(client)
            with pytest.raises(flight.FlightUnauthenticatedError, match="Bearer"):
                put(client, table, call_options(BAD_HEADERS[header]))
        else:
            with pytest.raises(flight.FlightUnauthenticatedError, match="Bearer"):
                RPCS[rpc](client, call_options(BAD_HEADERS[header]))


@pytest.mark.parametrize("rpc", READ_RPCS)
def test_a_read_token_may_read(secured_module: DatasetFlightServer, rpc: str) -> None:
    with flight.connect(secured_module.location) as client:
        answer = RPCS[rpc](client, READ)
    assert answer is not None
    if rpc == "do_get(stream)":
        assert answer.num_rows > 0
    if rpc == "do_action(health)":
        assert answer["datasets"] == [DATASET]
    if rpc == "list_actions":
        assert {a.type for a in answer} >= {"set_epoch_len", "list_populations", "health", "stats"}


def test_a_read_token_may_not_write_and_nothing_changes(
    secured: DatasetFlightServer, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    with flight.connect(secured.location) as client:
        before = snapshot(client, state_dir)
        table = edited_table(client)
        with pytest.raises(flight.FlightUnauthorizedError, match="do_put needs an admin token"):
            put(client, table, READ)
        with pytest.raises(flight.FlightUnauthorizedError, match="set_epoch_len needs an admin"):
            action(client, "set_epoch_len", {"dataset": DATASET, "epoch_len": 17}, READ)
        removal = {"dataset": DATASET, "population": active_population(client)}
        with pytest.raises(flight.FlightUnauthorizedError, match="remove_population needs an"):
            action(client, "remove_population", removal, READ)
        for header in BAD_HEADERS.values():
            with pytest.raises(flight.FlightUnauthenticatedError):
                put(client, table, call_options(header))
        after = snapshot(client, state_dir)
    assert after == before


def active_population(client: flight.FlightClient) -> str:
    answer = action(client, "list_populations", {"dataset": DATASET}, ADMIN)
    return str(answer["active"]["population"])


def test_an_admin_token_may_write(secured: DatasetFlightServer) -> None:
    with flight.connect(secured.location) as client:
        table = edited_table(client)
        answer = put(client, table, ADMIN)
        assert re.fullmatch(r"[0-9a-f]{32}", answer["population"]), answer
        assert answer["rows"] == table.num_rows
        assert action(client, "set_epoch_len", {"dataset": DATASET, "epoch_len": 17}, ADMIN) == {
            "dataset": DATASET,
            "epoch_len": 17,
        }
        active = action(client, "list_populations", {"dataset": DATASET}, READ)["active"]
        assert active == {"population": answer["population"], "epoch_len": 17, "rows": 300}
        info = client.get_flight_info(command(STREAM), READ)
        assert info.total_records == 17
        assert client.do_get(info.endpoints[0].ticket, READ).read_all().num_rows == 17


def test_the_client_sends_its_token_and_does_not_retry_auth_errors(
    secured: DatasetFlightServer,
) -> None:
    with DatasetClient(secured.location, token=READ_TOKEN) as reader:
        assert reader.datasets() == [DATASET]
        assert len(list(reader.epoch(DATASET, 3, 0))) == 300
        table = reader.get_metadata(DATASET)
        with pytest.raises(flight.FlightUnauthorizedError):
            reader.update_metadata(DATASET, table)
        with pytest.raises(flight.FlightUnauthorizedError):
            reader.set_epoch_len(DATASET, 5)
    started = time.monotonic()
    with DatasetClient(secured.location, retries=3, backoff=2.0) as anonymous:
        with pytest.raises(flight.FlightUnauthenticatedError):
            anonymous.datasets()
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(anonymous.epoch(DATASET, 3, 0))
    assert time.monotonic() - started < 2.0  # final statuses: no backoff sleep
    with DatasetClient(secured.location, token=ADMIN_TOKEN) as admin:
        first = admin.populations(DATASET)["active"]["population"]
        population = admin.update_metadata(DATASET, table.head(50))
        assert admin.populations(DATASET)["active"]["population"] == population
        assert admin.set_epoch_len(DATASET, 5) == 5
        admin.remove_population(DATASET, first)
        assert admin.populations(DATASET)["populations"] == [population]


# -- the token file ------------------------------------------------------------------


def test_token_file_roles(tmp_path: Path) -> None:
    tokens = TokenFile.load(write_tokens(tmp_path))
    assert tokens.role_of(READ_TOKEN) == "read"
    assert tokens.role_of(ADMIN_TOKEN) == "admin"
    assert tokens.role_of(ADMIN_TOKEN[:-1]) is None
    assert tokens.role_of("") is None


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("reader 0123456789abcdef\n", 1),
        ("read 0123456789abcdef\nadmin short\n", 2),
        ("# comment\n\nadmin 0123456789abcdef name extra\n", 3),
        ("admin\n", 1),
        ("read 0123456789abcdef\n0123456789abcdef\n", 2),
        ("ADMIN 0123456789abcdef\n", 1),
        ("admin 0123456789abcde\n", 1),  # 15 characters
    ],
)
def test_malformed_token_files_name_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line}:")):
        TokenFile.load(path)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_a_token_file_without_tokens_is_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        TokenFile.load(path)


# -- TLS -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """A self-signed certificate and key for localhost / 127.0.0.1 (PEM)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl CLI is not installed")
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert.read_bytes(), key.read_bytes()


def samples(client: DatasetClient) -> list[tuple[Any, ...]]:
    return [
        (s.position, s.cache_id, s.sample_id, s.payload, s.metadata)
        for s in client.epoch(DATASET, 5, 1, columns=["label", "name"])
    ]


def test_tls_streams_the_same_epoch_as_plain(
    tmp_path: Path, runtime: drt.DatasetRuntime, certificate: tuple[bytes, bytes]
) -> None:
    catalog: Catalog = make_catalog(tmp_path, runtime)
    with (
        serve(catalog) as plain,
        serve(catalog, "grpc+tls://127.0.0.1:0", tls_certificates=[certificate]) as tls,
    ):
        assert re.fullmatch(r"grpc\+tls://127\.0\.0\.1:\d+", tls.location), tls.location
        with DatasetClient(plain.location) as client:
            expected = samples(client)
        with DatasetClient(tls.location, tls_root_certs=certificate[0]) as client:
            assert client.datasets() == [DATASET]
            assert samples(client) == expected
    assert len(expected) == 300


def test_tls_refuses_a_client_that_does_not_trust_the_certificate(
    tmp_path: Path, runtime: drt.DatasetRuntime, certificate: tuple[bytes, bytes]
) -> None:
    catalog = make_catalog(tmp_path, runtime)
    with serve(catalog, "grpc+tls://127.0.0.1:0", tls_certificates=[certificate]) as tls:
        started = time.monotonic()
        with flight.connect(tls.location) as untrusting:
            with pytest.raises(flight.FlightUnavailableError):
                list(untrusting.list_flights(options=call_options(None)))
            with pytest.raises(flight.FlightUnavailableError):
                untrusting.do_get(ticket(STREAM), call_options(None)).read_all()
        with (
            DatasetClient(tls.location, retries=1, backoff=0.01) as friendly,
            pytest.raises(EveryLocationFailedError, match="certificate"),
        ):
            list(friendly.epoch(DATASET, 5, 0))
        assert time.monotonic() - started < 30.0


def test_tls_and_tokens_together(
    tmp_path: Path, runtime: drt.DatasetRuntime, certificate: tuple[bytes, bytes]
) -> None:
    catalog = make_catalog(tmp_path, runtime)
    tokens = TokenFile.load(write_tokens(tmp_path))
    with serve(
        catalog, "grpc+tls://127.0.0.1:0", tls_certificates=[certificate], tokens=tokens
    ) as server:
        with flight.connect(server.location, tls_root_certs=certificate[0]) as client:
            with pytest.raises(flight.FlightUnauthenticatedError):
                list(client.list_flights(options=call_options(None)))
            table = edited_table(client)
            with pytest.raises(flight.FlightUnauthorizedError):
                put(client, table, READ)
            assert put(client, table, ADMIN)["rows"] == 300
        with DatasetClient(server.location, READ_TOKEN, certificate[0]) as reader:
            assert len(list(reader.epoch(DATASET, 5, 0))) == 300


# -- the command line's defaults ---------------------------------------------------------


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory, runtime: drt.DatasetRuntime) -> Path:
    root = tmp_path_factory.mktemp("cli-cache")
    config = drt.WriterConfig(show_progress=False)
    (result,) = runtime.write_cache(
        ListSource("small", make_records(20)), root, writer_config=config
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def test_cli_without_tokens_binds_loopback_and_says_so(tmp_path: Path, small_cache: Path) -> None:
    args = ["--port", "0", "--data-dir", str(tmp_path), "--dataset", f"toy={small_cache}"]
    with ServerProcess(args) as server:
        location = server.location()
        assert re.fullmatch(r"grpc://127\.0\.0\.1:\d+", location), location
        assert "loopback" in server.output()
        with flight.connect(location) as client:
            assert len(list(client.list_flights(options=call_options(None)))) == 1
        assert server.stop() == 0, server.output()
    assert not any("WARNING" in line for line in server.stderr), server.output()


def test_cli_public_host_without_tokens_warns(tmp_path: Path, small_cache: Path) -> None:
    args = [
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path),
        "--dataset",
        f"toy={small_cache}",
    ]
    with ServerProcess(args) as server:
        warning = server.wait_for_line(r"WARNING", stream="stderr", timeout=60)
        assert "0.0.0.0" in warning.string
        assert "--token-file" in warning.string
        server.location()  # it does start: the warning is advice, not a refusal
        assert server.stop() == 0, server.output()


def test_cli_token_file_protects_every_call(tmp_path: Path, small_cache: Path) -> None:
    args = [
        "--port",
        "0",
        "--data-dir",
        str(tmp_path),
        "--dataset",
        f"toy={small_cache}",
        "--token-file",
        str(write_tokens(tmp_path)),
    ]
    with ServerProcess(args) as server:
        location = server.location()
        assert "bearer tokens" in server.output()
        with flight.connect(location) as client:
            with pytest.raises(flight.FlightUnauthenticatedError):
                list(client.list_flights(options=call_options(None)))
            assert len(list(client.list_flights(options=READ))) == 1
        assert server.stop() == 0, server.output()
