"""Reading tenant tags from envelopes: the replaced tail read (no parse, fooled by a
crafted envelope) against ``body_bundles.envelope_tag`` (one whole-envelope pattern,
decision 0050), side by side on the same envelopes, rounds interleaved.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_envelope_tag.py [--envelopes 2000] [--rounds 40]

Prints each reader's best CPU time per envelope over many short interleaved rounds (on
a loaded machine the best round is the one least disturbed) and the ratio new/old.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable

from ledger.body_bundles import _HEX, envelope_tag
from ledger.digest import SHA256_PREFIX
from ledger.leaves.envelope import envelope_bytes, parse_envelope

_TAG_AT = -len(b'"tenant_tag":"sha256:') - 64 - 2


def replaced_envelope_tag(entry: bytes) -> str | None:
    """The reader before decision 0050, kept here only to measure against."""
    if entry.count(b'"tenant_tag"') == 1:
        if entry.endswith(b',"tenant_tag":null}'):
            return None
        tail = entry[_TAG_AT:]
        if tail.startswith(b'"tenant_tag":"sha256:') and tail.endswith(b'"}') \
                and _HEX.fullmatch(tail[-66:-2].decode("ascii", "replace")):
            return SHA256_PREFIX + tail[-66:-2].decode("ascii")
    tag = parse_envelope(entry)["tenant_tag"]
    return None if tag is None else str(tag)


def envelopes(count: int) -> list[bytes]:
    """Records of eight tenants, one log-wide leaf in 64."""
    out = []
    for i in range(count):
        tag = None if i % 64 == 0 else SHA256_PREFIX + hashlib.sha256(
            f"tenant-{i % 8}".encode()).hexdigest()
        kind = "environment/v1" if tag is None else "audit-record/v2"
        stamp = f"2026-12-02T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"
        out.append(envelope_bytes(kind, stamp, tag, str(i).encode()))
    return out


def best(read: Callable[[bytes], str | None], entries: list[bytes]) -> float:
    # CPU time of this process: time spent waiting for a core on a loaded machine is
    # not counted against either reader.
    started = time.process_time()
    for entry in entries:
        read(entry)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envelopes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    entries = envelopes(args.envelopes)
    assert [envelope_tag(e) for e in entries] == [replaced_envelope_tag(e) for e in entries]
    old, new = float("inf"), float("inf")
    for _ in range(args.rounds):  # interleaved, so both see the same load
        old = min(old, best(replaced_envelope_tag, entries))
        new = min(new, best(envelope_tag, entries))
    per = 1e6 / len(entries)
    print(f"{len(entries)} envelopes, best of {args.rounds} rounds")
    print(f"  replaced tail read: {old * per:.2f} us per envelope")
    print(f"  whole-envelope pattern (now): {new * per:.2f} us per envelope")
    print(f"  ratio now/replaced: {new / old:.2f}")


if __name__ == "__main__":
    main()
