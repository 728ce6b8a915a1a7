"""Reading a note the way the chaincode before decision 0035 read it: Node's base64 decoder
(checked against Node itself), and the log key's signature recovered, canonically spelled,
only where it verifies."""

from __future__ import annotations

import base64
import json
import random
import subprocess

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.checkpoint import Checkpoint, NoteSigner
from ledger.lenient_note import canonical_spelling, node_base64

ORIGIN = "lenient.audit-ledger/log"


def test_node_base64_decodes_as_node_does() -> None:
    rng = random.Random(7)
    alphabet = "ABCXYZabcxyz0189+/-_=! .\t\n\u2014é"
    cases = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
             for _ in range(2000)]
    cases += [base64.b64encode(rng.randbytes(n)).decode() for n in range(70)]
    script = ("const c = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "console.log(JSON.stringify(c.map(s => Buffer.from(s, 'base64').toString('hex'))))")
    node = subprocess.run(["node", "-e", script], input=json.dumps(cases),
                          capture_output=True, text=True, check=True)
    assert [node_base64(case).hex() for case in cases] == json.loads(node.stdout)


def _signer(name: str = ORIGIN) -> NoteSigner:
    return NoteSigner(name, Ed25519PrivateKey.generate())


def _note(signer: NoteSigner) -> bytes:
    return signer.sign_checkpoint(Checkpoint(ORIGIN, 5, b"\x07" * 32))


def _respelled(note: bytes, line: str) -> bytes:
    text = note.decode()
    at = text.rindex("\n\n") + 2
    return (text[:at] + line).encode()


def test_a_junk_spelling_gives_back_the_genuine_note() -> None:
    signer = _signer()
    note = _note(signer)
    line = note.decode().rsplit("\n\n", 1)[1]
    prefix, blob = line[:-1].rsplit(" ", 1)
    for spelling in (f"{prefix} {blob[:9]}!{blob[9:]}\n", f"{prefix} {blob.rstrip('=')}\n",
                     f"{prefix} {blob} extra\n", line * 101):
        assert canonical_spelling(_respelled(note, spelling), signer.verifier()) == note


def test_a_forged_copy_before_the_genuine_line_is_skipped() -> None:
    signer = _signer()
    note = _note(signer)
    line = note.decode().rsplit("\n\n", 1)[1]
    prefix, blob = line[:-1].rsplit(" ", 1)
    raw = bytearray(base64.b64decode(blob))
    raw[-1] ^= 1  # same name and key hash, a signature that does not verify
    forged = f"{prefix} {base64.b64encode(bytes(raw)).decode()}\n"
    assert canonical_spelling(_respelled(note, forged + line), signer.verifier()) == note
    assert canonical_spelling(_respelled(note, forged), signer.verifier()) is None


def test_nothing_is_recovered_without_the_pinned_key_signature() -> None:
    signer, impostor = _signer(), _signer()
    assert canonical_spelling(_note(impostor), signer.verifier()) is None
    other_name = _signer("another-key")
    assert canonical_spelling(_note(other_name), signer.verifier()) is None
    assert canonical_spelling(b"no signature block", signer.verifier()) is None
    assert canonical_spelling(b"\xff\xfe\n\n\n", signer.verifier()) is None
