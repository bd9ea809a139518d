# The object store of the compose profile `object-store`: a one-node Ceph
# (monitor, memstore OSD, radosgw) from Debian's packages, run by the same
# launcher the tests use (tests/ceph_s3.py). docker/build-ceph-image.sh builds
# the base (a debootstrap root filesystem with Ceph) and then this file.
#
# memstore keeps the objects in memory: the store is for trying the cluster
# and for the end-to-end tests, and is empty again after a restart. Point the
# replicas at your own S3-compatible store for real data (docs/operations.md).
ARG CEPH_BASE=dataset-rt-ceph:base
FROM ${CEPH_BASE}
COPY tests/ceph_s3.py /opt/ceph_s3.py
EXPOSE 7480
ENTRYPOINT ["python3", "/opt/ceph_s3.py"]
# --fresh: a restarted container starts a new, empty store (memstore kept the
# objects in memory), so nothing of the last run can half-start it.
CMD ["/var/lib/ceph-s3", "--fresh", "--bind", "0.0.0.0", "--port", "7480", \
     "--bucket", "datasets", "--ready", "/var/lib/ceph-s3-ready"]
