#!/usr/bin/env bash
# Build the object-store image of the compose profile `object-store`:
#   docker/build-ceph-image.sh [IMAGE_TAG]      (default: dataset-rt-ceph:local)
# 1. a Debian root filesystem with Ceph's monitor, OSD and radosgw
#    (docker/build-base-image.sh, no registry needed; kept as dataset-rt-ceph:base);
# 2. `docker build` of docker/ceph.Dockerfile, which adds the launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-dataset-rt-ceph:local}"
base="dataset-rt-ceph:base"
bash docker/build-base-image.sh "$base" ceph-mon ceph-osd radosgw ceph-common
docker build --quiet --file docker/ceph.Dockerfile --build-arg "CEPH_BASE=$base" \
  --tag "$tag" . >/dev/null
echo "built $tag (base $base)"
