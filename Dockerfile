# ipybox as a container image, for machines that can't sandbox kernels themselves (macOS, Windows,
# locked-down Linux): the container is the isolation boundary.
#
#   scripts/docker-build                         # wheels on the host, then this build (needs no network)
#   docker run -i --rm -v "$PWD:/workspace" ipybox        # an MCP server on stdio for the workspace $PWD
#   docker run -it --rm -v "$PWD:/workspace" ipybox ipybox doctor
#
# Build it with scripts/docker-build: it puts wheels of ipybox (.cache/docker-wheels/ipybox) and every
# dependency (.cache/docker-wheels/deps) into .cache/docker-wheels, the only part of the checkout the build sees (.dockerignore), and they are
# installed with --no-index. The user is not root and has the uid/gid given as build arguments (default:
# those of whoever runs scripts/docker-build), so files written to the mounted /workspace belong to that
# user on the host.
#
# The default command serves MCP on stdio with kernels unsandboxed, and says so once on stderr:
# bubblewrap can't create namespaces under a container runtime's default confinement (see `ipybox
# doctor` in the container). A workspace whose ipybox.toml enables the sandbox fails to start, with that
# explanation and the `docker run` flags that would let bubblewrap nest; it never runs unsandboxed.

# Any Debian-like image. Debian 12's python3 is 3.11, which scripts/docker-build picks wheels for
# (PYTHON_VERSION=... for another).
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS venv
# What the base lacks comes from its package repository (a base built with everything, as
# scripts/test-docker's is, makes this a no-op and the build offline).
RUN missing=""; \
    for package in python3 python3-venv; do \
      dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; \
    done; \
    if [ -n "$missing" ]; then \
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing; \
    fi
# The dependencies here, ipybox itself in the last layer: a change to ipybox's code rebuilds only that.
# Compiled (pip's default): a short-lived container would compile at every start, and lose the .pyc files.
COPY .cache/docker-wheels/deps/ /tmp/wheels/
RUN python3 -m venv /opt/ipybox \
    && /opt/ipybox/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --no-deps \
       /tmp/wheels/*.whl

FROM ${BASE}
ARG IPYBOX_UID=1000
ARG IPYBOX_GID=1000
# python3 runs the venv; nodejs and npm (npx) run npm-published MCP servers; bubblewrap lets `ipybox
# doctor` say whether the sandbox nests; tini is PID 1, forwarding signals and reaping orphans (kernels
# leave some).
RUN missing=""; \
    for package in python3 nodejs npm bubblewrap tini ca-certificates; do \
      dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; \
    done; \
    if [ -n "$missing" ]; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing \
      && rm -rf /var/lib/apt/lists/*; \
    fi
RUN if [ "$IPYBOX_UID" = 0 ]; then \
      echo "IPYBOX_UID=0: the image runs as a user other than root; give your own uid" >&2; exit 1; \
    fi; \
    getent group "$IPYBOX_GID" >/dev/null || groupadd --gid "$IPYBOX_GID" ipybox; \
    getent passwd "$IPYBOX_UID" >/dev/null \
      || useradd --uid "$IPYBOX_UID" --gid "$IPYBOX_GID" --no-create-home --home-dir /home/ipybox \
         --shell /bin/bash ipybox; \
    install -d -o "$IPYBOX_UID" -g "$IPYBOX_GID" -m 0755 /home/ipybox /workspace
# The user owns the venv, so that `!pip install` in a kernel works (the container is the boundary: code
# in an unsandboxed kernel runs as the same user as ipybox anyway).
COPY --from=venv --chown=${IPYBOX_UID}:${IPYBOX_GID} /opt/ipybox /opt/ipybox
COPY --chown=${IPYBOX_UID}:${IPYBOX_GID} .cache/docker-wheels/ipybox/ /tmp/ipybox-wheel/
USER ${IPYBOX_UID}:${IPYBOX_GID}
RUN /opt/ipybox/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --no-deps \
       /tmp/ipybox-wheel/*.whl \
    && /opt/ipybox/bin/pip check \
    && rm -rf /tmp/ipybox-wheel \
    && /opt/ipybox/bin/ipybox --help >/dev/null
ENV PATH=/opt/ipybox/bin:$PATH \
    HOME=/home/ipybox \
    IPYBOX_IN_CONTAINER=1
WORKDIR /workspace
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["ipybox", "mcp", "--workspace", "/workspace"]
