"""Every bad request gets the right Flight status, a message naming the fault, and
changes nothing: the server keeps serving and the active population stays.

INVALID_ARGUMENT arrives as ``pyarrow.ArrowInvalid``, NOT_FOUND as
``pyarrow.ArrowKeyError`` (see flight_server/errors.py).
"""

from __future__ import annotations

import contextlib
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from polars.testing import assert_frame_equal

from .conftest import (
    DATASET,
    ROWS,
    act,
    active,
    command,
    ids,
    message,
    metadata,
    populations,
    put,
    stream,
    ticket,
)

BASE: dict[str, Any] = {"dataset": DATASET, "seed": 1, "epoch": 0}
HEX = "0123456789abcdef" * 2  # a well-formed population id that is not stored
OVERSIZED = 64 * 1024 + 1


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BASE.items() if k != key}


# (id, body, status, fragments the message must contain) — for commands and tickets.
BAD_STREAM_REQUESTS: list[tuple[str, Any, type[Exception], tuple[str, ...]]] = [
    ("malformed-json", b'{"dataset": "toy",', pa.ArrowInvalid, ("JSON",)),
    ("not-utf8", b"\xff\xfe{}", pa.ArrowInvalid, ("UTF-8",)),
    ("empty-bytes", b"", pa.ArrowInvalid, ("JSON",)),
    ("json-list", [BASE], pa.ArrowInvalid, ("JSON object", "list")),
    ("json-string", "toy", pa.ArrowInvalid, ("JSON object", "str")),
    ("json-null", None, pa.ArrowInvalid, ("JSON object",)),
    ("json-number", 7, pa.ArrowInvalid, ("JSON object", "int")),
    ("unknown-key", BASE | {"sead": 1}, pa.ArrowInvalid, ("'sead'",)),
    ("unknown-key-case", BASE | {"Seed": 1}, pa.ArrowInvalid, ("'Seed'",)),
    ("missing-dataset", without("dataset"), pa.ArrowInvalid, ("'dataset'",)),
    ("missing-seed", without("seed"), pa.ArrowInvalid, ("'seed'",)),
    ("missing-epoch", without("epoch"), pa.ArrowInvalid, ("'epoch'",)),
    ("string-seed", BASE | {"seed": "1"}, pa.ArrowInvalid, ("'seed'",)),
    ("float-seed", BASE | {"seed": 1.0}, pa.ArrowInvalid, ("'seed'",)),
    ("negative-seed", BASE | {"seed": -1}, pa.ArrowInvalid, ("'seed'",)),
    ("seed-past-u64", BASE | {"seed": 2**64}, pa.ArrowInvalid, ("'seed'",)),
    ("float-epoch", BASE | {"epoch": 1.5}, pa.ArrowInvalid, ("'epoch'",)),
    ("integral-float-epoch", BASE | {"epoch": 2.0}, pa.ArrowInvalid, ("'epoch'",)),
    ("bool-epoch", BASE | {"epoch": True}, pa.ArrowInvalid, ("'epoch'",)),
    ("negative-epoch", BASE | {"epoch": -1}, pa.ArrowInvalid, ("'epoch'",)),
    ("epoch-past-u64", BASE | {"epoch": 2**64}, pa.ArrowInvalid, ("'epoch'",)),
    ("epoch-past-stream-end", BASE | {"epoch": 2**62, "epoch_len": 8}, pa.ArrowInvalid, ("epoch",)),
    ("string-epoch-len", BASE | {"epoch_len": "10"}, pa.ArrowInvalid, ("'epoch_len'",)),
    ("zero-epoch-len", BASE | {"epoch_len": 0}, pa.ArrowInvalid, ("'epoch_len'",)),
    ("negative-epoch-len", BASE | {"epoch_len": -5}, pa.ArrowInvalid, ("'epoch_len'",)),
    ("string-shuffle", BASE | {"shuffle": "yes"}, pa.ArrowInvalid, ("'shuffle'",)),
    ("int-shuffle", BASE | {"shuffle": 1}, pa.ArrowInvalid, ("'shuffle'",)),
    ("bool-world-size", BASE | {"world_size": True}, pa.ArrowInvalid, ("'world_size'",)),
    ("string-world-size", BASE | {"world_size": "2"}, pa.ArrowInvalid, ("'world_size'",)),
    ("zero-world-size", BASE | {"world_size": 0}, pa.ArrowInvalid, ("'world_size'",)),
    ("negative-world-size", BASE | {"world_size": -2}, pa.ArrowInvalid, ("'world_size'",)),
    ("int-dataset", BASE | {"dataset": 5}, pa.ArrowInvalid, ("'dataset'",)),
    ("null-dataset", BASE | {"dataset": None}, pa.ArrowInvalid, ("'dataset'",)),
    ("null-seed", BASE | {"seed": None}, pa.ArrowInvalid, ("'seed'",)),
    ("int-population", BASE | {"population": 7}, pa.ArrowInvalid, ("'population'",)),
    ("string-columns", BASE | {"columns": "label"}, pa.ArrowInvalid, ("'columns'",)),
    ("int-in-columns", BASE | {"columns": ["label", 1]}, pa.ArrowInvalid, ("'columns'",)),
    (
        "malformed-population",
        BASE | {"population": "../../etc/passwd"},
        pa.ArrowInvalid,
        ("population", "../../etc/passwd"),
    ),
    (
        "uppercase-population",
        BASE | {"population": HEX.upper()},
        pa.ArrowInvalid,
        ("population", HEX.upper()),
    ),
    ("short-population", BASE | {"population": "abc"}, pa.ArrowInvalid, ("population", "abc")),
    ("unknown-column", BASE | {"columns": ["label", "nope"]}, pa.ArrowInvalid, ("'nope'",)),
    ("duplicate-column", BASE | {"columns": ["label", "label"]}, pa.ArrowInvalid, ("'label'",)),
    ("base-column", BASE | {"columns": ["cache_id"]}, pa.ArrowInvalid, ("'cache_id'",)),
    ("empty-column-name", BASE | {"columns": [""]}, pa.ArrowInvalid, ("''",)),
    ("unknown-dataset", BASE | {"dataset": "nope"}, pa.ArrowKeyError, ("'nope'",)),
    ("unknown-population", BASE | {"population": HEX}, pa.ArrowKeyError, (HEX,)),
    (
        "oversized",
        BASE | {"columns": ["x" * OVERSIZED]},
        pa.ArrowInvalid,
        ("bytes", str(64 * 1024)),
    ),
]

