"""Every command that trusts a checkpoint by its cosignatures checks ``--witness`` and
``--witness-quorum`` as verify does: a quorum below 1 and one key pinned under two names
(a cosignature does not commit to the witness's name) are refused, never counted."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit_cli import cmd_restore
from audit_cli.windows import trusted_checkpoint
from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.cosignature import Cosigner, WitnessKey
from ledger.errors import InvalidInputError

ORIGIN = "witness.example/log"
SIGNER = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
NOTE = SIGNER.sign(Checkpoint(ORIGIN, 5, b"\x11" * 32).body())
WITNESS = Cosigner("witness-a", Ed25519PrivateKey.generate())
# The same key under another name, with witness-a's cosignature relabelled as its own.
ALIAS = WitnessKey("witness-b", WITNESS.witness_key.public_key)


def _relabelled() -> bytes:
    line = WITNESS.cosign(NOTE.split(b"\n\n")[0] + b"\n", 1_700_000_000)
    signature = base64.b64decode(line.split(" ")[-1])
    alias = f"\u2014 witness-b {base64.b64encode(ALIAS.key_id + signature[4:]).decode()}\n"
    return NOTE + line.encode() + alias.encode()


def _args(witnesses: list[WitnessKey], quorum: int | None) -> argparse.Namespace:
    return argparse.Namespace(origin=None, witness=[w.encode() for w in witnesses],
                              witness_quorum=quorum, accept_unwitnessed=False,
                              accept_self_anchored=False)


@pytest.mark.parametrize("quorum", [0, -1, 2])
def test_query_prove_refuses_a_quorum_outside_one_to_the_witnesses(quorum: int) -> None:
    with pytest.raises(InvalidInputError) as refused:
        trusted_checkpoint(_args([WITNESS.witness_key], quorum), SIGNER.verifier(), NOTE)
    assert refused.value.field == "--witness-quorum"


def test_query_prove_refuses_one_key_pinned_under_two_names() -> None:
    with pytest.raises(InvalidInputError, match="same witness key") as refused:
        trusted_checkpoint(_args([WITNESS.witness_key, ALIAS], None), SIGNER.verifier(),
                           _relabelled())
    assert refused.value.field == "--witness"


def test_restore_refuses_them_before_writing_anything(tmp_path: Path) -> None:
    key = tmp_path / "log.vkey"
    key.write_text(SIGNER.verifier().encode())
    target = tmp_path / "restored.db"
    args = argparse.Namespace(source=str(tmp_path / "tiles"), db=f"sqlite:///{target}",
                              log_key=str(key), origin=None,
                              witness=[WITNESS.witness_key.encode()], witness_quorum=-1,
                              checkpoint=[], json=False)
    with pytest.raises(InvalidInputError) as refused:
        cmd_restore.run(args)
    assert refused.value.field == "--witness-quorum"
    assert not target.exists() and not (tmp_path / "restored.db.restoring").exists()
