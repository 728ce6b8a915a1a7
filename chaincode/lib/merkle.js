'use strict';
// RFC 9162 section 2.1.4.2: verify that a tree of size2 extends a tree of size1.
// The same algorithm as ledger/merkle.py, checked against the same vectors
// (tests/vectors/consistency.json).

const crypto = require('crypto');

class MerkleError extends Error {
    constructor(kind, message) {
        super(message);
        this.kind = kind; // 'root mismatch' | 'malformed' | 'out of range'
    }
}

function hashChildren(left, right) {
    return crypto.createHash('sha256').update(Buffer.from([1])).update(left).update(right).digest();
}

const EMPTY_ROOT = crypto.createHash('sha256').digest();

function bitLength(n) {
    let bits = 0;
    while (n > 0n) {
        bits += 1;
        n >>= 1n;
    }
    return bits;
}

function popCount(n) {
    let count = 0;
    while (n > 0n) {
        count += Number(n & 1n);
        n >>= 1n;
    }
    return count;
}

function trailingZeros(n) {
    let count = 0;
    while ((n & 1n) === 0n) {
        count += 1;
        n >>= 1n;
    }
    return count;
}

function decompose(index, size) {
    const inner = bitLength(index ^ (size - 1n));
    const border = popCount(index >> BigInt(inner));
    return [inner, border];
}

function chainInner(seed, proof, index, leftOnly) {
    let result = seed;
    proof.forEach((sibling, i) => {
        if ((index >> BigInt(i)) & 1n) {
            result = hashChildren(sibling, result);
        } else if (!leftOnly) {
            result = hashChildren(result, sibling);
        }
    });
    return result;
}

function chainBorder(seed, proof) {
    return proof.reduce((acc, sibling) => hashChildren(sibling, acc), seed);
}

function verifyConsistency(size1Number, size2Number, proof, root1, root2) {
    const size1 = BigInt(size1Number);
    const size2 = BigInt(size2Number);
    if (size1 < 0n || size1 > size2) {
        throw new MerkleError('out of range', `size1 ${size1} must be between 0 and size2 ${size2}`);
    }
    for (const item of [...proof, root1, root2]) {
        if (item.length !== 32) {
            throw new MerkleError('malformed', `a hash has ${item.length} bytes, expected 32`);
        }
    }
    if (size1 === size2 || size1 === 0n) {
        if (proof.length) {
            throw new MerkleError('malformed', `consistency proof from ${size1} to ${size2} must be empty`);
        }
        if (size1 === size2 && !root1.equals(root2)) {
            throw new MerkleError('root mismatch', 'equal sizes with different roots');
        }
        if (size1 === 0n && !root1.equals(EMPTY_ROOT)) {
            throw new MerkleError('root mismatch', 'the empty tree has the empty root');
        }
        return;
    }
    const level = BigInt(trailingZeros(size1));
    const index = (size1 - 1n) >> level;
    const [inner, border] = decompose(index, ((size2 - 1n) >> level) + 1n);
    let seed;
    let rest;
    if (index === 0n) {
        seed = root1;
        rest = proof;
    } else if (proof.length) {
        seed = proof[0];
        rest = proof.slice(1);
    } else {
        throw new MerkleError('malformed', `consistency proof from ${size1} to ${size2} is empty`);
    }
    if (rest.length !== inner + border) {
        throw new MerkleError('malformed', `consistency proof from ${size1} to ${size2} has ${proof.length} hashes`);
    }
    const calculated1 = chainBorder(chainInner(seed, rest.slice(0, inner), index, true), rest.slice(inner));
    if (!calculated1.equals(root1)) {
        throw new MerkleError('root mismatch', `old root: expected ${root1.toString('hex')}, calculated ${calculated1.toString('hex')}`);
    }
    const calculated2 = chainBorder(chainInner(seed, rest.slice(0, inner), index, false), rest.slice(inner));
    if (!calculated2.equals(root2)) {
        throw new MerkleError('root mismatch', `new root: expected ${root2.toString('hex')}, calculated ${calculated2.toString('hex')}`);
    }
}

module.exports = { verifyConsistency, MerkleError, EMPTY_ROOT };