# Keys that only a ticket has (rank and offset): they are unknown in a command.
BAD_TICKETS: list[tuple[str, Any, type[Exception], tuple[str, ...]]] = [
    ("rank-equals-world-size", BASE | {"rank": 2, "world_size": 2}, pa.ArrowInvalid, ("'rank'",)),
    ("rank-past-world-size", BASE | {"rank": 5, "world_size": 2}, pa.ArrowInvalid, ("'rank'",)),
    ("rank-without-world-size", BASE | {"rank": 1}, pa.ArrowInvalid, ("'rank'",)),
    ("negative-rank", BASE | {"rank": -1}, pa.ArrowInvalid, ("'rank'",)),
    ("float-rank", BASE | {"rank": 0.0}, pa.ArrowInvalid, ("'rank'",)),
    ("string-offset", BASE | {"offset": "3"}, pa.ArrowInvalid, ("'offset'",)),
    ("negative-offset", BASE | {"offset": -1}, pa.ArrowInvalid, ("'offset'",)),
    ("bool-offset", BASE | {"offset": False}, pa.ArrowInvalid, ("'offset'",)),
    ("string-metadata", {"dataset": DATASET, "metadata": "yes"}, pa.ArrowInvalid, ("'metadata'",)),
    (
        "metadata-ticket-with-stream-key",
        {"dataset": DATASET, "metadata": True, "seed": 1},
        pa.ArrowInvalid,
        ("'seed'",),
    ),
    ("metadata-without-dataset", {"metadata": True}, pa.ArrowInvalid, ("'dataset'",)),
    (
        "metadata-unknown-dataset",
        {"dataset": "nope", "metadata": True},
        pa.ArrowKeyError,
        ("'nope'",),
    ),
    (
        "metadata-malformed-population",
        {"dataset": DATASET, "metadata": True, "population": "zz"},
        pa.ArrowInvalid,
        ("population", "zz"),
    ),
    (
        "metadata-unknown-population",
        {"dataset": DATASET, "metadata": True, "population": HEX},
        pa.ArrowKeyError,
        (HEX,),
    ),
]

