"""A replica process that activates populations on cue, for the suites that race
replicas' activations against each other (tests/test_object_store.py,
tests/test_storage_contract.py).

The script takes ``CACHE LOCATION MIRROR WEIGHT0 COUNT``: it opens dataset
``dataset`` over the cache with its population store at LOCATION (a directory or
an ``s3://`` URL, mirrored into MIRROR), prints ``ready``, waits for a line on
stdin, then puts and activates COUNT populations (weights WEIGHT0, WEIGHT0 + 1,
...) and prints each acknowledged population id as a JSON string.
"""

from __future__ import annotations

import textwrap


def contender_script(dataset: str) -> str:
    return textwrap.dedent(
        f"""
        import json, sys
        import pyarrow as pa
        import dataset_rt as drt
        from dataset_rt.service import DatasetService

        cache, location, mirror, weight0, count = sys.argv[1:6]
        runtime = drt.DatasetRuntime(num_workers=1)
        service = DatasetService(
            runtime.native, {dataset!r}, [cache], location, mirror_dir=mirror
        )
        base = pa.table(service.metadata())
        at = base.schema.get_field_index("weight")
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(int(count)):
            weights = pa.array([float(weight0) + i] * base.num_rows, pa.float64())
            population, _ = service.put(base.set_column(at, "weight", weights), True)
            print(json.dumps(population), flush=True)
        """
    )
