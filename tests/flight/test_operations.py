"""What operators see (issue 10): Prometheus metrics and HTTP probes on the side
port, one log line per request, and the admin action that removes populations.

Every figure is checked against what the test itself did to the server."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dataset_rt import _native
from flight_server import Catalog, DatasetFlightServer
from flight_server.logs import JsonFormatter
from flight_server.probes import ProbeServer, readiness

from .conftest import DATASET, ROWS, act, active, command, put, serve, ticket

VALID = {"dataset": DATASET, "seed": 3, "epoch": 0}
WAIT_SECONDS = 30.0


@pytest.fixture
def probed(catalog: Catalog) -> Iterator[tuple[DatasetFlightServer, ProbeServer]]:
    with serve(catalog) as server:
        probes = ProbeServer(
            "127.0.0.1", 0, server.metrics.exposition, readiness(catalog, catalog.state_dir)
        )
        try:
            yield server, probes
        finally:
            probes.close()


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT_SECONDS) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(probes: ProbeServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as {(sample name, sorted labels): value}."""
    status, text = http_get(probes.url + "/metrics")
    assert status == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- metrics -----------------------------------------------------------------------


def test_metrics_count_what_clients_did(
    probed: tuple[DatasetFlightServer, ProbeServer],
) -> None:
    server, probes = probed
    with flight.connect(server.location) as raw:
        info = raw.get_flight_info(command(VALID | {"world_size": 2}))
        tables = [raw.do_get(endpoint.ticket).read_all() for endpoint in info.endpoints]
        with pytest.raises(pa.ArrowInvalid):
            raw.do_get(ticket(VALID | {"seed": -1})).read_all()
        with pytest.raises(pa.ArrowKeyError):
            raw.get_flight_info(command(VALID | {"dataset": "nope"}))
        act(raw, "health")
    rows = sum(t.num_rows for t in tables)
    nbytes = sum(b.nbytes for t in tables for b in t.to_batches())
    population = json.loads(info.endpoints[0].ticket.ticket)["population"]
    wait_until(lambda: value(scrape(probes), "datasetrt_requests_total", method="do_get",
                             status="OK") == 2, "both streams to end")  # fmt: skip
    samples = scrape(probes)
    assert value(samples, "datasetrt_requests_total", method="get_flight_info", status="OK") == 1
    assert (
        value(samples, "datasetrt_requests_total", method="get_flight_info", status="NOT_FOUND")
        == 1
    )
    assert (
        value(samples, "datasetrt_requests_total", method="do_get", status="INVALID_ARGUMENT") == 1
    )
    assert value(samples, "datasetrt_requests_total", method="do_action", status="OK") == 1
    assert value(samples, "datasetrt_streams_open", dataset=DATASET) == 0
    assert value(samples, "datasetrt_stream_seconds_count", dataset=DATASET) == 2
    assert value(samples, "datasetrt_time_to_first_batch_seconds_count", dataset=DATASET) == 2
    assert value(samples, "datasetrt_request_seconds_count", method="get_flight_info") == 2
    served = {"dataset": DATASET, "population": population}
    assert rows == ROWS  # two ranks of one epoch
    assert value(samples, "datasetrt_rows_served_total", **served) == rows
    assert value(samples, "datasetrt_bytes_served_total", **served) == nbytes
    # The object store's counters, this process's own (0 here: a local cache).
    requests, fetched = _native.object_store_reads()
    assert value(samples, "datasetrt_object_store_read_requests_total") == requests
    assert value(samples, "datasetrt_object_store_read_bytes_total") == fetched
    slow_downs = _native.object_store_slow_downs()
    assert value(samples, "datasetrt_object_store_slow_downs_total") == slow_downs
    assert ("datasetrt_object_store_slow_downs_total", ()) in samples


def test_an_open_stream_is_counted_until_its_client_closes_it(
    probed: tuple[DatasetFlightServer, ProbeServer],
) -> None:
    server, probes = probed
    with flight.connect(server.location) as raw:
        reader = raw.do_get(ticket(VALID | {"epoch_len": 10**9}))
        reader.read_chunk()
        samples = scrape(probes)
        assert value(samples, "datasetrt_streams_open", dataset=DATASET) == 1
        assert value(samples, "datasetrt_time_to_first_batch_seconds_count", dataset=DATASET) == 1
        reader.cancel()
    wait_until(
        lambda: value(scrape(probes), "datasetrt_streams_open", dataset=DATASET) == 0,
        "the cancelled stream to end",
    )
    assert value(scrape(probes), "datasetrt_requests_total", method="do_get", status="CANCELLED")


def test_label_values_are_bounded(probed: tuple[DatasetFlightServer, ProbeServer]) -> None:
    """Client text (unknown actions, datasets) never becomes a label value."""
    server, probes = probed
    with flight.connect(server.location) as raw:
        for i in range(20):
            with pytest.raises(pa.ArrowInvalid):
                act(raw, f"no-such-action-{i}")
            with pytest.raises(pa.ArrowKeyError):
                raw.do_get(ticket(VALID | {"dataset": f"nope{i}"})).read_all()
    labels = {value for (_, pairs) in scrape(probes) for _, value in pairs}
    assert not any("no-such" in text or "nope" in text for text in labels), labels


# -- probes ------------------------------------------------------------------------


