"""Anchors: somewhere outside the log that remembers which checkpoints it signed."""
