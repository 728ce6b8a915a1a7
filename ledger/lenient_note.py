"""Notes as the chaincode before decision 0035 read them, spelled canonically again.

That chaincode decoded a signature's base64 as Node's ``Buffer.from(text, 'base64')`` does
(characters outside the alphabet skipped, the first ``=`` ends the text), ignored a line's
fields after the second and took any number of lines. So a channel member could store its
own spelling of the service's genuine note as the anchor, and a strict verifier reading
the channel could not parse it. What the anchor vouches for is the body and the log key's
signature over it, which no spelling changes: ``canonical_spelling`` recovers that
signature, spelled as the log spells it, and the verifier then checks the note strictly
as always. A signature that does not verify is never recovered."""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.checkpoint import SIGNATURE_PREFIX, NoteVerifier, SignedNote

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SEXTETS = {char: value for value, char in enumerate(_ALPHABET)} | {"-": 62, "_": 63}
_MAX_NOTE_BYTES = 1 << 20  # the old chaincode's notes were unbounded; read at most this


def node_base64(text: str) -> bytes:
    """``text`` decoded as Node's lenient base64 decoder decodes it."""
    bits, count, out = 0, 0, bytearray()
    for char in text:
        if char == "=":
            break
        value = _SEXTETS.get(char)
        if value is None:
            continue
        bits, count = (bits << 6) | value, count + 6
        if count >= 8:
            count -= 8
            out.append((bits >> count) & 0xFF)
            bits &= (1 << count) - 1
    return bytes(out)


def canonical_spelling(note: bytes, verifier: NoteVerifier) -> bytes | None:
    """The note with only ``verifier``'s first valid signature line, canonically spelled;
    None when the old chaincode's reading of it holds no valid signature by that key."""
    if len(note) > _MAX_NOTE_BYTES:
        return None
    try:
        text = note.decode("utf-8")
    except UnicodeDecodeError:
        return None
    split_at = text.rfind("\n\n")
    if split_at < 0 or not text.endswith("\n"):
        return None
    body = text[: split_at + 1].encode("utf-8")
    key = Ed25519PublicKey.from_public_bytes(verifier.public_key)
    for line in text[split_at + 2 : -1].split("\n"):
        if not line.startswith(SIGNATURE_PREFIX):
            return None  # the old chaincode refused such a note too
        fields = line[len(SIGNATURE_PREFIX):].split(" ")
        if fields[0] != verifier.name or len(fields) < 2:
            continue
        blob = node_base64(fields[1])
        if blob[:4] != verifier.key_hash:
            continue
        try:
            key.verify(blob[4:], body)
        except InvalidSignature:
            continue
        return SignedNote(body, ((verifier.name, blob[:4], blob[4:]),)).serialize()
    return None
