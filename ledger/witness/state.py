"""The witness's own small database: the latest checkpoint it cosigned, per log origin.

A separate service with a one-table schema, created on start with ``create_all`` rather
than Alembic (docs/decisions/0015): it shares nothing with a ledger database, and a
witness operator should not need the log's migration tooling.

Updates are compare-and-swap: a row moves from (size, root) to a new checkpoint only if it
still holds (size, root), so two concurrent add-checkpoint calls can never move the stored
size backwards (the race the spec warns about); the loser re-decides against the new row.
"""

from __future__ import annotations

import base64
import logging
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    LargeBinary,
    MetaData,
    Table,
    Text,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from ledger.checkpoint import Checkpoint, split_vkey
from ledger.cosignature import COSIGNATURE_ALG, Cosigner
from ledger.store.keys import PREFIX, create_key_file_once
from ledger.store.sql import make_engine
from ledger.witness_policy import WitnessedState

log = logging.getLogger(__name__)

metadata = MetaData()

witnessed = Table(
    "witnessed_checkpoints",
    metadata,
    Column("origin", Text, primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("root", LargeBinary(32), nullable=False),
    Column("note", LargeBinary, nullable=False),  # the log-signed note, as submitted
    Column("updated_at", DateTime, nullable=False),
)


class WitnessStore:
    """Latest cosigned checkpoint per origin, in SQLite (default) or PostgreSQL."""

    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = make_engine(url)
        metadata.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def get(self, origin: str) -> WitnessedState | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(witnessed.c.size, witnessed.c.root)
                               .where(witnessed.c.origin == origin)).first()
        return WitnessedState(int(row.size), bytes(row.root)) if row else None

    def note(self, origin: str) -> bytes | None:
        with self.engine.connect() as conn:
            value = conn.execute(select(witnessed.c.note)
                                 .where(witnessed.c.origin == origin)).scalar()
        return bytes(value) if value is not None else None

    def swap(self, expected: WitnessedState | None, checkpoint: Checkpoint,
             note: bytes) -> bool:
        """Store ``checkpoint`` if the row still holds ``expected``; False if it moved.

        Equal size and root rewrite the row too: the match proves the state did not move
        between the decision and the cosignature.
        """
        now = datetime.now(UTC).replace(tzinfo=None)
        values = {"size": checkpoint.size, "root": checkpoint.root, "note": note,
                  "updated_at": now}
        with self.engine.begin() as conn:
            if expected is None:
                try:
                    conn.execute(insert(witnessed).values(origin=checkpoint.origin, **values))
                except IntegrityError:  # another request stored this origin first
                    return False
                return True
            result = conn.execute(
                update(witnessed)
                .where(witnessed.c.origin == checkpoint.origin,
                       witnessed.c.size == expected.size, witnessed.c.root == expected.root)
                .values(**values))
            return result.rowcount == 1


KEY_PREFIX = PREFIX  # the same file format as the log's key


def encode_cosigner_key(name: str, private_key: Ed25519PrivateKey) -> str:
    """``PRIVATE+KEY+<name>+<key ID hex>+base64(0x04 || seed)``, like the log's key file."""
    seed = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    key_id = Cosigner(name, private_key).witness_key.key_id
    return f"{KEY_PREFIX}{name}+{key_id.hex()}+{base64.b64encode(COSIGNATURE_ALG + seed).decode()}"


def decode_cosigner_key(text: str) -> Cosigner:
    if not text.startswith(KEY_PREFIX):
        raise ValueError("not a PRIVATE+KEY witness key")
    wrong = "a witness key is an Ed25519 cosignature/v1 key (type 0x04)"
    name, hash_hex, seed = split_vkey(text[len(KEY_PREFIX):], COSIGNATURE_ALG,
                                      "witness key", wrong)
    if len(seed) != 32:
        raise ValueError(wrong)
    cosigner = Cosigner(name, Ed25519PrivateKey.from_private_bytes(seed))
    if cosigner.witness_key.key_id.hex() != hash_hex:
        raise ValueError("witness key hash does not match its key")
    return cosigner


def load_or_create_cosigner(path: Path, name: str) -> Cosigner:
    """Load the witness key at ``path``; create it (mode 0600) on first start."""
    path = Path(path)
    create_key_file_once(
        path, lambda: encode_cosigner_key(name, Ed25519PrivateKey.generate()) + "\n",
        "witness key")
    cosigner = decode_cosigner_key(path.read_text())
    if cosigner.name != name:
        raise ValueError(f"key {path} belongs to witness {cosigner.name!r}, expected {name!r}")
    return cosigner
