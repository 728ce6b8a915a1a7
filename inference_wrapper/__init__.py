"""The audited inference layer: model loading, tokenization contract, fingerprints."""
