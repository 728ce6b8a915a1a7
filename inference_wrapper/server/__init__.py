"""The aiohttp endpoint: HTTP concerns only (routes, validation, problems, metrics)."""
