"""The audit pipeline: admission, batching, salts, record building and the durable append.
It is the only code that writes leaves; it drives engines through ``EngineClient``."""
