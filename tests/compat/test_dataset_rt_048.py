"""dataset-rt 0.4.8's own test suites, run against our `dataset_rt`.

Users migrate from dataset-rt 0.4.8; its test suite is the behaviour their code
relies on. This module unpacks 0.4.8's source distribution (its ``tests/`` and
``scripts/`` only, never its package) from ``../shared/compat/`` next to the
repository, runs the suites that use public names only (`expected_048`) in a
subprocess with our package first on the path, and checks every outcome:

- every 0.4.8 test passes except the deliberate differences of
  `expected_048.EXPECTED_DIFFERENCES`;
- each of those is a strict xfail here: it must still fail, and for the reason
  written down (its failure contains the entry's marker), else this fails;
- each suite has the number of tests we reviewed;
- the suites we do not run still import 0.4.8's private modules (the reason we
  skip them).

Skipped, saying why, when the source distribution is absent (a clone without
its ``shared/`` sibling).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import NamedTuple

import pytest

from .expected_048 import EXPECTED_DIFFERENCES, PRIVATE_SUITES, PUBLIC_SUITES

REPO_ROOT = Path(__file__).resolve().parents[2]
SDIST = REPO_ROOT.parent / "shared" / "compat" / "dataset_rt-0.4.8.tar.gz"
TOP = "dataset_rt-0.4.8"

pytestmark = [
    pytest.mark.skipif(
        not SDIST.is_file(),
        reason=f"dataset-rt 0.4.8's source distribution is absent ({SDIST}); "
        "the compatibility suite runs where the repository has the shared/ sibling",
    ),
    # The first test runs the whole foreign suite (about a minute on 2 busy cores).
    pytest.mark.timeout(900),
]


class Outcome(NamedTuple):
    """A 0.4.8 test's result: ``passed``, ``failed``, ``error`` or ``skipped``."""

    status: str
    text: str


class StillDiffers(AssertionError):
    """An expected difference that still fails for its stated reason."""


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.4.8's ``tests/`` and ``scripts/``, without its ``dataset_rt`` package."""
    root = tmp_path_factory.mktemp("dataset_rt_048")
    with tarfile.open(SDIST) as archive:
        members = [
            m
            for m in archive.getmembers()
            if m.name.startswith((f"{TOP}/tests/", f"{TOP}/scripts/"))
        ]
        archive.extractall(root, members=members, filter="data")
    top = root / TOP
    # Their pytest.ini wants pytest-xdist (-n auto); ours keeps their markers only.
    (top / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: expensive integration tests\n")
    return top


def foreign_env(unpacked: Path) -> dict[str, str]:
    """Our package first on the path; their ``scripts`` importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(unpacked)])
    env.pop("PYTEST_ADDOPTS", None)
    return env


@pytest.fixture(scope="module")
def outcomes(unpacked: Path) -> dict[str, Outcome]:
    """Run the public suites once; every test's outcome by its id."""
    env = foreign_env(unpacked)
    where = subprocess.run(
        [sys.executable, "-c", "import dataset_rt; print(dataset_rt.__file__)"],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(REPO_ROOT), f"0.4.8's tests would import {where}"
    junit = unpacked / "junit.xml"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow",
            "-q",
            f"--junitxml={junit}",
            f"--basetemp={unpacked / 'tmp'}",
            *PUBLIC_SUITES,
        ],
        cwd=unpacked,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert junit.is_file(), f"0.4.8's suite did not run:\n{run.stdout}\n{run.stderr}"
    return parse_junit(junit)


def parse_junit(path: Path) -> dict[str, Outcome]:
    results: dict[str, Outcome] = {}
    for case in ElementTree.parse(path).iter("testcase"):
        module = (case.get("classname") or "").replace(".", "/") + ".py"
        test_id = f"{module}::{case.get('name')}"
        status, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = child.tag if child.tag != "failure" else "failed"
                text = f"{child.get('message') or ''}\n{child.text or ''}"
        results[test_id] = Outcome(status, text)
    return results


def test_each_public_suite_has_the_reviewed_tests(outcomes: dict[str, Outcome]) -> None:
    for suite, count in PUBLIC_SUITES.items():
        ran = [t for t in outcomes if t.startswith(f"{suite}::")]
        assert len(ran) == count, (
            f"{suite}: {len(ran)} tests ran, {count} were reviewed; "
            "review the new or missing ones and update expected_048.py"
        )


def test_every_other_048_test_passes(outcomes: dict[str, Outcome]) -> None:
    unexpected = {
        test_id: f"{outcome.status}: {outcome.text.strip()[:400]}"
        for test_id, outcome in outcomes.items()
        if outcome.status != "passed" and test_id not in EXPECTED_DIFFERENCES
    }
    assert not unexpected, "0.4.8 tests that fail on our library:\n" + "\n".join(
        f"- {t}: {why}" for t, why in sorted(unexpected.items())
    )
    passed = sum(o.status == "passed" for o in outcomes.values())
    assert passed == len(outcomes) - len(EXPECTED_DIFFERENCES)


@pytest.mark.parametrize(
    "test_id",
    [
        pytest.param(
            test_id,
            marks=pytest.mark.xfail(strict=True, raises=StillDiffers, reason=difference.reason),
        )
        for test_id, difference in EXPECTED_DIFFERENCES.items()
    ],
)
def test_deliberate_difference(test_id: str, outcomes: dict[str, Outcome]) -> None:
    """Fails (xfail) while the difference holds for its reason; passes (strict
    XPASS, a failure) once the 0.4.8 test passes: then remove the entry."""
    outcome = outcomes.get(test_id)
    if outcome is None:
        pytest.fail(f"{test_id} did not run; update expected_048.py")
    if outcome.status == "passed":
        return
    difference = EXPECTED_DIFFERENCES[test_id]
    if difference.marker not in outcome.text:
        pytest.fail(
            f"{test_id} fails, but not for the stated reason (no {difference.marker!r} in "
            f"the failure):\n{outcome.text[:2000]}"
        )
    raise StillDiffers(difference.reason)


@pytest.mark.parametrize("suite", sorted(PRIVATE_SUITES))
def test_unrun_suites_still_need_private_modules(unpacked: Path, suite: str) -> None:
    """We do not run these suites: each imports 0.4.8's private modules at the top."""
    source = (unpacked / suite).read_text()
    assert PRIVATE_SUITES[suite] in source, (
        f"{suite} no longer imports {PRIVATE_SUITES[suite]!r}; see whether its tests "
        "now use public names only, and run them"
    )
