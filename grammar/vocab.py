"""The tokenizer as the grammar backends see it: the bytes of every token, special ids, EOS ids.

Built once from a Hugging Face tokenizer in the serving process; a plain picklable value so the
compile workers can rebuild both backends' vocabularies without importing transformers.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from loraplex.grammar.spec import GrammarError

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for raw bytes, inverted (character -> byte)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _uses_byte_level(tok_json: dict[str, Any]) -> bool:
    def has(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "ByteLevel":
            return True
        return any(has(n) for n in node.get("decoders", []) or node.get("pretokenizers", []) or [])

    return has(tok_json.get("decoder")) or has(tok_json.get("pre_tokenizer"))


@dataclass(frozen=True)
class VocabInfo:
    """Token id -> bytes (None for special or unused ids), with the EOS ids.

    `vocab_size` is the model's logit width; ids at or above the tokenizer's size are padding and
    never allowed. `tokenizer_json` is the tokenizers-library JSON llguidance is built from.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_ids: tuple[int, ...]
    vocab_size: int
    tokenizer_json: str
    identity: str = field(default="")

    @property
    def words(self) -> int:
        """int32 words in one bitmask row."""
        return (self.vocab_size + 31) // 32


def vocab_from_hf(tokenizer: Any, eos_token_ids: list[int], vocab_size: int) -> VocabInfo:
    """Read a fast Hugging Face tokenizer (byte-level BPE or sentencepiece-style byte fallback)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise GrammarError("structured output needs a fast (tokenizers-backed) tokenizer")
    if not eos_token_ids:
        raise GrammarError("at least one EOS token id is needed")
    tok_json_text = backend.to_str()
    tok_json = json.loads(tok_json_text)
    byte_level = _uses_byte_level(tok_json)
    decoder = _byte_level_decoder()
    added = {a["id"]: a for a in tok_json.get("added_tokens", [])}
    special = {i for i, a in added.items() if a.get("special")}
    special |= set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= set(eos_token_ids)

    table: list[bytes | None] = [None] * vocab_size
    for text, tid in tokenizer.get_vocab().items():
        if tid >= vocab_size or tid in special:
            continue
        if tid in added:
            data = added[tid]["content"].encode("utf-8")
        elif byte_level:
            try:
                data = bytes(decoder[c] for c in text)
            except KeyError:
                data = text.encode("utf-8")
        else:
            m = _BYTE_TOKEN.match(text)
            data = bytes([int(m.group(1), 16)]) if m else text.replace("\u2581", " ").encode("utf-8")
        table[tid] = data or None
    digest = hashlib.sha256()
    for data in table:
        digest.update(b"\x00" if data is None else len(data).to_bytes(2, "little") + data)
    digest.update(repr((sorted(eos_token_ids), vocab_size, sorted(special))).encode())
    return VocabInfo(tuple(table), tuple(eos_token_ids), vocab_size, tok_json_text, digest.hexdigest()[:24])
