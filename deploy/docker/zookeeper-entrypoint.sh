#!/bin/sh
# Write zoo.cfg from the environment and run one ZooKeeper server in the foreground.
#
#   ZOO_MY_ID     this server's id in the ensemble (1..255); unset: standalone
#   ZOO_SERVERS   "server.1=zk1:2888:3888;2181 server.2=..." (the official image's form)
#   ZOO_TICK_TIME, ZOO_INIT_LIMIT, ZOO_SYNC_LIMIT, ZOO_MAX_CLIENT_CNXNS,
#   ZOO_4LW_COMMANDS_WHITELIST, ZOO_MAX_SESSION_TIMEOUT
#   ZOO_CFG_EXTRA whitespace-separated extra zoo.cfg lines
#   JVM_FLAGS     extra JVM flags (default: a small heap and serial GC)
set -eu

CFG=/conf/zoo.cfg
{
    echo "dataDir=/data"
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
    for line in ${ZOO_CFG_EXTRA:-}; do echo "$line"; done
    if [ -n "${ZOO_MY_ID:-}" ]; then
        for server in ${ZOO_SERVERS:?ZOO_SERVERS is required with ZOO_MY_ID}; do echo "$server"; done
    fi
} >"$CFG"

if [ -n "${ZOO_MY_ID:-}" ]; then
    echo "$ZOO_MY_ID" >/data/myid
    MAIN=org.apache.zookeeper.server.quorum.QuorumPeerMain
else
    MAIN=org.apache.zookeeper.server.ZooKeeperServerMain
fi

# shellcheck disable=SC2086  # JVM_FLAGS is a list of flags
exec java ${JVM_FLAGS:--Xms64m -Xmx512m -XX:+UseSerialGC} \
    -Djava.net.preferIPv4Stack=true -Dzookeeper.jmx.log4j.disable=true \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
    "$MAIN" "$CFG"
