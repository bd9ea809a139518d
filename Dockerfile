# The DatasetRT Flight service. Build the wheels first (docker/build-image.sh
# does both steps): the image installs only from dist/wheels, never from the
# network, so it builds the same way on a machine without a registry.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

COPY dist/wheels/ /tmp/wheels/
RUN python3 -m venv /opt/dataset-rt \
 && /opt/dataset-rt/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels \
      dataset-rt-flight \
 && rm -rf /tmp/wheels \
 && useradd --system --create-home --uid 10001 dataset \
 && mkdir -p /data /caches /state /mirror \
 && chown dataset /data /caches /state /mirror

USER dataset
WORKDIR /home/dataset
ENV PATH=/opt/dataset-rt/bin:$PATH \
    DATASET_RT_DATA_DIR=/data \
    PYTHONUNBUFFERED=1
EXPOSE 8815
HEALTHCHECK --interval=5s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-m", "flight_server.health", "grpc://127.0.0.1:8815"]
ENTRYPOINT ["python", "-m", "flight_server", "--host", "0.0.0.0"]
