'use strict';

const { test } = require('node:test');
const assert = require('node:assert');
const path = require('path');
const { spawnSync } = require('child_process');

const START = path.join(__dirname, '..', 'start-server.js');

test('CHAINCODE_SERVER_ADDRESS without CHAINCODE_ID is refused with the variable named', () => {
    const env = { ...process.env, CHAINCODE_SERVER_ADDRESS: '127.0.0.1:1' };
    delete env.CHAINCODE_ID;
    const run = spawnSync(process.execPath, [START], { env, encoding: 'utf8', timeout: 30000 });
    assert.strictEqual(run.status, 2);
    assert.match(run.stderr, /CHAINCODE_ID is required/);
});
