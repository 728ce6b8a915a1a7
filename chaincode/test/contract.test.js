'use strict';

const { test, beforeEach } = require('node:test');
const assert = require('node:assert');
const path = require('path');
const AnchorContract = require('../lib/anchor-contract');
const { FakeStub, invoke } = require('./fake-stub');

const vectors = require(path.join(__dirname, '..', '..', 'tests', 'vectors', 'checkpoints.json'));
const proofJson = (hashes) => JSON.stringify(hashes);

let contract;
let stub;

beforeEach(async () => {
    contract = new AnchorContract();
    stub = new FakeStub();
    await invoke(contract, stub, 'InitLog', vectors.origin, vectors.verifier_key);
});

async function anchorSequence() {
    for (const step of vectors.sequence) {
        await invoke(contract, stub, 'AnchorCheckpoint', step.note, proofJson(step.consistency_from_previous));
    }
}

function refusedWith(code) {
    return (error) => error.code === code && error.message.startsWith(`${code}: `);
}

test('a genuine sequence of checkpoints is accepted, with an event each', async () => {
    await anchorSequence();
    const latest = await invoke(contract, stub, 'GetLatest', vectors.origin);
    assert.strictEqual(latest.size, 64);
    assert.deepStrictEqual(stub.events.map((e) => e.payload.size), [3, 8, 21, 64]);
    const eight = await invoke(contract, stub, 'GetCheckpoint', vectors.origin, '8');
    assert.strictEqual(eight.note, vectors.sequence[1].note);
});

test('re-submitting an anchored checkpoint is refused, naming the ORIGINAL tx id', async () => {
    await anchorSequence();
    const original = await invoke(contract, stub, 'GetLatest', vectors.origin);
    // Refused at endorsement, so no transaction is ordered (an accepted no-op would
    // still commit and use up a block); the error names the transaction that stored it.
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.sequence[3].note, '[]'),
        (e) => refusedWith('ALREADY_ANCHORED')(e) && e.message.includes(original.txId));
    assert.strictEqual(stub.events.length, 4);
    const stored = await invoke(contract, stub, 'GetCheckpoint', vectors.origin, '64');
    assert.strictEqual(stored.txId, original.txId);
});

// The front-running jam: a channel member takes the service's public note, re-spells it
// so that Node's lenient base64 still verifies, and anchors it first. Every spelling other
// than the canonical one is refused, so the service's own note is what gets stored.
function respelled(note, how) {
    const at = note.lastIndexOf('\n\n') + 2;
    const body = note.slice(0, at);
    const line = note.slice(at, -1);
    const [prefix, blob] = [line.slice(0, line.lastIndexOf(' ')), line.slice(line.lastIndexOf(' ') + 1)];
    switch (how) {
    case 'junk character':
        return `${body}${prefix} ${blob.slice(0, 10)}!${blob.slice(10)}\n`;
    case 'stripped padding':
        return `${body}${prefix} ${blob.replace(/=+$/, '')}\n`;
    case 'extra field':
        return `${body}${prefix} ${blob} extra\n`;
    case '101 signature lines':
        return body + `${line}\n`.repeat(101);
    case 'padding bits': {
        const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
        const last = blob[blob.length - 2];
        const changed = alphabet[alphabet.indexOf(last) | 1];
        assert.notStrictEqual(changed, last);
        return `${body}${prefix} ${blob.slice(0, -2)}${changed}=\n`;
    }
    case 'corrupted copy': {
        const raw = Buffer.from(blob, 'base64');
        raw[raw.length - 1] ^= 1;
        return `${body}${prefix} ${raw.toString('base64')}\n${line}\n`;
    }
    case '512 KiB note':
        return `${body}${line}\n${'\u2014 other AAAAAAAA\n'.repeat(512 * 1024 / 16)}`;
    default:
        throw new Error(how);
    }
}