COMMAND_ONLY: list[tuple[str, Any, type[Exception], tuple[str, ...]]] = [
    ("rank-in-command", BASE | {"rank": 0}, pa.ArrowInvalid, ("'rank'",)),
    ("offset-in-command", BASE | {"offset": 0}, pa.ArrowInvalid, ("'offset'",)),
    ("metadata-in-command", BASE | {"metadata": True}, pa.ArrowInvalid, ("'metadata'",)),
]


def cases(table: list[tuple[str, Any, type[Exception], tuple[str, ...]]]) -> Any:
    return [pytest.param(*case[1:], id=case[0]) for case in table]


@pytest.fixture
def before(raw: flight.FlightClient) -> dict[str, Any]:
    """The server's state before a bad request; afterwards it must be the same."""
    return {
        "active": active(raw),
        "populations": populations(raw),
        "metadata": metadata(raw),
    }


def assert_still_serving(raw: flight.FlightClient, state: dict[str, Any]) -> None:
    """The server answers, the active population and the store are unchanged."""
    assert act(raw, "health")["status"] == "ok"
    assert active(raw) == state["active"]
    assert populations(raw) == state["populations"]
    assert_frame_equal(metadata(raw), state["metadata"])
    table = stream(raw, BASE | {"epoch_len": 10})
    assert table.num_rows == 10


def assert_status(
    error: pytest.ExceptionInfo[BaseException],
    status: type[Exception],
    fragments: tuple[str, ...],
) -> None:
    assert error.type is status, f"{error.type.__name__} instead of {status.__name__}: {error}"
    text = message(error.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not named in: {text}"


# -- get_flight_info and do_get ---------------------------------------------------


@pytest.mark.parametrize(("body", "status", "fragments"), cases(BAD_STREAM_REQUESTS + COMMAND_ONLY))
def test_bad_command_is_rejected(
    raw: flight.FlightClient,
    before: dict[str, Any],
    body: Any,
    status: type[Exception],
    fragments: tuple[str, ...],
) -> None:
    with pytest.raises(Exception) as error:  # noqa: PT011 - the type is asserted below
        raw.get_flight_info(command(body))
    assert_status(error, status, fragments)
    assert_still_serving(raw, before)


@pytest.mark.parametrize(("body", "status", "fragments"), cases(BAD_STREAM_REQUESTS + BAD_TICKETS))
def test_bad_ticket_is_rejected(
    raw: flight.FlightClient,
    before: dict[str, Any],
    body: Any,
    status: type[Exception],
    fragments: tuple[str, ...],
) -> None:
    with pytest.raises(Exception) as error:  # noqa: PT011 - the type is asserted below
        stream(raw, body)
    assert_status(error, status, fragments)
    assert_still_serving(raw, before)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(BASE | {"epoch": 2**63}, id="epoch-2**63"),
        pytest.param(BASE | {"epoch": 2**64 - 1, "epoch_len": 1}, id="epoch-u64-max"),
        pytest.param(BASE | {"offset": 2**63}, id="offset-2**63"),
        pytest.param(BASE | {"rank": 2**32 - 1, "world_size": 2**32}, id="rank-2**32-1"),
        pytest.param(BASE | {"epoch_len": 2**63}, id="epoch-len-2**63"),
    ],
)
def test_huge_integers_are_served_or_rejected_as_invalid(
    raw: flight.FlightClient, before: dict[str, Any], body: dict[str, Any]
) -> None:
    """Integers the protocol accepts (up to 2**64 - 1) never become an internal error:
    the stream is served (possibly empty) or rejected with INVALID_ARGUMENT."""
    try:
        reader = raw.do_get(ticket(body))
        with contextlib.suppress(StopIteration):
            reader.read_chunk()
        reader.cancel()
    except pa.ArrowInvalid as error:
        assert_names_a_stream_key(message(error))
    except Exception as error:
        pytest.fail(f"{type(error).__name__} instead of a stream or ArrowInvalid: {error}")
    assert_still_serving(raw, before)


