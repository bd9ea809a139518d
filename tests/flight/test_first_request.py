"""A fresh server's first requests do not wait for pandas (issue 47, finding 5).

pyarrow imports pandas, when it is installed, the first time a process converts a
foreign object with ``pa.table``/``pa.array`` (to ask whether it is a DataFrame):
2-4 s on a fresh server's first ``list_flights`` and a first ``draw_rows``. These
paths read the engine's Arrow data through the C stream interface instead, so a
fresh process answers them without importing pandas at all. Each check runs in a
new interpreter (this one has imported pandas long ago), and pandas is installed
here, so a path that imports it shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pandas")  # what the checks watch for

TIMEOUT = 120

SERVER = textwrap.dedent(
    """
    import json, sys, threading
    import pyarrow.flight as flight
    from flight_server.cli import _parser, build_server

    args = _parser().parse_args(["--port", "0", "--state-dir", sys.argv[1]])
    server = build_server(args)  # the embedded demo dataset
    threading.Thread(target=server.serve, daemon=True).start()
    seen = {"ready": "pandas" in sys.modules}
    client = flight.connect(f"grpc://127.0.0.1:{server.port}")
    list(client.list_flights())
    seen["list_flights"] = "pandas" in sys.modules
    command = {"dataset": "demo", "seed": 1, "epoch": 0}
    info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(command)))
    seen["get_flight_info"] = "pandas" in sys.modules
    rows = client.do_get(info.endpoints[0].ticket).read_all().num_rows
    seen["do_get"] = "pandas" in sys.modules
    client.close()
    server.shutdown()
    print(json.dumps({"rows": rows, "pandas": seen}))
    """
)

LIBRARY = textwrap.dedent(
    """
    import json, sys
    import dataset_rt as drt

    runtime = drt.DatasetRuntime(num_workers=2)
    source = [drt.CacheInput(data=bytes([i % 256]) * 8, metadata={"label": i % 3})
              for i in range(500)]

    class Source:
        name = "first"
        def __iter__(self):
            return iter(source)

    result = runtime.from_cache_sources(
        Source(), sys.argv[1], reader_config=drt.ReaderConfig(seed=1)
    )
    rows = result.dataset.draw_rows(count=1000)
    print(json.dumps({"rows": len(rows), "pandas": {"draw_rows": "pandas" in sys.modules}}))
    """
)


def _run(script: str, directory: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_a_fresh_server_answers_its_first_requests_without_importing_pandas(
    tmp_path: Path,
) -> None:
    answer = _run(SERVER, tmp_path / "state")
    assert answer["rows"] == 2000
    assert answer["pandas"] == {
        "ready": False,
        "list_flights": False,
        "get_flight_info": False,
        "do_get": False,
    }


def test_a_first_draw_rows_in_process_does_not_import_pandas(tmp_path: Path) -> None:
    answer = _run(LIBRARY, tmp_path / "caches")
    assert answer == {"rows": 1000, "pandas": {"draw_rows": False}}
