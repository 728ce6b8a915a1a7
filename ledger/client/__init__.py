"""Fetching evidence for verification: from a server, a database or a bundle."""
