"""Token ids of what the environment shows the model: search results or the invalid-action message."""

from functools import lru_cache

from search_results import format_documents
from xml_actions import INFORMATION_CLOSE, INFORMATION_OPEN, INVALID_ACTION_MESSAGE


def encode_text(tokenizer, text: str, *, special_tokens_as_text: bool = True) -> list[int]:
    """Token ids of `text` on its own; by default a special-token string in retrieved text stays text."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=special_tokens_as_text)


@lru_cache(maxsize=8)
def _fixed_ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(encode_text(tokenizer, text))


def invalid_action_ids(tokenizer) -> list[int]:
    return list(_fixed_ids(tokenizer, INVALID_ACTION_MESSAGE))


def information_ids(tokenizer, contents: list[str], max_tokens: int) -> tuple[list[int], bool]:
    """`\\n\\n<information>{docs}</information>\\n\\n` in at most `max_tokens` ids; True if docs were cut.

    The block is always tokenized whole, as one string (what Search-R1 feeds, and what tokenizing the
    rendered text gives): when it does not fit, the documents are cut at a token boundary, the tags kept,
    and the cut block tokenized whole again.
    """
    docs = format_documents(contents).strip()
    whole = encode_text(tokenizer, f"{INFORMATION_OPEN}{docs}{INFORMATION_CLOSE}")
    if len(whole) <= max_tokens:
        return whole, False
    doc_ids = encode_text(tokenizer, docs)
    tags = len(_fixed_ids(tokenizer, INFORMATION_OPEN)) + len(_fixed_ids(tokenizer, INFORMATION_CLOSE))
    keep = max(0, max_tokens - tags)
    while True:
        kept_docs = tokenizer.decode(doc_ids[:keep], skip_special_tokens=False)
        block = encode_text(tokenizer, f"{INFORMATION_OPEN}{kept_docs}{INFORMATION_CLOSE}")
        if len(block) <= max_tokens or keep == 0:
            return block, True
        keep = max(0, keep - (len(block) - max_tokens))  # the cut text merged into more tokens than counted
