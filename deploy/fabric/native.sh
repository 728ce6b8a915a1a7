#!/usr/bin/env bash
# A real Fabric 2.5 network without containers, on loopback:
#   one Raft orderer with TLS (channel participation API, no system channel),
#   one peer with the Gateway, the channel joined through osnadmin, and the anchor chaincode
#   run as a service (chaincode/start-server.js) behind the peer's ccaas external builder.
#
#   FABRIC_BIN=/path/to/fabric/bin deploy/fabric/native.sh up    # prints the FABRIC_* env
#   deploy/fabric/native.sh stop-peer | start-peer                 # a peer outage, on demand
#   deploy/fabric/native.sh down                                   # stops what `up` started
#
# Needs, from Fabric 2.5 (the release archive's layout, or a build of the official source):
#   $FABRIC_BIN/{cryptogen,configtxgen,osnadmin,orderer,peer}
#   $FABRIC_CONFIG   orderer.yaml + core.yaml (default: $FABRIC_BIN/../config; from a
#                    source checkout: its sampleconfig/, the same files)
#   $FABRIC_CCAAS    a ccaas external builder, bin/{detect,build,release} (default: this
#                    project's own, deploy/fabric/ccaas/: detect accepts metadata.json
#                    type "ccaas", build copies connection.json, release puts it in
#                    chaincode/server/; Fabric's official one works too)
# Tried against v2.5.12 built from the official source with Go 1.23 (orderer, peer,
# osnadmin, configtxgen, cryptogen), config from sampleconfig/.
# and node with chaincode/node_modules installed (scripts/setup.sh does that).
# Ports: NATIVE_ORDERER_PORT (7050), NATIVE_ORDERER_ADMIN_PORT (7053), NATIVE_PEER_PORT
# (7051), NATIVE_PEER_CC_PORT (7052), NATIVE_CC_PORT (9999), NATIVE_*_OPS_PORT (8443, 9443);
# not ORDERER_*/CORE_* names, which the orderer and peer would read as their settings.
# Everything lives in $FABRIC_NATIVE_DIR (default .fabric-native/ at the repository root);
# `up` writes $FABRIC_NATIVE_DIR/env, the variables tests/fabric/test_real_network.py and
# bench/bench_anchor.py read, and $FABRIC_NATIVE_DIR/settings, what it was started with,
# which `start-peer` and `down` read back (no variable needs giving twice). Logs are
# appended to $FABRIC_NATIVE_DIR/logs/<process>.log across restarts. A failed `up` stops
# whatever it had started (its logs stay for reading; `down` removes them).
set -Eeuo pipefail  # -E: the ERR trap fires inside functions too

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${FABRIC_NATIVE_DIR:-$ROOT/.fabric-native}
# What `up` was started with, for the later commands (given variables still win).
if [ -f "$WORK/settings" ] && [ "${1:-}" != up ]; then
    # shellcheck disable=SC1091
    . "$WORK/settings"
fi
CHANNEL=${CHANNEL:-auditchannel}
CC_NAME=${CC_NAME:-anchor}
CC_LABEL=${CC_NAME}_1.0
ORDERER_PORT=${NATIVE_ORDERER_PORT:-7050}
ORDERER_ADMIN_PORT=${NATIVE_ORDERER_ADMIN_PORT:-7053}
ORDERER_OPS_PORT=${NATIVE_ORDERER_OPS_PORT:-8443}
PEER_PORT=${NATIVE_PEER_PORT:-7051}
PEER_CC_PORT=${NATIVE_PEER_CC_PORT:-7052}
PEER_OPS_PORT=${NATIVE_PEER_OPS_PORT:-9443}
CC_PORT=${NATIVE_CC_PORT:-9999}

