"""One digest over an evidence pack: the HTML, the PDF when printed, and the bundle.

``report.pack.sha256`` lists each file's SHA-256 (sorted by name); the pack's digest is
the SHA-256 of that list. ``report`` appends the pack digest to the log and
``verify --report DIR`` recomputes it from the files (docs/decisions/0040's companion in
the README "Evidence pack").
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST = "report.pack.sha256"
PACK_FILES = ("bundle.json", "report.html", "report.pdf")


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def manifest_text(folder: Path, names: list[str]) -> str:
    return "".join(f"{file_digest(folder / name)}  {name}\n" for name in sorted(names))


def pack_digest(manifest: str) -> str:
    return "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()


def write_manifest(folder: Path) -> str:
    """List the pack's files present in ``folder``; returns the pack digest."""
    names = [name for name in PACK_FILES if (folder / name).is_file()]
    text = manifest_text(folder, names)
    (folder / MANIFEST).write_text(text)
    return pack_digest(text)


def recompute(folder: Path) -> tuple[str, list[str]]:
    """(pack digest recomputed from the files the manifest names, problems found)."""
    try:
        listed = (folder / MANIFEST).read_text().splitlines()
    except OSError as exc:
        return "", [f"cannot read {MANIFEST}: {exc.strerror}"]
    problems, names = [], []
    for line in listed:
        recorded, _, name = line.partition("  ")
        if name not in PACK_FILES:
            problems.append(f"{MANIFEST} names an unexpected file {name!r}")
            continue
        names.append(name)
        if not (folder / name).is_file():
            problems.append(f"{name} is missing")
        elif file_digest(folder / name) != recorded:
            problems.append(f"{name} has changed: its digest is no longer {recorded}")
    for name in PACK_FILES:
        if name not in names and (folder / name).is_file():
            problems.append(f"{name} is not in {MANIFEST}")
    present = [n for n in names if (folder / n).is_file()]
    return pack_digest(manifest_text(folder, present)), problems
