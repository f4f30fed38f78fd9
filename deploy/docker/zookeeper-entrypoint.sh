#!/bin/sh
# Write zoo.cfg from the environment and run one ZooKeeper server in the foreground.
#
#   ZOO_MY_ID     this server's id in the ensemble (1..255); unset: standalone
#   ZOO_SERVERS   "server.1=zk1:2888:3888 server.2=..." (the official image's form)
#   ZOO_TICK_TIME, ZOO_INIT_LIMIT, ZOO_SYNC_LIMIT, ZOO_MAX_CLIENT_CNXNS,
#   ZOO_4LW_COMMANDS_WHITELIST, ZOO_MAX_SESSION_TIMEOUT
#   ZOO_CFG_EXTRA whitespace-separated extra zoo.cfg lines
#   ZOO_CONF_DIR, ZOO_DATA_DIR   where zoo.cfg and the data go (/conf, /data)
#   JVM_FLAGS     extra JVM flags (default: a small heap and serial GC)
#
# TLS (docs/design/security.md, "ZooKeeper transport: TLS"):
#   ZOO_TLS_KEYSTORE     PEM file: this server's private key, then its certificate
#                        (naming the host as clients write it). Set: clients are served
#                        over TLS only, on ZOO_SECURE_CLIENT_PORT (2281, every
#                        interface); the plaintext port 2181 then listens on 127.0.0.1
#                        only, inside the container, for the health check's `srvr`.
#   ZOO_TLS_TRUSTSTORE   PEM CA certificates; with ZOO_TLS_KEYSTORE, required
#   ZOO_TLS_CLIENT_AUTH  need (default: every client presents a certificate of that
#                        CA), want or none
#   ZOO_QUORUM_TLS_KEYSTORE, ZOO_QUORUM_TLS_TRUSTSTORE
#                        set (both): the quorum and election connections (2888, 3888)
#                        speak TLS too, each member presenting a certificate of the
#                        quorum trust store's CA and requiring one from its peer
set -eu

CONF_DIR=${ZOO_CONF_DIR:-/conf}
DATA_DIR=${ZOO_DATA_DIR:-/data}
CFG=$CONF_DIR/zoo.cfg
CLASSPATH=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
{
    echo "dataDir=$DATA_DIR"
    echo "clientPort=2181"
    echo "tickTime=${ZOO_TICK_TIME:-2000}"
    echo "initLimit=${ZOO_INIT_LIMIT:-10}"
    echo "syncLimit=${ZOO_SYNC_LIMIT:-5}"
    echo "maxClientCnxns=${ZOO_MAX_CLIENT_CNXNS:-60}"
    echo "maxSessionTimeout=${ZOO_MAX_SESSION_TIMEOUT:-60000}"
    echo "4lw.commands.whitelist=${ZOO_4LW_COMMANDS_WHITELIST:-ruok,srvr,mntr}"
    echo "admin.enableServer=false"
    # A restarted member rejoins under the same name at a new address.
    echo "quorumListenOnAllIPs=true"
    if [ -n "${ZOO_TLS_KEYSTORE:-}" ]; then
        echo "clientPortAddress=127.0.0.1"
        echo "secureClientPort=${ZOO_SECURE_CLIENT_PORT:-2281}"
        # The default NIO factory has no TLS.
        echo "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory"
        echo "ssl.keyStore.location=$ZOO_TLS_KEYSTORE"
        echo "ssl.keyStore.type=PEM"
        echo "ssl.trustStore.location=${ZOO_TLS_TRUSTSTORE:?ZOO_TLS_TRUSTSTORE is required with ZOO_TLS_KEYSTORE}"
        echo "ssl.trustStore.type=PEM"
        echo "ssl.clientAuth=${ZOO_TLS_CLIENT_AUTH:-need}"
    fi
    if [ -n "${ZOO_QUORUM_TLS_KEYSTORE:-}" ]; then
        echo "sslQuorum=true"
        echo "ssl.quorum.keyStore.location=$ZOO_QUORUM_TLS_KEYSTORE"
        echo "ssl.quorum.keyStore.type=PEM"
        echo "ssl.quorum.trustStore.location=${ZOO_QUORUM_TLS_TRUSTSTORE:?ZOO_QUORUM_TLS_TRUSTSTORE is required with ZOO_QUORUM_TLS_KEYSTORE}"
        echo "ssl.quorum.trustStore.type=PEM"
        echo "ssl.quorum.clientAuth=need"
        # The quorum CA signs the members' certificates and nothing else: its chain is
        # the check. A name check would compare a peer's certificate with the name of its
        # address, which on a compose network is the container's, not zkN.
        echo "ssl.quorum.hostnameVerification=false"
    fi
    for line in ${ZOO_CFG_EXTRA:-}; do echo "$line"; done
    if [ -n "${ZOO_MY_ID:-}" ]; then
        for server in ${ZOO_SERVERS:?ZOO_SERVERS is required with ZOO_MY_ID}; do echo "$server"; done
    fi
} >"$CFG"

if [ -n "${ZOO_TLS_KEYSTORE:-}" ]; then
    # Netty's codec, which Debian's zookeeper.jar manifest leaves out: without it the
    # Netty factory starts, then closes every connection it accepts.
    CLASSPATH=$CLASSPATH:/usr/share/java/netty-codec.jar
fi

if [ -n "${ZOO_MY_ID:-}" ]; then
    echo "$ZOO_MY_ID" >"$DATA_DIR/myid"
    MAIN=org.apache.zookeeper.server.quorum.QuorumPeerMain
else
    MAIN=org.apache.zookeeper.server.ZooKeeperServerMain
fi

# shellcheck disable=SC2086  # JVM_FLAGS is a list of flags
exec java ${JVM_FLAGS:--Xms64m -Xmx512m -XX:+UseSerialGC} \
    -Djava.net.preferIPv4Stack=true -Dzookeeper.jmx.log4j.disable=true \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -cp "$CLASSPATH" \
    "$MAIN" "$CFG"
