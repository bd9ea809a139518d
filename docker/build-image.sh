#!/usr/bin/env bash
# Build the service image from this checkout:
#   docker/build-image.sh [IMAGE_TAG] [BASE_IMAGE]
# 1. the project's wheel (maturin, release) and its dependencies' wheels into
#    dist/wheels (the image installs offline from there);
# 2. `docker build` with BASE_IMAGE (default python:3.11-slim; the end-to-end
#    tests pass a local Debian image made by docker/build-base-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-dataset-rt-flight:latest}"
base="${2:-python:3.11-slim}"
rm -rf dist/wheels
mkdir -p dist/wheels
uv build --wheel --out-dir dist/wheels >/dev/null
# The locked runtime dependencies, as wheels for CPython 3.11 on Linux x86_64.
uv export --frozen --no-dev --no-hashes --no-emit-project --no-header >dist/requirements.txt
uvx pip download --quiet --dest dist/wheels --only-binary=:all: \
  --python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --implementation cp -r dist/requirements.txt
docker build --quiet --build-arg "BASE_IMAGE=$base" --tag "$tag" . >/dev/null
echo "built $tag (base $base)"
