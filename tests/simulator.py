"""An in-memory evidence simulator for driving ``ledger.verify`` directly: a Merkle tree,
the log's signer, witnesses that cosign, and the anchor. No database, no HTTP.

A ``SimLog`` is an honest log; an attacker is simulated with what an attacker has: the
log key (an insider forks or rolls back), another key (an impostor), or only the bytes
in transit (alters a note).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import merkle
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import Cosigner, WitnessKey, add_cosignatures
from ledger.digest import commit_bytes
from ledger.record import AuditRecord, build_record
from ledger.verify import Evidence

ORIGIN = "sim.example/audit-log"
SALT = bytes(range(32))


def witnesses(count: int) -> list[Cosigner]:
    return [Cosigner(f"witness-{i}.example", Ed25519PrivateKey.generate())
            for i in range(count)]


def witness_keys(cosigners: Sequence[Cosigner]) -> list[WitnessKey]:
    return [c.witness_key for c in cosigners]


def sim_record(i: int, tag: str = "honest", prompt: bytes | None = None) -> AuditRecord:
    prompt = prompt if prompt is not None else f"prompt {tag} {i}".encode()
    return build_record(
        tenant="bank-a", model={"name": "sim", "digest": "sha256:" + "ab" * 32},
        hardware={"accelerator": "none"}, software={"service": {"git_revision": "x"}},
        data={"input_commitment": commit_bytes(SALT, prompt),
              "output_commitment": commit_bytes(SALT, b"answer"), "tag": tag},
        timings_ms={"forward": 1.0}, created_at=f"2026-11-01T10:00:{i % 60:02d}.000Z")


@dataclass
class SimLog:
    """One log's history: its records and tree; checkpoints signed on demand."""

    signer: NoteSigner = field(
        default_factory=lambda: NoteSigner(ORIGIN, Ed25519PrivateKey.generate()))
    records: list[AuditRecord] = field(default_factory=list)
    tree: merkle.MemoryTree = field(default_factory=merkle.MemoryTree)

    @property
    def origin(self) -> str:
        return self.signer.name

    def append(self, count: int, tag: str = "honest") -> SimLog:
        for _ in range(count):
            self.add(sim_record(len(self.records), tag))
        return self

    def add(self, record: AuditRecord) -> int:
        self.records.append(record)
        return self.tree.append(record.leaf_hash)

    def fork(self, at: int, extra: int, tag: str = "fork") -> SimLog:
        """The same key's other history: the first ``at`` records, then others (what an
        insider holding the log key can sign)."""
        other = SimLog(self.signer)
        for record in self.records[:at]:
            other.add(record)
        return other.append(extra, tag)

    def note(self, size: int | None = None, *, cosigners: Sequence[Cosigner] = (),
             signer: NoteSigner | None = None, root: bytes | None = None) -> bytes:
        size = self.tree.size if size is None else size
        body = Checkpoint(self.origin, size, root or self.tree.root(size)).body()
        note = (signer or self.signer).sign(body)
        if cosigners:
            note = add_cosignatures(note, [c.cosign(body, 1_700_000_000 + size)
                                           for c in cosigners])
        return note

    def evidence(self, index: int, *, size: int | None = None,
                 checkpoint_note: bytes | None = None, seen: bytes | None = None,
                 anchored_size: int | None = None, anchored_note: bytes | None = None,
                 from_fabric: bool = False, cosigners: Sequence[Cosigner] = ()) -> Evidence:
        """What an (honest, for this history) source would send for record ``index``.

        Consistency proofs come from this log's own tree and are only given where a real
        source is asked for one (``ledger.client.sources.gather``): none from a seen
        checkpoint at least as large as this one.
        """
        size = self.tree.size if size is None else size
        note = checkpoint_note or self.note(size, cosigners=cosigners)
        record = self.records[index]
        seen_proof: list[bytes] | None = []
        if seen is not None and Checkpoint.peek(seen).size < size:
            seen_proof = self.tree.consistency_proof(Checkpoint.peek(seen).size, size)
        anchor_proof: list[bytes] = []
        if anchored_note is None and anchored_size is not None:
            anchored_note = self.note(anchored_size)
        if anchored_note is not None:
            low, high = sorted((Checkpoint.peek(anchored_note).size, size))
            anchor_proof = self.tree.consistency_proof(low, high) if low < high else []
        return Evidence(
            record_id=str(record.body["record_id"]), canonical=record.canonical,
            leaf_index=index, inclusion_proof=self.tree.inclusion_proof(index, size),
            checkpoint_note=note, anchored_note=anchored_note,
            anchor_ref="fabric:sim:tx" if from_fabric else f"local:{anchored_size}",
            anchor_consistency=anchor_proof, seen_consistency=seen_proof,
            log_leaf_hash=record.leaf_hash, anchor_from_fabric=from_fabric)