@pytest.mark.parametrize("epoch", [2**63, 2**64 - 1])
def test_huge_epoch_in_a_command_is_described_or_rejected_as_invalid(
    raw: flight.FlightClient, before: dict[str, Any], epoch: int
) -> None:
    try:
        info = raw.get_flight_info(command(BASE | {"epoch": epoch, "epoch_len": 1}))
    except pa.ArrowInvalid as error:
        assert_names_a_stream_key(message(error))
    except Exception as error:
        pytest.fail(f"{type(error).__name__} instead of a FlightInfo or ArrowInvalid: {error}")
    else:
        assert info.total_records == 1
    assert_still_serving(raw, before)


def assert_names_a_stream_key(text: str) -> None:
    assert any(key in text for key in ("epoch", "offset", "rank", "world_size")), text


def test_path_descriptor_must_name_one_dataset(
    raw: flight.FlightClient, before: dict[str, Any]
) -> None:
    with pytest.raises(pa.ArrowInvalid) as error:
        raw.get_flight_info(flight.FlightDescriptor.for_path(DATASET, "extra"))
    assert "[NAME]" in message(error.value)
    with pytest.raises(pa.ArrowKeyError) as missing:
        raw.get_flight_info(flight.FlightDescriptor.for_path("nope"))
    assert "'nope'" in message(missing.value)
    assert_still_serving(raw, before)


def test_rejections_do_not_disturb_a_good_request_between_them(
    raw: flight.FlightClient, before: dict[str, Any]
) -> None:
    """Bad and good requests interleaved: each good one gets the same answer."""
    good = BASE | {"epoch": 3, "epoch_len": 50}
    expected = ids(stream(raw, good))
    for body, _status, _fragments in (case[1:] for case in BAD_STREAM_REQUESTS[:12]):
        with pytest.raises((pa.ArrowInvalid, pa.ArrowKeyError)):
            stream(raw, body)
        assert ids(stream(raw, good)) == expected
    assert_still_serving(raw, before)


# -- actions ----------------------------------------------------------------------


BAD_ACTIONS: list[tuple[str, str, Any, type[Exception], tuple[str, ...]]] = [
    (
        "unknown-action",
        "drop_everything",
        {"dataset": DATASET},
        pa.ArrowInvalid,
        ("drop_everything",),
    ),
    ("set-epoch-len-no-body", "set_epoch_len", None, pa.ArrowInvalid, ("JSON",)),
    ("set-epoch-len-malformed", "set_epoch_len", b"{epoch_len: 3}", pa.ArrowInvalid, ("JSON",)),
    ("set-epoch-len-list", "set_epoch_len", [DATASET, 3], pa.ArrowInvalid, ("JSON object",)),
    (
        "set-epoch-len-missing",
        "set_epoch_len",
        {"dataset": DATASET},
        pa.ArrowInvalid,
        ("'epoch_len'",),
    ),
    (
        "set-epoch-len-no-dataset",
        "set_epoch_len",
        {"epoch_len": 3},
        pa.ArrowInvalid,
        ("'dataset'",),
    ),
    (
        "set-epoch-len-string",
        "set_epoch_len",
        {"dataset": DATASET, "epoch_len": "3"},
        pa.ArrowInvalid,
        ("'epoch_len'",),
    ),
    (
        "set-epoch-len-float",
        "set_epoch_len",
        {"dataset": DATASET, "epoch_len": 3.5},
        pa.ArrowInvalid,
        ("'epoch_len'",),
    ),
    (
        "set-epoch-len-zero",
        "set_epoch_len",
        {"dataset": DATASET, "epoch_len": 0},
        pa.ArrowInvalid,
        ("'epoch_len'",),
    ),
    (
        "set-epoch-len-negative",
        "set_epoch_len",
        {"dataset": DATASET, "epoch_len": -3},
        pa.ArrowInvalid,
        ("'epoch_len'",),
    ),
    (
        "set-epoch-len-unknown-key",
        "set_epoch_len",
        {"dataset": DATASET, "epoch_len": 3, "force": True},
        pa.ArrowInvalid,
        ("'force'",),
    ),
    (
        "set-epoch-len-unknown-dataset",
        "set_epoch_len",
        {"dataset": "nope", "epoch_len": 3},
        pa.ArrowKeyError,
        ("'nope'",),
    ),
    ("list-populations-no-dataset", "list_populations", {}, pa.ArrowInvalid, ("'dataset'",)),
    (
        "list-populations-int-dataset",
        "list_populations",
        {"dataset": 1},
        pa.ArrowInvalid,
        ("'dataset'",),
    ),
    (
        "list-populations-unknown-dataset",
        "list_populations",
        {"dataset": "nope"},
        pa.ArrowKeyError,
        ("'nope'",),
    ),
    (
        "list-populations-unknown-key",
        "list_populations",
        {"dataset": DATASET, "all": True},
        pa.ArrowInvalid,
        ("'all'",),
    ),
    (
        "oversized-action",
        "set_epoch_len",
        {"dataset": DATASET, "epoch_len": 3, "pad": "x" * OVERSIZED},
        pa.ArrowInvalid,
        ("bytes", str(64 * 1024)),
    ),
]


