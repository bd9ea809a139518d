"""``python -m flight_server.health [URL]``: exit 0 when the server is healthy
(the container healthcheck), 1 otherwise.

``URL`` is an HTTP probe of the side port (``http://127.0.0.1:9815/readyz``, see
docs/operations.md) or a Flight location (``grpc://127.0.0.1:8815``, default),
which is asked for the ``health`` action (with ``DATASET_RT_HEALTH_TOKEN`` as
its bearer token when the server requires one).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

import pyarrow.flight as flight

TIMEOUT = 4.0


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as error:
        print(
            f"unhealthy: {url}: {error.code} {error.read().decode(errors='replace').strip()}",
            file=sys.stderr,
        )
    except OSError as error:
        print(f"unhealthy: {url}: {error}", file=sys.stderr)
    return False


def flight_ok(location: str) -> bool:
    token = os.environ.get("DATASET_RT_HEALTH_TOKEN")
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    options = flight.FlightCallOptions(timeout=TIMEOUT, headers=headers)
    try:
        with flight.connect(location) as client:
            [result] = list(client.do_action(flight.Action("health", b""), options=options))
        status = json.loads(result.body.to_pybytes()).get("status")
    except Exception as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return False
    return bool(status == "ok")


def main(argv: list[str]) -> int:
    target = argv[0] if argv else "grpc://127.0.0.1:8815"
    healthy = http_ok(target) if target.startswith(("http://", "https://")) else flight_ok(target)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
