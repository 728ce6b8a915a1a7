"""The witness service (C2SP tlog-witness) and the log's witness client."""