@pytest.mark.parametrize(
    ("kind", "body", "status", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_ACTIONS],
)
def test_bad_action_is_rejected(
    raw: flight.FlightClient,
    before: dict[str, Any],
    kind: str,
    body: Any,
    status: type[Exception],
    fragments: tuple[str, ...],
) -> None:
    with pytest.raises(Exception) as error:  # noqa: PT011 - the type is asserted below
        act(raw, kind, body)
    assert_status(error, status, fragments)
    assert_still_serving(raw, before)


def test_list_actions_describes_every_action(raw: flight.FlightClient) -> None:
    actions = {a.type: a.description for a in raw.list_actions()}
    assert set(actions) == {
        "set_epoch_len",
        "list_populations",
        "remove_population",
        "claim_run",
        "check_run",
        "health",
        "stats",
    }
    for kind, description in actions.items():
        assert description.strip(), f"action {kind} has no description"
    assert "epoch_len" in actions["set_epoch_len"]


# -- do_put -----------------------------------------------------------------------


def edit_row(table: pl.DataFrame, row: int, column: str, value: Any) -> pl.DataFrame:
    """``table`` with one cell changed (type kept)."""
    index = pl.int_range(pl.len())
    return table.with_columns(
        pl.when(index == row)
        .then(pl.lit(value))
        .otherwise(pl.col(column))
        .cast(table.schema[column])
        .alias(column)
    )


BAD_TABLES: list[tuple[str, Any, tuple[str, ...]]] = [
    (
        "nan-weight",
        lambda t: edit_row(t, 11, "weight", float("nan")),
        ("'weight'", "NaN", "row 11"),
    ),
    ("all-nan-weights", lambda t: t.with_columns(weight=float("nan")), ("'weight'", "NaN")),
    ("inf-weight", lambda t: edit_row(t, 2, "weight", float("inf")), ("'weight'", "row 2")),
    ("zero-weight", lambda t: edit_row(t, 4, "weight", 0.0), ("'weight'", "row 4")),
    ("negative-weight", lambda t: edit_row(t, 9, "weight", -1.0), ("'weight'", "row 9")),
    ("null-weight", lambda t: edit_row(t, 6, "weight", None), ("'weight'", "row 6")),
    ("missing-weight", lambda t: t.drop("weight"), ("'weight'",)),
    ("missing-stored-column", lambda t: t.drop("label"), ("'label'",)),
    ("missing-identity", lambda t: t.drop("sample_id"), ("'sample_id'",)),
    (
        "string-cache-id",
        lambda t: t.with_columns(pl.col("cache_id").cast(pl.Utf8)),
        ("'cache_id'",),
    ),
    ("int-score", lambda t: t.with_columns(pl.col("score").cast(pl.Int64)), ("'score'",)),
    ("string-weight", lambda t: t.with_columns(pl.col("weight").cast(pl.Utf8)), ("'weight'",)),
    ("unknown-sample-id", lambda t: edit_row(t, 7, "sample_id", 10**6), ("'sample_id'", "row 7")),
    ("unknown-cache-id", lambda t: edit_row(t, 3, "cache_id", 12345), ("'cache_id'", "row 3")),
    ("null-sample-id", lambda t: edit_row(t, 5, "sample_id", None), ("'sample_id'", "row 5")),
    ("changed-score", lambda t: edit_row(t, 5, "score", 1234.5), ("'score'", "row 5")),
    ("changed-label", lambda t: edit_row(t, 8, "label", 99), ("'label'", "row 8")),
    ("changed-name", lambda t: edit_row(t, 10, "name", "forged"), ("'name'", "row 10")),
    ("changed-flag", lambda t: t.with_columns(pl.col("flag").not_()), ("'flag'",)),
    ("empty-table", lambda t: t.head(0), ("empty",)),
]


