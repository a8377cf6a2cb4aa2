# syntax=docker/dockerfile:1
# Modelyard's image: one image for every role (web, worker, beat, inference, the migration job).
#
#   docker build -t modelyard:cpu .
#   docker build -t modelyard:gpu --build-arg VARIANT=gpu .
#
# Both variants install the locked versions (requirements/<variant>.txt, with hashes, from `make lock`),
# then the project without dependencies. VARIANT=gpu's lock is pyproject.toml's GPU extra (GPU_EXTRA), which
# brings ONNX Runtime with the CUDA execution provider; the NVIDIA driver comes from the host (the
# NVIDIA container toolkit, or the device plugin on Kubernetes). Without a GPU the GPU image falls
# back to the CPU provider, and /api/v1/fleet says so.
#
# The image runs as an unprivileged user and writes only to /var/lib/modelyard (the data folder:
# work files, the artifact cache, beat's schedule) and /tmp, so the root filesystem can be read-only.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG VARIANT=cpu
ARG CPU_EXTRA=cpu
ARG GPU_EXTRA=gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/modelyard
WORKDIR /app
COPY pyproject.toml README.md ./
COPY requirements ./requirements
COPY modelyard ./modelyard
COPY onnxkit ./onnxkit
COPY registry ./registry
COPY storage ./storage
COPY inference ./inference
COPY templates ./templates
# Editable, from /app: the settings find the UI's templates beside the code (BASE_DIR/templates).
RUN case "$VARIANT" in \
        cpu) extra="$CPU_EXTRA" ;; \
        gpu) extra="$GPU_EXTRA" ;; \
        *) echo "VARIANT must be cpu or gpu, not '$VARIANT'" >&2; exit 1 ;; \
    esac \
    && /opt/modelyard/bin/pip install --require-hashes -r "/app/requirements/${extra}.txt" \
    && /opt/modelyard/bin/pip install --no-deps --editable /app \
    && /opt/modelyard/bin/python -m compileall -q /app/modelyard /app/registry /app/storage /app/inference

FROM ${PYTHON_IMAGE}
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="modelyard" \
      org.opencontainers.image.description="ONNX model registry and serving control plane (${VARIANT})"
RUN groupadd --system --gid 10001 modelyard \
    && useradd --system --uid 10001 --gid modelyard --home-dir /var/lib/modelyard --shell /usr/sbin/nologin modelyard \
    && install -d -o modelyard -g modelyard -m 0750 /var/lib/modelyard
COPY --from=build /opt/modelyard /opt/modelyard
COPY --from=build /app /app
ENV PATH=/opt/modelyard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELYARD_DATA_DIR=/var/lib/modelyard
WORKDIR /var/lib/modelyard
USER 10001:10001
# HTTP (API, UI, /v2) and gRPC (inference.GRPCInferenceService, `serve --grpc-port`)
EXPOSE 8000 8001
ENTRYPOINT ["modelyard"]
# The embedded default: SQLite and artifacts in the data folder. Production passes a role, e.g.
# `serve --host 0.0.0.0 --role web`, `worker`, `beat` or `manage migrate`.
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
