'use strict';
// C2SP signed notes with Ed25519 and tlog-checkpoint bodies, as in ledger/checkpoint.py.

const crypto = require('crypto');

const SIGNATURE_PREFIX = '\u2014 ';
const MAX_SIGNATURES = 100;
const MAX_NOTE_BYTES = 64 * 1024;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

// Canonical padded standard base64 only, as Go's strict decoder: Node's Buffer.from skips
// junk characters and missing padding, so one signature could be spelled many ways and a
// spelling other verifiers refuse could be stored (and then jam every reader).
function strictBase64(text, what) {
    if (typeof text !== 'string' || !BASE64.test(text)) {
        throw new NoteError('malformed', `${what} is not canonical base64`);
    }
    const raw = Buffer.from(text, 'base64');
    if (raw.toString('base64') !== text) {
        throw new NoteError('malformed', `${what} is not canonical base64 (padding bits)`);
    }
    return raw;
}
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
    const raw = strictBase64(parts.slice(2).join('+'), 'verifier key');
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
    if (Buffer.byteLength(text, 'utf8') > MAX_NOTE_BYTES) {
        throw new NoteError('malformed', `note larger than ${MAX_NOTE_BYTES} bytes`);
    }
    const at = text.lastIndexOf('\n\n');
    if (at < 0 || !text.endsWith('\n')) {
        throw new NoteError('malformed', 'note has no signature block');
    }
    const body = text.slice(0, at + 1);
    const lines = text.slice(at + 2, -1).split('\n');
    if (lines.length > MAX_SIGNATURES) {
        throw new NoteError('malformed', `more than ${MAX_SIGNATURES} signature lines`);
    }
    const signatures = lines.map((line) => {
        if (!line.startsWith(SIGNATURE_PREFIX)) {
            throw new NoteError('malformed', 'malformed signature line');
        }
        const fields = line.slice(SIGNATURE_PREFIX.length).split(' ');
        if (fields.length !== 2 || !fields[0]) {
            throw new NoteError('malformed', 'a signature line has exactly two fields: name and base64');
        }
        const raw = strictBase64(fields[1], 'signature');
        if (raw.length < 5) {
            throw new NoteError('malformed', 'signature too short');
        }
        return { name: fields[0], keyHash: raw.subarray(0, 4), signature: raw.subarray(4) };
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
    const root = strictBase64(rootText, 'root hash');
    if (root.length !== 32) {
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
    // Every line in the log key's name must verify: a corrupted copy beside the genuine
    // line is refused, as the verifiers refuse it.
    const valid = ours.every((s) => crypto.verify(null, Buffer.from(body, 'utf8'), key, s.signature));
    if (!valid) {
        throw new NoteError('bad signature', `signature by key ${verifierKey.name} does not verify`);
    }
    return parseCheckpointBody(body);
}

module.exports = {
    parseVerifierKey, openCheckpoint, peekCheckpoint, NoteError, MAX_NOTE_BYTES, MAX_SIGNATURES,
};
