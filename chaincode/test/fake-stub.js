'use strict';
// An in-memory stand-in for the peer's ChaincodeStub: world state as a sorted map,
// composite keys spelled as fabric-shim spells them, pagination by bookmark.
// (Unit tests only; the contract's real-protocol tests need a peer.)

class FakeStub {
    constructor() {
        this.state = new Map();
        this.events = [];
        this.txCount = 0;
    }

    getTxID() {
        return `tx${this.txCount}`;
    }

    createCompositeKey(objectType, attributes) {
        return '\u0000' + objectType + '\u0000' + attributes.map((a) => a + '\u0000').join('');
    }

    async getState(key) {
        return this.state.has(key) ? Buffer.from(this.state.get(key)) : Buffer.alloc(0);
    }

    async putState(key, value) {
        this.state.set(key, Buffer.from(value));
    }

    setEvent(name, payload) {
        this.events.push({ name, payload: JSON.parse(Buffer.from(payload).toString('utf8')) });
    }

    async getStateByPartialCompositeKeyWithPagination(objectType, attributes, pageSize, bookmark) {
        const prefix = this.createCompositeKey(objectType, attributes);
        const keys = [...this.state.keys()].filter((k) => k.startsWith(prefix) && (!bookmark || k > bookmark)).sort();
        const page = keys.slice(0, pageSize);
        const items = page.map((key) => ({ key, value: this.state.get(key) }));
        let position = 0;
        return {
            iterator: {
                next: async () => (position < items.length ? { value: items[position++], done: false } : { done: true }),
                close: async () => {},
            },
            metadata: { fetchedRecordsCount: page.length, bookmark: page.length === pageSize ? page[page.length - 1] : '' },
        };
    }
}

// Run a contract method as one transaction: new tx id, writes kept only on success.
async function invoke(contract, stub, method, ...args) {
    stub.txCount += 1;
    const before = new Map(stub.state);
    const eventsBefore = stub.events.length;
    try {
        return JSON.parse(await contract[method]({ stub }, ...args));
    } catch (error) {
        stub.state = before;
        stub.events.length = eventsBefore;
        throw error;
    }
}

module.exports = { FakeStub, invoke };
