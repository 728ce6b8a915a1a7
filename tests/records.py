"""Synthetic audit records for ledger tests (the real generator is tested elsewhere)."""

from __future__ import annotations

from ledger.record import AuditRecord, build_record


def make_record(i: int, *, tenant: str = "bank-a", padding: int = 600,
                created_at: str | None = None, driver: str | None = "550.54.15") -> AuditRecord:
    return build_record(
        tenant=tenant,
        model={"name": "tiny", "digest": "sha256:" + "ab" * 32, "pinned": True},
        hardware={"accelerator": "cuda", "accelerator_model": "NVIDIA H200",
                  "driver_version": driver},
        software={"torch": {"version": "2.13.0", "git_version": "c" * 40},
                  "service": {"git_revision": "d" * 40, "dirty": False}},
        data={"input_commitment": f"sha256:{i:064x}", "output_commitment": f"sha256:{i + 1:064x}",
              "note": "x" * padding},
        timings_ms={"forward": 1.5},
        created_at=created_at or f"2026-11-{1 + i % 28:02d}T10:00:{i % 60:02d}.000Z",
    )
