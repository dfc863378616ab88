"""What each token id looks like on the page: its bytes, taken from the tokenizer once per distinct id.

A page stores a sample's tokens as ids and the page's vocabulary once, so the text of a token is written once however
often it occurs. Byte-level BPE tokenizers (Qwen, Llama 3, GPT-2) give every token's exact bytes; a token that holds
part of a UTF-8 character is kept as bytes and the page joins it with its neighbours, so the tokens' text put end to
end is exactly the decoded response. Other tokenizers get each id decoded on its own.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path


class TokenizerError(ValueError):
    """The tokenizer named on the command line cannot be loaded."""


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character standing for each byte -> that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


BYTE_DECODER = _byte_decoder()


def is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders") or []]
    return "ByteLevel" in kinds


@dataclass
class Vocabulary:
    """The page's table of token ids: text for tokens that are whole UTF-8, bytes for the others."""

    texts: dict[int, str] = field(default_factory=dict)
    partial: dict[int, bytes] = field(default_factory=dict)  # bytes that are not valid UTF-8 on their own
    special: set[int] = field(default_factory=set)  # the tokenizer's special tokens (<|im_end|>, ...)

    def bytes_of(self, token_id: int) -> bytes:
        if token_id in self.partial:
            return self.partial[token_id]
        return self.texts.get(token_id, "").encode("utf-8")

    def decode(self, ids) -> str:
        """The text of `ids`, joined as the page joins it."""
        return b"".join(self.bytes_of(i) for i in ids).decode("utf-8", errors="replace")


class TokenTexts:
    """Token ids -> bytes with one tokenizer; learns each distinct id once, over all the samples of a page."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.byte_level = is_byte_level(tokenizer)
        self.vocabulary = Vocabulary()
        self._added = {int(i): str(t) for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
        self.vocabulary.special = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or [])}

    def learn(self, ids) -> None:
        new = sorted({int(i) for i in ids} - self.vocabulary.texts.keys() - self.vocabulary.partial.keys())
        if not new:
            return
        if self.byte_level:
            pieces = self.tokenizer.convert_ids_to_tokens(new)
            raw = [self._byte_level_bytes(i, piece) for i, piece in zip(new, pieces, strict=True)]
        else:
            raw = [self.tokenizer.decode([i], skip_special_tokens=False).encode("utf-8") for i in new]
        for token_id, data in zip(new, raw, strict=True):
            try:
                self.vocabulary.texts[token_id] = data.decode("utf-8")
            except UnicodeDecodeError:
                self.vocabulary.partial[token_id] = data

    def _byte_level_bytes(self, token_id: int, piece: str | None) -> bytes:
        if token_id in self._added:  # added tokens are stored as their text, not in the byte alphabet
            return self._added[token_id].encode("utf-8")
        if piece is None:  # an id outside the vocabulary (a padded embedding row)
            return f"<unknown id {token_id}>".encode()
        try:
            return bytes(BYTE_DECODER[char] for char in piece)
        except KeyError:
            return piece.encode("utf-8")


def load_tokenizer(name: str | Path):
    """A Hugging Face tokenizer from a folder (a checkpoint, or the tokenizer/ that slime's --dump-details saves)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerError(f"--tokenizer needs the transformers package ({exc}); pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(str(name), trust_remote_code=False)
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a folder that is not a tokenizer
        raise TokenizerError(f"{name}: cannot load a tokenizer from it ({type(exc).__name__}: {exc})") from None