@pytest.mark.parametrize(
    ("edit", "fragments"), [pytest.param(*case[1:], id=case[0]) for case in BAD_TABLES]
)
def test_bad_table_is_rejected_and_changes_nothing(
    raw: flight.FlightClient, before: dict[str, Any], edit: Any, fragments: tuple[str, ...]
) -> None:
    table = edit(before["metadata"])
    with pytest.raises(pa.ArrowInvalid) as error:
        put(raw, table)
    assert_status(error, pa.ArrowInvalid, fragments)
    assert_still_serving(raw, before)


def test_bad_table_with_activate_false_changes_nothing(
    raw: flight.FlightClient, before: dict[str, Any]
) -> None:
    table = edit_row(before["metadata"], 0, "weight", float("nan"))
    with pytest.raises(pa.ArrowInvalid):
        put(raw, table, activate=False)
    assert_still_serving(raw, before)


BAD_PUT_COMMANDS: list[tuple[str, Any, type[Exception], tuple[str, ...]]] = [
    ("malformed-json", b"{dataset", pa.ArrowInvalid, ("JSON",)),
    ("json-list", [DATASET], pa.ArrowInvalid, ("JSON object",)),
    ("missing-dataset", {"activate": True}, pa.ArrowInvalid, ("'dataset'",)),
    ("unknown-key", {"dataset": DATASET, "activte": False}, pa.ArrowInvalid, ("'activte'",)),
    ("string-activate", {"dataset": DATASET, "activate": "no"}, pa.ArrowInvalid, ("'activate'",)),
    ("int-activate", {"dataset": DATASET, "activate": 0}, pa.ArrowInvalid, ("'activate'",)),
    ("unknown-dataset", {"dataset": "nope"}, pa.ArrowKeyError, ("'nope'",)),
    (
        "oversized",
        {"dataset": DATASET, "pad": "x" * OVERSIZED},
        pa.ArrowInvalid,
        ("bytes", str(64 * 1024)),
    ),
]


@pytest.mark.parametrize(("body", "status", "fragments"), cases(BAD_PUT_COMMANDS))
def test_bad_put_command_is_rejected(
    raw: flight.FlightClient,
    before: dict[str, Any],
    body: Any,
    status: type[Exception],
    fragments: tuple[str, ...],
) -> None:
    table = reversed_table(before["metadata"])
    with pytest.raises(Exception) as error:  # noqa: PT011 - the type is asserted below
        put(raw, table, body=body)
    assert_status(error, status, fragments)
    assert_still_serving(raw, before)


def test_put_needs_a_command_descriptor(raw: flight.FlightClient, before: dict[str, Any]) -> None:
    table = reversed_table(before["metadata"])
    with pytest.raises(pa.ArrowInvalid) as error:
        put(raw, table, body=flight.FlightDescriptor.for_path(DATASET))
    assert "command" in message(error.value)
    assert_still_serving(raw, before)


def reversed_table(table: pl.DataFrame) -> pl.DataFrame:
    """A valid table that differs from the active one (so accepting it would show)."""
    return table.reverse()


def test_valid_put_after_rejections_still_works(
    raw: flight.FlightClient, before: dict[str, Any]
) -> None:
    """The rejections left the dataset usable: a good table is then accepted."""
    with pytest.raises(pa.ArrowInvalid):
        put(raw, before["metadata"].with_columns(weight=float("nan")))
    answer = put(raw, reversed_table(before["metadata"]))
    assert answer["rows"] == ROWS
    assert active(raw)["population"] == answer["population"] != before["active"]["population"]