for (const how of ['junk character', 'stripped padding', 'extra field', '101 signature lines',
    'padding bits', 'corrupted copy', '512 KiB note']) {
    test(`front-running jam refused: ${how}`, async () => {
        const first = vectors.sequence[0];
        const second = vectors.sequence[1];
        await invoke(contract, stub, 'AnchorCheckpoint', first.note, '[]');
        const jam = respelled(second.note, how);
        assert.notStrictEqual(jam, second.note);
        const code = how === 'corrupted copy' ? 'BAD_SIGNATURE' : 'MALFORMED';
        await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', jam, proofJson(second.consistency_from_previous)),
            refusedWith(code));
        // The genuine note still anchors, and is what the chain holds.
        await invoke(contract, stub, 'AnchorCheckpoint', second.note, proofJson(second.consistency_from_previous));
        const latest = await invoke(contract, stub, 'GetLatest', vectors.origin);
        assert.strictEqual(latest.note, second.note);
    });
}

test('a proof larger than 64 KiB is refused', async () => {
    const huge = JSON.stringify(Array(1100).fill('ab'.repeat(32)));
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.sequence[0].note, huge),
        refusedWith('MALFORMED'));
});

test('each anchored checkpoint records the transaction that stored it', async () => {
    await anchorSequence();
    const txIds = [];
    for (const size of ['3', '8', '21', '64']) {
        txIds.push((await invoke(contract, stub, 'GetCheckpoint', vectors.origin, size)).txId);
    }
    assert.strictEqual(new Set(txIds).size, 4);
    assert.ok(txIds.every((t) => /^tx[0-9]+$/.test(t)));
});

test('rollback to a smaller tree is refused', async () => {
    await anchorSequence();
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.rollback.note, '[]'), refusedWith('ROLLBACK'));
});

test('a fork (same size, other root) is refused', async () => {
    await anchorSequence();
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.fork.note, '[]'), refusedWith('FORK'));
});

test('a checkpoint signed by another key is refused', async () => {
    await anchorSequence();
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.bad_signature, '[]'), refusedWith('BAD_SIGNATURE'));
});

test('an extension without a valid consistency proof is refused', async () => {
    await invoke(contract, stub, 'AnchorCheckpoint', vectors.sequence[0].note, '[]');
    await invoke(contract, stub, 'AnchorCheckpoint', vectors.sequence[1].note, proofJson(vectors.sequence[1].consistency_from_previous));
    await invoke(contract, stub, 'AnchorCheckpoint', vectors.sequence[2].note, proofJson(vectors.sequence[2].consistency_from_previous));
    const bad = vectors.bad_proof_extension;
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', bad.note, proofJson(bad.consistency_from_21)), refusedWith('BAD_PROOF'));
    const latest = await invoke(contract, stub, 'GetLatest', vectors.origin);
    assert.strictEqual(latest.size, 21);
});

test('an unknown origin is refused', async () => {
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.unknown_origin, '[]'), refusedWith('UNKNOWN_ORIGIN'));
});

test('malformed input is refused', async () => {
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', 'not a note', '[]'), refusedWith('MALFORMED'));
    await assert.rejects(invoke(contract, stub, 'AnchorCheckpoint', vectors.sequence[0].note, '{"x":1}'), refusedWith('MALFORMED'));
    await assert.rejects(invoke(contract, stub, 'GetCheckpoint', vectors.origin, '-1'), refusedWith('MALFORMED'));
});

test('a log is registered once; another key for the same origin is refused', async () => {
    const again = await invoke(contract, stub, 'InitLog', vectors.origin, vectors.verifier_key);
    assert.strictEqual(again.origin, vectors.origin);
    await assert.rejects(invoke(contract, stub, 'InitLog', vectors.origin, vectors.other_verifier_key), refusedWith('LOG_EXISTS'));
    await assert.rejects(invoke(contract, stub, 'InitLog', 'wrong-name', vectors.verifier_key), refusedWith('MALFORMED'));
});

test('history is paginated in size order', async () => {
    await anchorSequence();
    const first = await invoke(contract, stub, 'GetHistory', vectors.origin, '3', '');
    assert.deepStrictEqual(first.checkpoints.map((c) => c.size), [3, 8, 21]);
    const second = await invoke(contract, stub, 'GetHistory', vectors.origin, '3', first.bookmark);
    assert.deepStrictEqual(second.checkpoints.map((c) => c.size), [64]);
});