need_bin() {
    : "${FABRIC_BIN:?set FABRIC_BIN to the directory holding the Fabric 2.5 binaries}"
    for tool in cryptogen configtxgen osnadmin orderer peer; do
        [ -x "$FABRIC_BIN/$tool" ] || { echo "missing $FABRIC_BIN/$tool" >&2; exit 2; }
    done
    FABRIC_CONFIG=${FABRIC_CONFIG:-$FABRIC_BIN/../config}
    FABRIC_CCAAS=${FABRIC_CCAAS:-$HERE/ccaas}
    [ -f "$FABRIC_CONFIG/core.yaml" ] && [ -f "$FABRIC_CONFIG/orderer.yaml" ] || {
        echo "no core.yaml/orderer.yaml in $FABRIC_CONFIG (set FABRIC_CONFIG)" >&2; exit 2; }
    [ -x "$FABRIC_CCAAS/bin/detect" ] || {
        echo "no ccaas builder in $FABRIC_CCAAS (set FABRIC_CCAAS)" >&2; exit 2; }
    FABRIC_CONFIG=$(cd "$FABRIC_CONFIG" && pwd)
    FABRIC_CCAAS=$(cd "$FABRIC_CCAAS" && pwd)
}

ORG=$WORK/crypto/ordererOrganizations/example.com
O=$ORG/orderers/orderer.example.com
P1=$WORK/crypto/peerOrganizations/org1.example.com
P=$P1/peers/peer0.org1.example.com

