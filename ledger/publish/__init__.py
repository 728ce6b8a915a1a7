"""The tiles publisher: the log as C2SP tlog-tiles static files, in a directory or a bucket."""
