#!/usr/bin/env bash
# Steps for compose.yaml's Fabric network, run inside the fabric-tools container
# (FABRIC_CFG_PATH=/deploy: the peer CLI reads deploy/fabric/core.yaml):
#   crypto   cryptogen material and the channel's genesis block
#   channel  join the orderer (channel participation API) and the peer
#   package  build the chaincode-as-a-service package, install it, print its id
#   approve  approve and commit the chaincode definition (sequence 1)
set -euo pipefail
M=/material
CHANNEL=${CHANNEL:-auditchannel}
CC_NAME=${CC_NAME:-anchor}
CC_LABEL=${CC_NAME}_1.0
ORDERER_TLS=$M/ordererOrganizations/example.com/orderers/orderer.example.com/tls
PEER_TLS=$M/peerOrganizations/org1.example.com/peers/peer0.org1.example.com/tls
export CORE_PEER_LOCALMSPID=Org1MSP CORE_PEER_TLS_ENABLED=true CORE_PEER_ADDRESS=peer0:7051
export CORE_PEER_TLS_ROOTCERT_FILE=$PEER_TLS/ca.crt
export CORE_PEER_MSPCONFIGPATH=$M/peerOrganizations/org1.example.com/users/Admin@org1.example.com/msp

case "${1:-}" in
crypto)
    cryptogen generate --config=/deploy/crypto-config.yaml --output=$M
    # The service's client key under a fixed name (cryptogen names it after its SKI).
    keystore=$M/peerOrganizations/org1.example.com/users/User1@org1.example.com/msp/keystore
    cp "$keystore"/*_sk "$keystore/priv_sk" 2>/dev/null || true
    # configtx.yaml's paths are relative to the directory it is read from: read a copy
    # placed beside the material.
    cp /deploy/configtx.yaml $M/configtx.yaml
    configtxgen -configPath $M -profile AuditChannel -outputBlock $M/$CHANNEL.block \
        -channelID $CHANNEL
    ;;
channel)
    osnadmin channel join --channelID $CHANNEL --config-block $M/$CHANNEL.block \
        -o orderer:7053 --ca-file $ORDERER_TLS/ca.crt \
        --client-cert $ORDERER_TLS/server.crt --client-key $ORDERER_TLS/server.key
    sleep 2  # Raft elects its leader
    peer channel join -b $M/$CHANNEL.block
    ;;
package)
    work=$(mktemp -d)
    printf '{"address":"anchor-chaincode:9999","dial_timeout":"10s","tls_required":false}' \
        > "$work/connection.json"
    printf '{"type":"ccaas","label":"%s"}' "$CC_LABEL" > "$work/metadata.json"
    tar -C "$work" -czf "$work/code.tar.gz" connection.json
    tar -C "$work" -czf $M/$CC_NAME.tar.gz metadata.json code.tar.gz
    peer lifecycle chaincode install $M/$CC_NAME.tar.gz
    peer lifecycle chaincode calculatepackageid $M/$CC_NAME.tar.gz | tee $M/$CC_NAME.id
    ;;
approve)
    id=$(cat $M/$CC_NAME.id)
    peer lifecycle chaincode approveformyorg -o orderer:7050 --tls --cafile $ORDERER_TLS/ca.crt \
        --channelID $CHANNEL --name $CC_NAME --version 1.0 --package-id "$id" --sequence 1
    peer lifecycle chaincode commit -o orderer:7050 --tls --cafile $ORDERER_TLS/ca.crt \
        --channelID $CHANNEL --name $CC_NAME --version 1.0 --sequence 1 \
        --peerAddresses peer0:7051 --tlsRootCertFiles $PEER_TLS/ca.crt
    ;;
*)
    echo "usage: network.sh crypto|channel|package|approve" >&2
    exit 2
    ;;
esac