# Poll (no fixed sleeps): wait until "$@" succeeds, up to $WAIT_S seconds.
retry() {
    local deadline=$((SECONDS + ${WAIT_S:-60}))
    until "$@" > "$WORK/logs/last-retry.log" 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            echo "gave up: $*" >&2; cat "$WORK/logs/last-retry.log" >&2; return 1
        fi
        sleep 0.5
    done
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port something else already listens on would look "open" to the waits below and fail
# much later with a misleading error (osnadmin's TLS handshake with a stranger): refuse
# it before starting anything.
ports_free() {  # "NAME=port" ...
    local item busy=0
    for item in "$@"; do
        if port_open "${item#*=}"; then
            echo "port ${item#*=} is already in use (set ${item%%=*} to another)" >&2
            busy=1
        fi
    done
    return $busy
}

start_bg() {  # name, command...: run in the background, remember its pid
    local name=$1; shift
    echo "--- $(date -u +%FT%TZ) starting $name" >> "$WORK/logs/$name.log"
    nohup "$@" >> "$WORK/logs/$name.log" 2>&1 &
    echo $! > "$WORK/$name.pid"
}

stop_bg() {
    local file=$WORK/$1.pid
    if [ -f "$file" ]; then
        local pid; pid=$(cat "$file")
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$file"
    fi
}

admin_env() {  # the peer CLI as Org1's admin, against our peer
    export FABRIC_CFG_PATH=$FABRIC_CONFIG
    export CORE_PEER_LOCALMSPID=Org1MSP CORE_PEER_TLS_ENABLED=true
    export CORE_PEER_ADDRESS=127.0.0.1:$PEER_PORT CORE_PEER_TLS_ROOTCERT_FILE=$P/tls/ca.crt
    export CORE_PEER_MSPCONFIGPATH=$P1/users/Admin@org1.example.com/msp
}

crypto() {
    mkdir -p "$WORK/logs"
    "$FABRIC_BIN/cryptogen" generate --config="$HERE/crypto-config.yaml" --output="$WORK/crypto"
    # configtx.yaml's paths are relative to the directory it is read from; the host names
    # are compose's: this copy points them at loopback.
    sed -e "s/orderer:7050/127.0.0.1:$ORDERER_PORT/g" \
        -e "s/- Host: orderer$/- Host: 127.0.0.1/" \
        -e "s/Port: 7050$/Port: $ORDERER_PORT/" \
        "$HERE/configtx.yaml" > "$WORK/crypto/configtx.yaml"
    "$FABRIC_BIN/configtxgen" -configPath "$WORK/crypto" -profile AuditChannel \
        -outputBlock "$WORK/$CHANNEL.block" -channelID "$CHANNEL"
}

start_orderer() {
    mkdir -p "$WORK/orderer"
    FABRIC_CFG_PATH=$FABRIC_CONFIG \
    ORDERER_GENERAL_LISTENADDRESS=127.0.0.1 ORDERER_GENERAL_LISTENPORT=$ORDERER_PORT \
    ORDERER_GENERAL_LOCALMSPID=OrdererMSP ORDERER_GENERAL_LOCALMSPDIR=$O/msp \
    ORDERER_GENERAL_TLS_ENABLED=true \
    ORDERER_GENERAL_TLS_PRIVATEKEY=$O/tls/server.key \
    ORDERER_GENERAL_TLS_CERTIFICATE=$O/tls/server.crt \
    ORDERER_GENERAL_TLS_ROOTCAS="[$O/tls/ca.crt]" \
    ORDERER_GENERAL_CLUSTER_CLIENTCERTIFICATE=$O/tls/server.crt \
    ORDERER_GENERAL_CLUSTER_CLIENTPRIVATEKEY=$O/tls/server.key \
    ORDERER_GENERAL_CLUSTER_ROOTCAS="[$O/tls/ca.crt]" \
    ORDERER_GENERAL_BOOTSTRAPMETHOD=none \
    ORDERER_CHANNELPARTICIPATION_ENABLED=true \
    ORDERER_ADMIN_LISTENADDRESS=127.0.0.1:$ORDERER_ADMIN_PORT \
    ORDERER_ADMIN_TLS_ENABLED=true \
    ORDERER_ADMIN_TLS_PRIVATEKEY=$O/tls/server.key \
    ORDERER_ADMIN_TLS_CERTIFICATE=$O/tls/server.crt \
    ORDERER_ADMIN_TLS_CLIENTAUTHREQUIRED=true \
    ORDERER_ADMIN_TLS_CLIENTROOTCAS="[$O/tls/ca.crt]" \
    ORDERER_OPERATIONS_LISTENADDRESS=127.0.0.1:$ORDERER_OPS_PORT \
    ORDERER_METRICS_PROVIDER=disabled \
    ORDERER_FILELEDGER_LOCATION=$WORK/orderer/ledger \
    ORDERER_CONSENSUS_WALDIR=$WORK/orderer/etcdraft/wal \
    ORDERER_CONSENSUS_SNAPDIR=$WORK/orderer/etcdraft/snapshot \
        start_bg orderer "$FABRIC_BIN/orderer"
    WAIT_S=30 retry port_open "$ORDERER_ADMIN_PORT"
}

start_peer() {
    mkdir -p "$WORK/peer"
    FABRIC_CFG_PATH=$FABRIC_CONFIG \
    CORE_PEER_ID=peer0.org1.example.com \
    CORE_PEER_ADDRESS=127.0.0.1:$PEER_PORT CORE_PEER_LISTENADDRESS=127.0.0.1:$PEER_PORT \
    CORE_PEER_CHAINCODEADDRESS=127.0.0.1:$PEER_CC_PORT \
    CORE_PEER_CHAINCODELISTENADDRESS=127.0.0.1:$PEER_CC_PORT \
    CORE_PEER_GOSSIP_BOOTSTRAP=127.0.0.1:$PEER_PORT \
    CORE_PEER_GOSSIP_EXTERNALENDPOINT=127.0.0.1:$PEER_PORT \
    CORE_PEER_LOCALMSPID=Org1MSP CORE_PEER_MSPCONFIGPATH=$P/msp \
    CORE_PEER_TLS_ENABLED=true CORE_PEER_TLS_CERT_FILE=$P/tls/server.crt \
    CORE_PEER_TLS_KEY_FILE=$P/tls/server.key CORE_PEER_TLS_ROOTCERT_FILE=$P/tls/ca.crt \
    CORE_PEER_GATEWAY_ENABLED=true \
    CORE_PEER_FILESYSTEMPATH=$WORK/peer \
    CORE_LEDGER_STATE_STATEDATABASE=goleveldb \
    CORE_LEDGER_SNAPSHOTS_ROOTDIR=$WORK/peer/snapshots \
    CORE_OPERATIONS_LISTENADDRESS=127.0.0.1:$PEER_OPS_PORT \
    CORE_METRICS_PROVIDER=disabled \
    CORE_VM_ENDPOINT= \
    CORE_CHAINCODE_EXTERNALBUILDERS="[{\"name\":\"ccaas_builder\",\"path\":\"$FABRIC_CCAAS\",\"propagateEnvironment\":[\"CHAINCODE_AS_A_SERVICE_BUILDER_CONFIG\"]}]" \
        start_bg peer "$FABRIC_BIN/peer" node start
    WAIT_S=30 retry port_open "$PEER_PORT"
}

channel() {
    "$FABRIC_BIN/osnadmin" channel join --channelID "$CHANNEL" \
        --config-block "$WORK/$CHANNEL.block" -o "127.0.0.1:$ORDERER_ADMIN_PORT" \
        --ca-file "$O/tls/ca.crt" --client-cert "$O/tls/server.crt" \
        --client-key "$O/tls/server.key"
    # Raft elects its leader about a second after the join: wait for it, do not guess.
    WAIT_S=60 retry bash -c "\"$FABRIC_BIN/osnadmin\" channel list --channelID \"$CHANNEL\" \
        -o 127.0.0.1:$ORDERER_ADMIN_PORT --ca-file \"$O/tls/ca.crt\" \
        --client-cert \"$O/tls/server.crt\" --client-key \"$O/tls/server.key\" \
        | grep -q '\"status\": \"active\"'"
    admin_env
    retry "$FABRIC_BIN/peer" channel join -b "$WORK/$CHANNEL.block"
}

chaincode() {
    admin_env
    local pkg=$WORK/cc
    mkdir -p "$pkg"
    printf '{"address":"127.0.0.1:%s","dial_timeout":"10s","tls_required":false}' \
        "$CC_PORT" > "$pkg/connection.json"
    printf '{"type":"ccaas","label":"%s"}' "$CC_LABEL" > "$pkg/metadata.json"
    tar -C "$pkg" -czf "$pkg/code.tar.gz" connection.json
    tar -C "$pkg" -czf "$WORK/$CC_NAME.tar.gz" metadata.json code.tar.gz
    "$FABRIC_BIN/peer" lifecycle chaincode install "$WORK/$CC_NAME.tar.gz"
    local id
    id=$("$FABRIC_BIN/peer" lifecycle chaincode calculatepackageid "$WORK/$CC_NAME.tar.gz")
    echo "$id" > "$WORK/$CC_NAME.id"
    # The chaincode server gets only its own variables, not the admin CLI's CORE_PEER_*.
    (
        for name in $(compgen -e | grep '^CORE_' || true); do unset "$name"; done
        CHAINCODE_SERVER_ADDRESS=127.0.0.1:$CC_PORT CHAINCODE_ID=$id \
            start_bg chaincode node "$ROOT/chaincode/start-server.js"
    )
    WAIT_S=30 retry port_open "$CC_PORT"
    local orderer=(-o "127.0.0.1:$ORDERER_PORT" --tls --cafile "$O/tls/ca.crt")
    retry "$FABRIC_BIN/peer" lifecycle chaincode approveformyorg "${orderer[@]}" \
        --channelID "$CHANNEL" --name "$CC_NAME" --version 1.0 --package-id "$id" --sequence 1
    retry "$FABRIC_BIN/peer" lifecycle chaincode commit "${orderer[@]}" \
        --channelID "$CHANNEL" --name "$CC_NAME" --version 1.0 --sequence 1 \
        --peerAddresses "127.0.0.1:$PEER_PORT" --tlsRootCertFiles "$P/tls/ca.crt"
    retry "$FABRIC_BIN/peer" lifecycle chaincode querycommitted --channelID "$CHANNEL" \
        --name "$CC_NAME"
    cat "$WORK/logs/last-retry.log"  # the committed definition, as the peer reports it
}

write_env() {
    local user=$P1/users/User1@org1.example.com/msp
    local key
    key=$(ls "$user"/keystore/*_sk | head -1)
    cat > "$WORK/env" <<EOF
export FABRIC_GATEWAY_ENDPOINT=127.0.0.1:$PEER_PORT
export FABRIC_MSPID=Org1MSP
export FABRIC_CERT=$user/signcerts/User1@org1.example.com-cert.pem
export FABRIC_KEY=$key
export FABRIC_TLS_CA=$P/tls/ca.crt
export FABRIC_CHANNEL=$CHANNEL
export FABRIC_CHAINCODE=$CC_NAME
EOF
    cat "$WORK/env"
}

save_settings() {  # as NAME=${NAME:-value}: a variable given later still wins
    local pair
    for pair in FABRIC_BIN="$FABRIC_BIN" FABRIC_CONFIG="$FABRIC_CONFIG" \
            FABRIC_CCAAS="$FABRIC_CCAAS" CHANNEL="$CHANNEL" CC_NAME="$CC_NAME" \
            NATIVE_ORDERER_PORT="$ORDERER_PORT" NATIVE_ORDERER_ADMIN_PORT="$ORDERER_ADMIN_PORT" \
            NATIVE_ORDERER_OPS_PORT="$ORDERER_OPS_PORT" NATIVE_PEER_PORT="$PEER_PORT" \
            NATIVE_PEER_CC_PORT="$PEER_CC_PORT" NATIVE_PEER_OPS_PORT="$PEER_OPS_PORT" \
            NATIVE_CC_PORT="$CC_PORT"; do
        printf '%s=${%s:-%q}\n' "${pair%%=*}" "${pair%%=*}" "${pair#*=}"
    done > "$WORK/settings"
}

stop_all() {
    for name in chaincode peer orderer; do stop_bg "$name"; done
}

down() {
    stop_all
    if [ "${KEEP:-0}" != 1 ]; then rm -rf "$WORK"; fi
}

failed_up() {
    echo "native.sh up failed; stopping what it started; logs in $WORK/logs" \
        "('native.sh down' removes $WORK)" >&2
    stop_all
}

case "${1:-}" in
up)
    need_bin
    [ -e "$WORK" ] && { echo "$WORK exists: run 'native.sh down' first" >&2; exit 2; }
    ports_free NATIVE_ORDERER_PORT="$ORDERER_PORT" \
        NATIVE_ORDERER_ADMIN_PORT="$ORDERER_ADMIN_PORT" \
        NATIVE_ORDERER_OPS_PORT="$ORDERER_OPS_PORT" NATIVE_PEER_PORT="$PEER_PORT" \
        NATIVE_PEER_CC_PORT="$PEER_CC_PORT" NATIVE_PEER_OPS_PORT="$PEER_OPS_PORT" \
        NATIVE_CC_PORT="$CC_PORT" || exit 2
    mkdir -p "$WORK/logs"
    save_settings
    trap failed_up ERR
    crypto
    start_orderer
    start_peer
    channel
    chaincode
    write_env
    ;;
stop-peer)
    stop_bg peer
    ;;
start-peer)
    need_bin
    ports_free NATIVE_PEER_PORT="$PEER_PORT" NATIVE_PEER_CC_PORT="$PEER_CC_PORT" \
        NATIVE_PEER_OPS_PORT="$PEER_OPS_PORT" || exit 2
    start_peer
    ;;
down)
    down
    ;;
*)
    echo "usage: native.sh up|stop-peer|start-peer|down" >&2
    exit 2
    ;;
esac
