'use strict';

const AnchorContract = require('./lib/anchor-contract');

module.exports.AnchorContract = AnchorContract;
module.exports.contracts = [AnchorContract];
