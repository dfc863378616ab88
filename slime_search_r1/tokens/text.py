"""Token ids of text the model did not generate: the prompt, and what the environment shows it."""

from functools import lru_cache


def encode_text(tokenizer, text: str, *, special_tokens_as_text: bool = True) -> list[int]:
    """Token ids of `text` on its own; by default a special-token string in retrieved text stays text."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=special_tokens_as_text)


@lru_cache(maxsize=64)
def fixed_text_ids(tokenizer, text: str) -> tuple[int, ...]:
    """encode_text for the environment's fixed strings (tags, messages), computed once per tokenizer."""
    return tuple(encode_text(tokenizer, text))


@lru_cache(maxsize=4096)
def _prompt_ids(tokenizer, prompt: str) -> tuple[int, ...]:
    # GRPO rolls out every prompt n_samples_per_prompt times: tokenize it once.
    return tuple(encode_text(tokenizer, prompt, special_tokens_as_text=False))


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Prompt ids as slime computes them: the prompt string tokenized with its special tokens."""
    return list(_prompt_ids(tokenizer, prompt))
