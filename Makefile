# One command runner for developers, the pre-commit habit and .ci/run.
.PHONY: develop test test-rust test-python lint fmt bench demo serve

# Rebuild the extension in place (incremental release build) for a fast loop.
develop:
	cargo build --release -p dataset_rt_native --features python
	# Replace by rename so running processes keep the old file mapped.
	cp target/release/libdataset_rt_native.so dataset_rt/_native.abi3.so.tmp
	mv -f dataset_rt/_native.abi3.so.tmp dataset_rt/_native.abi3.so

test: test-rust test-python

test-rust:
	cargo test -p dataset_rt_native

test-python:
	uv run pytest

lint:
	cargo fmt --all --check
	cargo clippy -p dataset_rt_native --all-targets -- -D warnings
	cargo clippy -p dataset_rt_native --features python -- -D warnings
	uv run ruff check .
	uv run ruff format --check .
	uv run mypy

fmt:
	cargo fmt --all
	uv run ruff format .
	uv run ruff check --fix .

bench:
	uv run python benchmarks/bench_core.py

demo:
	uv run python -m dataset_rt

serve:
	uv run python -m flight_server
