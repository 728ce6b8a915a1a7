"""Commands that need an optional part of the install say so, instead of a traceback.

The base install is the auditor's (verify, export, query, audit, log); the endpoint and
the model stack come with the ``serve`` extra (README "Install").
"""

from __future__ import annotations

import importlib.util

from ledger.errors import InvalidInputError


def require_extra(extra: str, *modules: str) -> None:
    """Raise a usage error naming the pip command if any of ``modules`` is not installed."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise InvalidInputError(
            "install", f"this command needs {', '.join(missing)}, which this installation "
            f"lacks: pip install 'audit-ledger[{extra}]'")
