'use strict';
// Drives a Gateway (the peer double) with the official Node client and prints JSON:
//   node drive.js ENDPOINT MSPID CERT KEY CHANNEL CHAINCODE ORIGIN VERIFIER_KEY NOTE
const fs = require('fs');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const { connect, signers } = require('@hyperledger/fabric-gateway');

async function main() {
    const [endpoint, mspId, certPath, keyPath, channel, chaincode, origin, verifierKey, note] = process.argv.slice(2);
    const client = new grpc.Client(endpoint, grpc.credentials.createInsecure());
    const gateway = connect({
        client,
        identity: { mspId, credentials: fs.readFileSync(certPath) },
        signer: signers.newPrivateKeySigner(crypto.createPrivateKey(fs.readFileSync(keyPath))),
        hash: undefined,
    });
    const out = {};
    try {
        const contract = gateway.getNetwork(channel).getContract(chaincode);
        out.init = JSON.parse(Buffer.from(await contract.submitTransaction('InitLog', origin, verifierKey)).toString());
        const proposal = contract.newProposal('AnchorCheckpoint', { arguments: [note, '[]'] });
        const transaction = await proposal.endorse();
        const commit = await transaction.submit();
        const status = await commit.getStatus();
        out.anchor = { txId: transaction.getTransactionId(), valid: status.successful, code: status.code, block: String(status.blockNumber) };
        out.latest = JSON.parse(Buffer.from(await contract.evaluateTransaction('GetLatest', origin)).toString());
        try {
            await contract.submitTransaction('AnchorCheckpoint', 'garbage', '[]');
            out.refusal = 'none';
        } catch (error) {
            out.refusal = { name: error.name, code: error.code, details: (error.details || []).map((d) => d.message) };
        }
    } finally {
        gateway.close();
        client.close();
    }
    process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((error) => {
    process.stderr.write(String(error && error.stack || error) + '\n');
    process.exit(1);
});
