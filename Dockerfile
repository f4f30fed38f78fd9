# One image for every process of the project: data-server (and its fleet and load
# generator), search-server and the discovery tool. ZooKeeper, Redis and Prometheus
# run from their own official images (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs to build (setuptools reads README.md as the long description).
COPY pyproject.toml README.md /tmp/src/
COPY discovery /tmp/src/discovery
COPY data_server /tmp/src/data_server
COPY search_server /tmp/src/search_server
RUN pip install /tmp/src && rm -rf /tmp/src \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin discovery

USER discovery
# Search server, one data server, a fleet's first port. Every setting is a flag or a
# DISCOVERY_* variable: `docker run IMAGE data-server --help`.
EXPOSE 8080 9001 9100
CMD ["search-server", "--help"]
