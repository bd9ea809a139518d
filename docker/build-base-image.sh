#!/usr/bin/env bash
# Build a local Debian base image (no registry needed): debootstrap the host's
# Debian release with Python into a folder and `docker import` it.
#
#   docker/build-base-image.sh [IMAGE_TAG [PACKAGE...]]
#
# IMAGE_TAG defaults to dataset-rt-base:local; extra Debian packages go into the
# same root filesystem (docker/build-ceph-image.sh adds Ceph's this way).
#
# The mirror is the one the host's apt already uses (read from its sources), so
# nothing here names a package host.
set -euo pipefail
tag="${1:-dataset-rt-base:local}"
shift || true
extra=""
for package in "$@"; do extra="$extra,$package"; done
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag exists"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
mirror=$(grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true)
if [ -z "$mirror" ]; then
  mirror=$(grep -h -m1 -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}')
fi
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
root=$(mktemp -d /tmp/dataset-rt-rootfs.XXXXXX)
log="$root.log"
trap 'rm -rf "$root" "$log"' EXIT
echo "debootstrap $suite into $root"
debootstrap --variant=minbase \
  --include=python3,python3-venv,python3-pip,ca-certificates$extra \
  "$suite" "$root" "$mirror" >"$log" 2>&1 || {
    tail -20 "$log"; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import - "$tag" >/dev/null
echo "built $tag"
