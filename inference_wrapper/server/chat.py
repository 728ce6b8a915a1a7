"""Chat messages as OpenAI sends them, checked and made ready for the chat template.

Accepted: roles ``system``, ``developer`` (a system turn, as OpenAI's newer models name
it), ``user`` and ``assistant``; ``content`` as a string or an array of text parts
(``{"type": "text", "text": ...}``, joined with a newline); an optional ``name``.

Control tokens: the chat template alone may place them. Text in a message that spells a
special token of the tokenizer (``<|im_start|>``) would otherwise be tokenized as that
token and could fake a system turn, so each such occurrence is split with a word joiner
(U+2060) after its first character: it then reads as plain text. The record commits to
the prompt as templated, so to the split text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inference_wrapper.server.problems import invalid

ROLES = {"system": "system", "developer": "system", "user": "user",
         "assistant": "assistant"}
WORD_JOINER = "\u2060"
MAX_MESSAGES = 256

_TEXT_PART = {"type": "object", "additionalProperties": False, "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["role", "content"],
    "properties": {
        "role": {"enum": list(ROLES)},
        "content": {"anyOf": [{"type": "string"},
                              {"type": "array", "items": _TEXT_PART}]},
        "name": {"type": "string"}}}


def check_messages(messages: list[Any]) -> list[dict[str, str]]:
    """Each message as ``{"role", "content"}`` for the template (``developer`` becomes
    ``system``, text parts are joined); a 4xx names the first bad member."""
    checked = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(where, "must be an object with role and content")
        for name in message:
            if name not in ("role", "content", "name"):
                raise invalid(f"{where}.{name}", f"unknown member {name!r}")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role", "must be one of " + ", ".join(ROLES))
        if "name" in message and not isinstance(message["name"], str):
            raise invalid(f"{where}.name", "must be a string")
        checked.append({"role": ROLES[role],
                        "content": _content(message.get("content"), f"{where}.content")})
    return checked


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(where, "must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            raise invalid(here, "must be a text part ({\"type\": \"text\", \"text\": ...}); "
                          "this server serves a text model")
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise invalid(here, "a text part has exactly the members type and text (a "
                          "string)")
        texts.append(part["text"])
    return "\n".join(texts)


def split_control_tokens(text: str, specials: Iterable[str]) -> str:
    """``text`` with every spelled-out special token split so that it reads as text."""
    for token in sorted({s for s in specials if len(s) > 1}, key=len, reverse=True):
        if token in text:
            text = text.replace(token, token[0] + WORD_JOINER + token[1:])
    return text


def special_token_texts(tokenizer: Any) -> list[str]:
    """Every token text the tokenizer treats as special (named and added ones)."""
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added.content))
    return sorted(texts)
