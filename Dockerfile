# syntax=docker/dockerfile:1
#
# kafka-consumer-gateway container image.
#
#   docker build -t kafka-consumer-gateway:0.1.0 .
#   docker run --rm -p 8080:8080 -e GATEWAY_KAFKA_BOOTSTRAP=kafka:9092 kafka-consumer-gateway:0.1.0
#
# Two stages: `build` (the full Debian Python image, which has gcc and the Python headers) builds the
# project's wheel, compiling the C extensions (record decoder, Avro renderer, producer encoder; see hatch_build.py), and
# installs it with its runtime dependencies into a virtualenv; the runtime stage (slim) gets only that
# virtualenv: no compiler, no sources, no test or Spark extras. Both stages use the same Python tag, so
# the virtualenv's interpreter link (/usr/local/bin/python3.11) is valid in both.
#
# Production settings: the gateway binds 0.0.0.0:8080, logs JSON, and runs uvicorn on uvloop with the
# httptools parser (runtime dependencies of the package; the build fails if they or the C decoder are
# missing). On SIGTERM it drains (GATEWAY_SHUTDOWN_DRAIN_S, 1.5 s), gives in-flight requests and the
# instances' final commits GATEWAY_SHUTDOWN_TIMEOUT_S (10 s), then exits: a stop timeout / termination
# grace period of 30 s covers it. The process is PID 1 and handles SIGTERM and SIGINT itself.
#
# Do not run it without GATEWAY_KAFKA_BOOTSTRAP in production: unset, the gateway starts an embedded
# development broker (Tansu) in the container.
#
# Without GATEWAY_TENANTS_FILE the gateway is in open mode (no authentication). The container must listen
# on 0.0.0.0 to be reachable through a published port, so publish it on loopback only
# (`-p 127.0.0.1:8080:8080`); the gateway then serves only Host headers naming localhost, 127.0.0.1 or
# [::1] (a DNS-rebinding web page gets 421/42101) unless GATEWAY_ALLOWED_HOSTS lists more.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps everything else out of the context).
COPY pyproject.toml hatch_build.py README.md ./
COPY service/ service/
COPY api/ api/
COPY sink/ sink/
COPY gateway/ gateway/

# The wheel of the project alone (its dependencies come as published wheels): the hatch build hook
# compiles the C extension into it and tags the wheel for this platform.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install /wheels/*.whl


FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    GATEWAY_LOG_FORMAT=json

RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gateway

COPY --from=build /opt/venv /opt/venv

# Fail the build, not the first start, when the accelerator or the production server stack is missing
# or cannot load on the slim base (-P: import the installed packages, not a source tree in the cwd).
RUN python -P -c "import api.app, gateway.main, service.protocol._crecords, service.schemas._cavro, service.producer._cproduce, uvloop, httptools"

USER 10001:10001
WORKDIR /tmp
EXPOSE 8080

# The slim image has no curl: ask /healthz with the standard library (urlopen raises on non-2xx).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-P", "-c", "import os, ssl, urllib.request as u; t = bool(os.environ.get('GATEWAY_TLS_CERT_FILE')); u.urlopen('%s://127.0.0.1:%s/healthz' % ('https' if t else 'http', os.environ.get('GATEWAY_PORT', '8080')), timeout=3, context=ssl._create_unverified_context() if t else None)"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["consumer-gateway"]
