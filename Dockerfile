# syntax=docker/dockerfile:1
# The gpuledger image: the webhook (`gpuledger serve`), the `gpuledger` CLI, and the Ray runtime that the
# ledger's RayCluster runs on (its nodes must import gpuledger.ray.actor and run the same Ray and Python).
#   docker build -t gpuledger/gpuledger:0.1.0 .
# Multi-stage: the build stage has pip and compiles the virtualenv; the runtime stage only copies it.
# Read-only-root friendly: bytecode is compiled at build time, HOME and Ray's temp dir live under /tmp
# (an emptyDir in the manifests), and nothing else is written at run time.
ARG PYTHON_VERSION=3.11
ARG RAY_VERSION=2.60.0

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ARG RAY_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gpuledger
ENV PATH=/opt/gpuledger/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuledger ./gpuledger
RUN pip install "ray[default]==${RAY_VERSION}" . \
 && python -m compileall -q /opt/gpuledger

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
# tini reaps the processes Ray starts; wget is what KubeRay's default head/worker probes call
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini wget \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 gpuledger \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gpuledger
COPY --from=build /opt/gpuledger /opt/gpuledger
# TINI_SUBREAPER: tini adopts and reaps Ray's orphans also where it is not PID 1 (the webhook pod shares one
# process namespace with its controller; the node agent runs with the host's)
ENV PATH=/opt/gpuledger/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    RAY_USAGE_STATS_ENABLED=0 \
    TINI_SUBREAPER=1
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["gpuledger", "--help"]
