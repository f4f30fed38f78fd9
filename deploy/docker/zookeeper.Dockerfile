# ZooKeeper from Debian's packages (bookworm: 3.8.0), the jar the tests run, as one
# member of an ensemble configured by ZOO_* variables (deploy/docker/zookeeper-entrypoint.sh).
# libzookeeper-java is the server itself; Debian's `zookeeper` package only adds scripts and
# ZooInspector, which would pull in a desktop JRE (GTK, Mesa) for nothing.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# The JRE's postinst links its man page: slim images have no /usr/share/man/man1.
# netcat for the health check (`srvr`).
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       libzookeeper-java default-jre-headless netcat-openbsd \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10002 --no-create-home --shell /usr/sbin/nologin zookeeper \
    && mkdir -p /data /conf && chown zookeeper:zookeeper /data /conf
COPY deploy/docker/zookeeper-entrypoint.sh /usr/local/bin/zookeeper-entrypoint
USER zookeeper
# 2281: clients over TLS; 2181 answers only inside the container (the health check).
EXPOSE 2281 2888 3888
ENTRYPOINT ["zookeeper-entrypoint"]
