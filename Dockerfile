# The project's image: data-server (and its fleet and load generator), search-server
# and the discovery tool, on Debian's own Python (bookworm: 3.11.2).
#
# Dependencies come from the wheelhouse that `make image` builds on the host
# (deploy/docker/wheelhouse/), so the build needs no Python package index; with an empty
# wheelhouse they come from the index instead. The project itself is always built from
# the sources copied here, so the image never runs a stale wheel.
# ZooKeeper, Redis and Prometheus have their own images (deploy/docker/).
ARG BASE_IMAGE=debian:bookworm-slim

# Debian's python3 in a venv: also what `make image` asks for the marker environment
# (python_full_version and the like) that the wheelhouse has to satisfy.
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/discovery/bin:$PATH
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/discovery \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin discovery

FROM runtime AS app
COPY deploy/docker/wheelhouse /tmp/wheels
COPY pyproject.toml README.md CHANGELOG.md MANIFEST.in /tmp/src/
COPY discovery /tmp/src/discovery
COPY data_server /tmp/src/data_server
COPY search_server /tmp/src/search_server
RUN set -e; \
    if ls /tmp/wheels/*.whl >/dev/null 2>&1; then \
        echo "installing from the wheelhouse, no package index"; \
        pip install --no-index --find-links /tmp/wheels /tmp/src; \
    else \
        echo "empty wheelhouse: installing from the package index"; \
        pip install /tmp/src; \
    fi; \
    rm -rf /tmp/wheels /tmp/src; \
    search-server --version; data-server --version; discovery --version; \
    install -d -o discovery -g discovery -m 0700 /var/lib/discovery

USER discovery
# Search server, one data server, a fleet's first port. Every setting is a flag or a
# DISCOVERY_* variable: `docker run IMAGE data-server --help`.
EXPOSE 8080 9001 9100
CMD ["search-server", "--help"]
