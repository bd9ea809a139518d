"""``python -m flight_server.health [LOCATION]``: exit 0 when the server answers
the ``health`` action (the container healthcheck), 1 otherwise."""

from __future__ import annotations

import json
import os
import sys

import pyarrow.flight as flight


def main(argv: list[str]) -> int:
    location = argv[0] if argv else "grpc://127.0.0.1:8815"
    token = os.environ.get("DATASET_RT_HEALTH_TOKEN")
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    options = flight.FlightCallOptions(timeout=4, headers=headers)
    try:
        with flight.connect(location) as client:
            [result] = list(client.do_action(flight.Action("health", b""), options=options))
        status = json.loads(result.body.to_pybytes()).get("status")
    except Exception as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return 1
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
