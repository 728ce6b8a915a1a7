'use strict';

const { test } = require('node:test');
const assert = require('node:assert');
const path = require('path');
const { verifyConsistency, MerkleError } = require('../lib/merkle');

const cases = require(path.join(__dirname, '..', '..', 'tests', 'vectors', 'consistency.json'));

test('shared consistency vectors: same verdicts as the Python core', () => {
    assert.ok(cases.length > 40);
    for (const c of cases) {
        const run = () => verifyConsistency(c.size1, c.size2, c.proof.map((h) => Buffer.from(h, 'hex')),
            Buffer.from(c.root1, 'hex'), Buffer.from(c.root2, 'hex'));
        if (c.valid) {
            run();
        } else {
            assert.throws(run, (e) => e instanceof MerkleError && e.kind === c.error,
                `${c.size1}->${c.size2} should fail with ${c.error}`);
        }
    }
});