def test_probes_answer_live_and_ready(probed: tuple[DatasetFlightServer, ProbeServer]) -> None:
    _, probes = probed
    assert http_get(probes.url + "/healthz") == (200, "ok\n")
    assert http_get(probes.url + "/readyz") == (200, "ready\n")
    status, text = http_get(probes.url + "/nope")
    assert status == 404
    assert "/readyz" in text


def test_not_ready_when_the_state_directory_is_gone(
    probed: tuple[DatasetFlightServer, ProbeServer], catalog: Catalog
) -> None:
    _, probes = probed
    moved = catalog.local_dir.with_name("moved")
    catalog.local_dir.rename(moved)
    try:
        status, text = http_get(probes.url + "/readyz")
        assert status == 503
        assert text.startswith("not ready: "), text
        assert http_get(probes.url + "/healthz")[0] == 200  # alive, just not ready
    finally:
        moved.rename(catalog.local_dir)
    assert http_get(probes.url + "/readyz")[0] == 200


def test_the_health_command_reads_the_probe(
    probed: tuple[DatasetFlightServer, ProbeServer],
) -> None:
    _, probes = probed
    health = [sys.executable, "-m", "flight_server.health"]
    ok = subprocess.run([*health, probes.url + "/readyz"], capture_output=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run(
        [*health, probes.url + "/missing"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1
    assert "404" in missing.stderr


# -- request logs ------------------------------------------------------------------


def test_one_log_line_per_request_with_its_fields(
    server: DatasetFlightServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="flight_server.requests"):
        with flight.connect(server.location) as raw:
            table = raw.do_get(ticket(VALID | {"epoch": 4, "rank": 1, "world_size": 2})).read_all()
            with pytest.raises(pa.ArrowInvalid):
                raw.get_flight_info(command(VALID | {"shuffle": "sideways"}))
        wait_until(lambda: len(caplog.records) >= 2, "two request lines")
    lines = {r.request["method"]: r for r in caplog.records}  # type: ignore[attr-defined]
    stream = json.loads(JsonFormatter().format(lines["do_get"]))
    assert stream["status"] == "OK"
    assert stream["dataset"] == DATASET
    assert (stream["epoch"], stream["rank"], stream["world_size"]) == (4, 1, 2)
    assert stream["rows"] == table.num_rows == ROWS // 2
    assert stream["bytes"] == sum(b.nbytes for b in table.to_batches())
    assert stream["first_batch_seconds"] <= stream["seconds"]
    refused = json.loads(JsonFormatter().format(lines["get_flight_info"]))
    assert refused["status"] == "INVALID_ARGUMENT"
    assert "shuffle" in refused["error"]
    assert refused["level"] == "INFO"  # the client's mistake, not the server's trouble


def test_the_cli_writes_json_lines_and_serves_probes(
    tmp_path: Path, toy_caches: tuple[Path, Path]
) -> None:
    """``--log-format json --metrics-port 0``: every stderr line is a JSON object."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flight_server", "--port", "0", "--metrics-port", "0",
         "--log-format", "json", "--dataset", f"{DATASET}={toy_caches[0]},{toy_caches[1]}",
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        location = proc.stdout.readline().split(" at ")[1].split(" ")[0]
        probe_url = proc.stdout.readline().split(" at ")[1].split(" ")[0]
        assert http_get(probe_url + "/readyz")[0] == 200
        with flight.connect(location) as raw:
            raw.do_get(ticket(VALID)).read_all()
        wait_until(
            lambda: value(scrape_url(probe_url), "datasetrt_requests_total", method="do_get",
                          status="OK") == 1, "the stream's metrics")  # fmt: skip
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_SECONDS)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    requests = [line for line in lines if line["logger"] == "flight_server.requests"]
    assert [(r["method"], r["status"]) for r in requests] == [("do_get", "OK")], lines
    assert requests[0]["rows"] > 0
    assert requests[0]["seed"] == VALID["seed"]


def scrape_url(url: str) -> dict[Any, float]:
    status, text = http_get(url + "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


# -- removing populations ------------------------------------------------------------


def test_remove_population_action(server: DatasetFlightServer) -> None:
    with flight.connect(server.location) as raw:
        first = active(raw)["population"]
        table = raw.do_get(ticket({"dataset": DATASET, "metadata": True})).read_all()
        pinned = raw.get_flight_info(command(VALID)).endpoints[0].ticket
        second = put(raw, table.slice(0, 10))["population"]  # now the active one
        with pytest.raises(pa.ArrowInvalid, match="active population"):
            act(raw, "remove_population", {"dataset": DATASET, "population": second})
        with pytest.raises(pa.ArrowInvalid, match="population"):
            act(raw, "remove_population", {"dataset": DATASET, "population": "../x"})
        with pytest.raises(pa.ArrowInvalid, match="population"):
            act(raw, "remove_population", {"dataset": DATASET})
        answer = act(raw, "remove_population", {"dataset": DATASET, "population": first})
        assert answer == {"dataset": DATASET, "removed": first}
        with pytest.raises(pa.ArrowKeyError, match=first):
            raw.do_get(pinned).read_all()
        with pytest.raises(pa.ArrowKeyError):
            act(raw, "remove_population", {"dataset": DATASET, "population": first})
        listed = act(raw, "list_populations", {"dataset": DATASET})
        assert listed["populations"] == [second]
        assert active(raw)["population"] == second
        assert raw.do_get(ticket(VALID)).read_all().num_rows == 10
