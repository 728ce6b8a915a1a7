"""Frames between the API process and an engine process: a 4-byte big-endian length,
then one JSON object (decision 0030). Only the two ends of a socket pair ever see them."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a corrupted length fails the engine, not the memory


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return HEADER.pack(len(body)) + body


def _decode(body: bytes) -> dict[str, Any]:
    message = json.loads(body)
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ValueError("an engine frame is a JSON object with a type")
    return message


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> dict[str, Any] | None:
    """The next frame, or None once the other end has closed."""
    header = _recv_exactly(sock, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"an engine frame of {size} bytes")
    body = _recv_exactly(sock, size)
    return None if body is None else _decode(body)


async def read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None once the other end has closed (or died)."""
    try:
        header = await reader.readexactly(HEADER.size)
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME:
            raise ValueError(f"an engine frame of {size} bytes")
        body = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return _decode(body)
