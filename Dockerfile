# nats-bridge: the daemon alone, as a non-root user, configured by a mounted file.
#
#   docker build -t nats-bridge .
#   docker run --rm --stop-timeout 30 -p 9464:9464 \
#       -v "$PWD/bridge.toml:/etc/nats-bridge/bridge.toml:ro" \
#       -e NATS_BRIDGE_TARGET__AUTH__TOKEN=... nats-bridge
#
# Configuration: mount the file at /etc/nats-bridge/bridge.toml (no VOLUME is declared: it would give every
# container an anonymous volume there, masking what is mounted more narrowly), and pass secrets as NATS_BRIDGE_*
# environment variables. The bridge runs as uid 10001, gid 10001 (USER below): that user or group must be able
# to read the mounted file, and every nkey, creds, CA, certificate or key file it names. On the host, for
# example: chgrp 10001 bridge.toml && chmod 0640 bridge.toml (0644 when it holds no secret: `run` warns about a
# password or token in a file every user can read). A file it cannot read stops `run` with exit 2 and the reason.
# For /metrics, /healthz and /readyz to be reachable from outside the container
# (Kubernetes probes, Prometheus, -p 9464:9464), the file must set [http] listen = "0.0.0.0:9464". The
# HEALTHCHECK below runs inside and asks the address the file (or NATS_BRIDGE_HTTP__LISTEN) gives, so any port
# works; keep the listener enabled. Mounted elsewhere than /etc/nats-bridge/bridge.toml, the file's path must
# change in both CMD and HEALTHCHECK.
#
# Stopping: on SIGTERM the bridge drains for up to engine.shutdown_grace (10 s by default), which is exactly
# `docker stop`'s default timeout; give it more (--stop-timeout 30, compose stop_grace_period: 30s).
# The bridge is PID 1 here and handles SIGTERM/SIGINT itself, and `run` starts no child processes, so no init
# process is needed.

# Both stages must use the same image: the venv's bin/python is a link to the image's interpreter.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# The install compiles bridge/core with mypyc (setup.py): a C compiler here, in the build stage only (the image's
# Python already has its headers). The final stage copies the venv, not the compiler.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/nats-bridge
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY bridge ./bridge
# No extras and no dependency group: [demo] and the dev group bring nats-server and test tools, which production
# does not need. pip and setuptools go afterwards: nothing installs into the venv at run time.
RUN /opt/nats-bridge/bin/pip install . \
    && /opt/nats-bridge/bin/nats-bridge --version | grep -q "core compiled" \
    && /opt/nats-bridge/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="nats-bridge" \
      org.opencontainers.image.description="Replicates NATS JetStream streams from edge servers into an aggregate stream" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed, numeric UID/GID outside distributions' ranges: file ownership on mounts stays predictable, and
# Kubernetes' runAsNonRoot can verify a numeric USER.
RUN groupadd --system --gid 10001 nats-bridge \
    && useradd --system --uid 10001 --gid nats-bridge --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nats-bridge \
    && install -d -m 0755 /etc/nats-bridge
# Owned by root: the daemon cannot modify its own code. The bytecode was compiled at install time, so the
# image works with a read-only root file system.
COPY --from=builder /opt/nats-bridge /opt/nats-bridge
ENV PATH=/opt/nats-bridge/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The mounted configuration must be readable by this uid or gid (10001): see the top of this file.
USER 10001:10001
EXPOSE 9464
# /healthz answers from the daemon's event loop: a blocked loop fails this check. `nats-bridge health` reads
# http.listen from the configuration and exits 1 on any error status, refused connection or timeout (4 s).
# Kubernetes ignores HEALTHCHECK and uses its probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["nats-bridge", "health", "-c", "/etc/nats-bridge/bridge.toml"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["nats-bridge"]
CMD ["run", "-c", "/etc/nats-bridge/bridge.toml"]
