'use strict';
// C2SP signed notes with Ed25519 and tlog-checkpoint bodies, as in ledger/checkpoint.py.

const crypto = require('crypto');

const SIGNATURE_PREFIX = '\u2014 ';
const ED25519_SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

class NoteError extends Error {
    constructor(kind, message) {
        super(message);
        this.kind = kind; // 'malformed' | 'bad signature'
    }
}

function keyHash(name, publicKey) {
    return crypto.createHash('sha256')
        .update(Buffer.from(name + '\n', 'utf8')).update(Buffer.from([1])).update(publicKey)
        .digest().subarray(0, 4);
}

function parseVerifierKey(text) {
    const parts = String(text).trim().split('+');
    if (parts.length < 3) {
        throw new NoteError('malformed', 'verifier key must be name+hash+key');
    }
    const [name, hashHex] = parts;
    const raw = Buffer.from(parts.slice(2).join('+'), 'base64');
    if (raw.length !== 33 || raw[0] !== 1) {
        throw new NoteError('malformed', 'only Ed25519 verifier keys are supported');
    }
    const publicKey = raw.subarray(1);
    if (keyHash(name, publicKey).toString('hex') !== hashHex) {
        throw new NoteError('malformed', 'verifier key hash does not match its key');
    }
    return { name, publicKey, keyHash: keyHash(name, publicKey) };
}

function splitNote(note) {
    const text = Buffer.isBuffer(note) ? note.toString('utf8') : String(note);
    const at = text.lastIndexOf('\n\n');
    if (at < 0 || !text.endsWith('\n')) {
        throw new NoteError('malformed', 'note has no signature block');
    }
    const body = text.slice(0, at + 1);
    const signatures = text.slice(at + 2, -1).split('\n').map((line) => {
        if (!line.startsWith(SIGNATURE_PREFIX)) {
            throw new NoteError('malformed', 'malformed signature line');
        }
        const [name, blob] = line.slice(SIGNATURE_PREFIX.length).split(' ');
        const raw = Buffer.from(blob || '', 'base64');
        if (!name || raw.length < 5) {
            throw new NoteError('malformed', 'malformed signature line');
        }
        return { name, keyHash: raw.subarray(0, 4), signature: raw.subarray(4) };
    });
    return { body, signatures };
}

function parseCheckpointBody(body) {
    const lines = body.slice(0, -1).split('\n');
    if (lines.length < 3) {
        throw new NoteError('malformed', 'checkpoint needs origin, size and root lines');
    }
    const [origin, sizeText, rootText] = lines;
    if (!origin || !/^(0|[1-9][0-9]*)$/.test(sizeText)) {
        throw new NoteError('malformed', `bad origin or tree size ${JSON.stringify(sizeText)}`);
    }
    const root = Buffer.from(rootText, 'base64');
    if (root.length !== 32 || root.toString('base64') !== rootText) {
        throw new NoteError('malformed', 'root hash must be 32 bytes of base64');
    }
    return { origin, size: Number(sizeText), sizeText, root };
}

// Parse without trusting: the origin is needed to find the key that must have signed.
function peekCheckpoint(note) {
    return parseCheckpointBody(splitNote(note).body);
}

function openCheckpoint(note, verifierKey) {
    const { body, signatures } = splitNote(note);
    const key = crypto.createPublicKey({
        key: Buffer.concat([ED25519_SPKI_PREFIX, verifierKey.publicKey]), format: 'der', type: 'spki',
    });
    const ours = signatures.filter((s) => s.name === verifierKey.name && s.keyHash.equals(verifierKey.keyHash));
    if (!ours.length) {
        throw new NoteError('bad signature', `note carries no signature by key ${verifierKey.name}`);
    }
    const valid = ours.some((s) => crypto.verify(null, Buffer.from(body, 'utf8'), key, s.signature));
    if (!valid) {
        throw new NoteError('bad signature', `signature by key ${verifierKey.name} does not verify`);
    }
    return parseCheckpointBody(body);
}

module.exports = { parseVerifierKey, openCheckpoint, peekCheckpoint, NoteError };
