# One command runner for developers, the pre-commit hook (.pre-commit-config.yaml)
# and CI (.ci/run): each check is written here once.
.PHONY: develop sync sync-torch sync-all test test-rust test-python test-scale test-ray e2e lint lint-rust lint-python stubtest \
        probe ci fmt bench bench-peers demo serve

# Rebuild the extension in place (incremental release build) for a fast loop.
develop:
	cargo build --release -p dataset_rt_native --features python
	# Replace by rename so running processes keep the old file mapped.
	cp target/release/libdataset_rt_native.so dataset_rt/_native.abi3.so.tmp
	mv -f dataset_rt/_native.abi3.so.tmp dataset_rt/_native.abi3.so

# The locked Python environment with the extension built (what `uv run` does on first use).
sync:
	uv sync --locked

# The same plus PyTorch and torchdata (about 4 GB), for the training suites;
# `uv run` keeps them installed afterwards.
sync-torch:
	uv sync --locked --group torch

# What CI installs: PyTorch and Ray (a real local Ray cluster for tests/ray/).
sync-all:
	uv sync --locked --group torch --group ray

test: test-rust test-python

test-rust:
	cargo test -p dataset_rt_native

# The README's test command.
test-python:
	uv run pytest

# Issue 20's scale test: a 10^8-row population over Flight in flat memory
# (about 2 minutes and 40 GB of disk; skipped, saying why, with less disk).
test-scale:
	uv run pytest -m slow -ra tests/flight/test_scale.py

# Issue 48's heavy Ray suite: Ray Train runs killed and resumed on a local
# two-node Ray cluster, audited (about 3 minutes).
test-ray:
	uv run pytest -m slow -ra tests/on_ray

# The container suite (needs a Docker engine with Compose).
e2e:
	uv run pytest -m e2e tests/e2e

lint: lint-rust lint-python

lint-rust:
	cargo fmt --all --check
	cargo clippy -p dataset_rt_native --all-targets -- -D warnings
	cargo clippy -p dataset_rt_native --features python -- -D warnings
	cargo clippy -p flight_probe --all-targets -- -D warnings

lint-python: stubtest
	uv run ruff check .
	uv run ruff format --check .
	uv run mypy

# The stub of the extension against the built module.
stubtest:
	uv run python -m mypy.stubtest dataset_rt._native --allowlist dataset_rt/stubtest-allowlist.txt

# The Rust Flight client used by tests/flight/test_cross_language.py.
probe:
	cargo build --release -p flight_probe

# Everything CI runs but the container suite, in CI's order.
ci: lint-rust test-rust sync-all lint-python probe test-python

fmt:
	cargo fmt --all
	uv run ruff format .
	uv run ruff check --fix .

bench:
	uv run python benchmarks/bench_core.py

# Against the loaders users would pick instead (benchmarks/bench_peers.py), in an
# environment of its own: the peers group pins versions the dev group cannot share.
# Pass options with ARGS="--quick".
bench-peers:
	UV_PROJECT_ENVIRONMENT=.venv-peers uv run --locked --no-dev --group peers \
	  python benchmarks/bench_peers.py $(ARGS)

demo:
	uv run python -m dataset_rt

serve:
	uv run python -m flight_server
