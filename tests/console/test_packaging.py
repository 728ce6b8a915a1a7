"""The wheel carries every console asset: each file under server/console matches a
package-data pattern (a new asset type, say an .svg, must be added to pyproject.toml)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_console_asset_is_declared_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["inference_wrapper"]
    package = ROOT / "inference_wrapper"
    assets = [p.relative_to(package).as_posix()
              for p in (package / "server" / "console").rglob("*") if p.is_file()]
    assert "server/console/static/verify.js" in assets
    missing = [a for a in assets if not any(fnmatch.fnmatchcase(a, p) for p in patterns)]
    assert missing == []
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "recursive-include inference_wrapper/server/console *.html *.js *.css" in manifest
    assert {Path(a).suffix for a in assets} <= {".html", ".js", ".css"}
