'use strict';
// Starts the chaincode the way Fabric's chaincode-as-a-service docs configure it: from
// CHAINCODE_SERVER_ADDRESS (host:port to listen on) and CHAINCODE_ID (the package id the
// peer calculated). fabric-chaincode-node itself reads only flags or CORE_* variables, so
// this maps one onto the other. Without CHAINCODE_SERVER_ADDRESS it falls back to the
// peer-launched mode (`fabric-chaincode-node start`, flags passed through).
const { spawn } = require('child_process');
const path = require('path');

const binary = path.join(__dirname, 'node_modules', '.bin', 'fabric-chaincode-node');
const address = process.env.CHAINCODE_SERVER_ADDRESS;
const id = process.env.CHAINCODE_ID;
let args;
if (address) {
    if (!id) {
        console.error('CHAINCODE_ID is required with CHAINCODE_SERVER_ADDRESS (the package id from `peer lifecycle chaincode calculatepackageid`)');
        process.exit(2);
    }
    args = ['server', '--chaincode-address', address, '--chaincode-id', id, '--module-path', __dirname];
    if (process.env.CHAINCODE_TLS_KEY_FILE && process.env.CHAINCODE_TLS_CERT_FILE) {
        args.push('--chaincode-tls-key-file', process.env.CHAINCODE_TLS_KEY_FILE,
            '--chaincode-tls-cert-file', process.env.CHAINCODE_TLS_CERT_FILE);
        if (process.env.CHAINCODE_TLS_CLIENT_CACERT_FILE) {
            args.push('--chaincode-tls-client-cacert-file', process.env.CHAINCODE_TLS_CLIENT_CACERT_FILE);
        }
    }
} else {
    args = ['start', ...process.argv.slice(2)];
}
const child = spawn(binary, args, { stdio: 'inherit', cwd: __dirname });
for (const signal of ['SIGINT', 'SIGTERM']) {
    process.on(signal, () => child.kill(signal));
}
child.on('exit', (code, signal) => process.exit(code === null ? (signal ? 1 : 0) : code));
