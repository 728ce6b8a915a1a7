'use strict';
// Anchors audit-ledger checkpoints. A checkpoint is stored only if it is signed by the
// log's registered key and is an append-only extension of the last one anchored
// (RFC 9162 consistency proof); anything else is refused with its own error code.

const { Contract } = require('fabric-contract-api');
const { verifyConsistency, MerkleError } = require('./merkle');
const {
    parseVerifierKey, openCheckpoint, peekCheckpoint, NoteError, MAX_NOTE_BYTES,
} = require('./note');

const EVENT_NAME = 'CheckpointAnchored';
const SIZE_DIGITS = 20; // zero-padded so composite keys sort by size

function refuse(code, message) {
    const error = new Error(`${code}: ${message}`);
    error.code = code;
    return error;
}

// A consistency proof has at most 2 * 64 hashes of 64 hex digits (and JSON around them).
const MAX_PROOF_BYTES = 64 * 1024;

function parseProof(text) {
    if (Buffer.byteLength(String(text || ''), 'utf8') > MAX_PROOF_BYTES) {
        throw refuse('MALFORMED', `consistency proof larger than ${MAX_PROOF_BYTES} bytes`);
    }
    let items;
    try {
        items = JSON.parse(text || '[]');
    } catch (e) {
        throw refuse('MALFORMED', 'consistency proof must be a JSON array of hex hashes');
    }
    if (!Array.isArray(items) || items.some((h) => typeof h !== 'string' || !/^[0-9a-f]{64}$/.test(h))) {
        throw refuse('MALFORMED', 'consistency proof must be a JSON array of 64-digit hex hashes');
    }
    return items.map((h) => Buffer.from(h, 'hex'));
}

class AnchorContract extends Contract {
    constructor() {
        super('AnchorContract');
    }

    async _getJson(ctx, key) {
        const data = await ctx.stub.getState(key);
        return data && data.length ? JSON.parse(Buffer.from(data).toString('utf8')) : null;
    }

    async _putJson(ctx, key, value) {
        await ctx.stub.putState(key, Buffer.from(JSON.stringify(value)));
    }

    _checkpointKey(ctx, origin, size) {
        return ctx.stub.createCompositeKey('checkpoint', [origin, String(size).padStart(SIZE_DIGITS, '0')]);
    }

    async InitLog(ctx, origin, logPublicKey) {
        let key;
        try {
            key = parseVerifierKey(logPublicKey);
        } catch (e) {
            throw refuse('MALFORMED', e.message);
        }
        if (!origin || key.name !== origin) {
            throw refuse('MALFORMED', `the key is named ${JSON.stringify(key.name)}, not the origin ${JSON.stringify(origin)}`);
        }
        const logKey = ctx.stub.createCompositeKey('log', [origin]);
        const existing = await this._getJson(ctx, logKey);
        if (existing) {
            if (existing.verifierKey === logPublicKey.trim()) {
                return JSON.stringify(existing);
            }
            throw refuse('LOG_EXISTS', `origin ${origin} is already registered with another key`);
        }
        const log = { origin, verifierKey: logPublicKey.trim() };
        await this._putJson(ctx, logKey, log);
        return JSON.stringify(log);
    }

    async AnchorCheckpoint(ctx, checkpointNote, consistencyProof) {
        if (Buffer.byteLength(String(checkpointNote), 'utf8') > MAX_NOTE_BYTES) {
            throw refuse('MALFORMED', `checkpoint note larger than ${MAX_NOTE_BYTES} bytes`);
        }
        let peeked;
        try {
            peeked = peekCheckpoint(checkpointNote);
        } catch (e) {
            throw refuse('MALFORMED', e.message);
        }
        const log = await this._getJson(ctx, ctx.stub.createCompositeKey('log', [peeked.origin]));
        if (!log) {
            throw refuse('UNKNOWN_ORIGIN', `no log registered for origin ${peeked.origin}`);
        }
        let offered;
        try {
            offered = openCheckpoint(checkpointNote, parseVerifierKey(log.verifierKey));
        } catch (e) {
            throw refuse(e instanceof NoteError && e.kind === 'bad signature' ? 'BAD_SIGNATURE' : 'MALFORMED', e.message);
        }
        const proof = parseProof(consistencyProof);
        const latestKey = ctx.stub.createCompositeKey('latest', [offered.origin]);
        const latest = await this._getJson(ctx, latestKey);
        const root = offered.root.toString('hex');
        if (latest) {
            if (offered.size < latest.size) {
                throw refuse('ROLLBACK', `anchored size is ${latest.size}, offered ${offered.size}`);
            }
            if (offered.size === latest.size) {
                if (root !== latest.root) {
                    throw refuse('FORK', `size ${offered.size} is anchored with root ${latest.root}, offered ${root}`);
                }
                // The same checkpoint again: refused, so that no transaction is ordered
                // for it (an answer would commit a block that stores nothing); the error
                // names the transaction that stored it.
                throw refuse('ALREADY_ANCHORED', `size ${offered.size} is anchored by transaction ${latest.txId}`);
            }
            try {
                verifyConsistency(latest.size, offered.size, proof, Buffer.from(latest.root, 'hex'), offered.root);
            } catch (e) {
                throw refuse('BAD_PROOF', e instanceof MerkleError ? `${e.kind}: ${e.message}` : e.message);
            }
        }
        const record = {
            origin: offered.origin, size: offered.size, root, note: String(checkpointNote),
            txId: ctx.stub.getTxID(),
        };
        await this._putJson(ctx, this._checkpointKey(ctx, offered.origin, offered.size), record);
        await this._putJson(ctx, latestKey, record);
        ctx.stub.setEvent(EVENT_NAME, Buffer.from(JSON.stringify({ origin: record.origin, size: record.size, root })));
        return JSON.stringify(record);
    }

    async GetLatest(ctx, origin) {
        const latest = await this._getJson(ctx, ctx.stub.createCompositeKey('latest', [origin]));
        if (!latest) {
            throw refuse('NOT_FOUND', `nothing anchored for origin ${origin}`);
        }
        return JSON.stringify(latest);
    }

    async GetCheckpoint(ctx, origin, size) {
        if (!/^(0|[1-9][0-9]*)$/.test(String(size))) {
            throw refuse('MALFORMED', 'size must be a decimal number');
        }
        const record = await this._getJson(ctx, this._checkpointKey(ctx, origin, size));
        if (!record) {
            throw refuse('NOT_FOUND', `no checkpoint of size ${size} anchored for origin ${origin}`);
        }
        return JSON.stringify(record);
    }

    async GetHistory(ctx, origin, pageSize, bookmark) {
        const size = Number(pageSize || 100);
        if (!Number.isInteger(size) || size < 1 || size > 1000) {
            throw refuse('MALFORMED', 'page size must be between 1 and 1000');
        }
        const { iterator, metadata } = await ctx.stub.getStateByPartialCompositeKeyWithPagination(
            'checkpoint', [origin], size, bookmark || '');
        const checkpoints = [];
        let item = await iterator.next();
        while (!item.done) {
            checkpoints.push(JSON.parse(Buffer.from(item.value.value).toString('utf8')));
            item = await iterator.next();
        }
        await iterator.close();
        return JSON.stringify({ checkpoints, bookmark: metadata.bookmark, fetched: metadata.fetchedRecordsCount });
    }
}

module.exports = AnchorContract;
