# Redis and Redis Sentinel from Debian's packages (bookworm: 7.0), the versions the tests run,
# and Debian's prometheus-redis-exporter. The compose file runs `redis-server-entrypoint ...`
# for the primary and its replica, `redis-sentinel-entrypoint` for each sentinel and
# `redis-exporter-entrypoint` for the exporter: each writes its credentials from the
# container's secrets (docker-compose.yml, make compose-secrets) where only it reads them.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       redis-server redis-sentinel prometheus-redis-exporter \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data /conf && chown redis:redis /data /conf
COPY deploy/docker/redis-server-entrypoint.sh /usr/local/bin/redis-server-entrypoint
COPY deploy/docker/redis-sentinel-entrypoint.sh /usr/local/bin/redis-sentinel-entrypoint
COPY deploy/docker/redis-exporter-entrypoint.sh /usr/local/bin/redis-exporter-entrypoint
USER redis
WORKDIR /data
EXPOSE 6379 26379 9121
# No Redis without a password: the ACL users come from /run/secrets/redis_users.
CMD ["redis-server-entrypoint"]
