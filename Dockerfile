# syntax=docker/dockerfile:1
# One image for both sides of keyshift:
#   operator:  keyshift operator --namespace NS      (what the Helm chart runs)
#   worker:    python -m keyshift.runtime --manifest /etc/keyshift/job.yaml
#              (what the operator runs in each StreamJob's pods, from spec.image)
# Your job's code goes in an image built FROM this one (docs/install.md, "Your job's code").
#
#   docker build -t keyshift/keyshift:0.1.0 .

ARG PYTHON_VERSION=3.12

# ---- build: a virtual environment with keyshift and its dependencies, compiled
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# compilers: for keyshift's hot modules (compiled with mypyc when the wheel is built,
# hatch_build.py) and any dependency without a wheel for this platform (they stay here)
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/keyshift
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py ./
COPY api/ api/
COPY state-store/ state-store/
COPY runtime/ runtime/
COPY operator/ operator/
RUN /opt/keyshift/bin/pip install . \
    && /opt/keyshift/bin/python -m compileall -q /opt/keyshift
# the examples' job code (examples.counter:job ...), so that the examples run as they are
COPY examples/ /app/examples/
RUN /opt/keyshift/bin/python -m compileall -q /app/examples

# ---- final: the slim base, the environment, a non-root user; no compilers, no pip cache
FROM python:${PYTHON_VERSION}-slim-bookworm
ARG UID=10001
RUN groupadd --system --gid "${UID}" keyshift \
    && useradd --system --uid "${UID}" --gid keyshift --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin keyshift
COPY --from=build /opt/keyshift /opt/keyshift
COPY --from=build /app /app
ENV PATH=/opt/keyshift/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app
# the user id the operator's and the workers' pods run as (runAsUser 10001)
USER 10001:10001
EXPOSE 8080
CMD ["keyshift", "--help"]
