"""The engine: the model and everything that touches it (loading, weight verification, the
tokenization contract, environment capture, batched generate). It knows no tenants, salts,
users or records; the audit pipeline (``inference_wrapper.audit``) does."""
