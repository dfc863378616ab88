"""What the scripted 'model' does besides choosing its words (policy.py): how it ends a turn, which tokens are its
EOS, the log prob it gives each token, and how it reads the context it is asked to continue.

It behaves as the base Qwen2.5-3B served with a ChatML template does: inside an assistant turn it ends with
<|im_end|>, after which, if nothing stops it, it goes on writing (AFTER_TURN, then <|endoftext|>); anywhere else it
ends with <|endoftext|>, its only EOS. With a Llama 3 tokenizer (no <|im_end|>) it does the same with Llama's tokens
(LLAMA_TURN_END). The test suite's engine (tests/support/fake_sglang.py) and the stand-in
anyone can serve (server.py) share all of it.
"""

import re
import zlib

ASSISTANT_MARKER = "<|im_start|>assistant"
LLAMA_ASSISTANT_MARKER = "<|start_header_id|>assistant<|end_header_id|>"  # Llama 3's assistant turn
# What the scripted model writes after <|im_end|> when nothing stops it there (a base model served with a chat
# template does not take <|im_end|> for EOS): it makes up the user's next message.
AFTER_TURN = "\n<|im_start|>user\nThank you!<|im_end|>\n"
# Llama 3's: (end of turn, what it makes up after it, end of text)
LLAMA_TURN_END = ("<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nThank you!<|eot_id|>", "<|end_of_text|>")
# The base Qwen2.5-3B's EOS set (config.json, generation_config.json and the tokenizer all say <|endoftext|>).
BASE_MODEL_EOS = (151643,)
QUESTION_PATTERN = re.compile(r"Question: (.*?)(?:\n|<\|im_end\|>|<\|eot_id\|>)")


def turn_end_ids(tokenizer) -> tuple[list[int], list[int]]:
    """(how a turn ends inside an assistant turn, how it ends anywhere else), as token ids."""
    ids = tokenizer.convert_tokens_to_ids
    end, after, end_of_text = ("<|im_end|>", AFTER_TURN, "<|endoftext|>")
    if "<|im_end|>" not in tokenizer.get_vocab():
        end, after, end_of_text = LLAMA_TURN_END
    after_ids = tokenizer.encode(after, add_special_tokens=False)
    return [ids(end), *after_ids, ids(end_of_text)], [ids(end_of_text)]


def assistant_marker(context_text: str) -> str:
    """What opens an assistant turn in this context: Llama 3's header, else ChatML's."""
    return LLAMA_ASSISTANT_MARKER if LLAMA_ASSISTANT_MARKER in context_text else ASSISTANT_MARKER


def scripted_log_prob(context_length: int, token_id: int) -> float:
    """A deterministic, strictly negative log prob that differs by position and token."""
    return -((zlib.crc32(f"{context_length}:{token_id}".encode()) % 9000) + 1) / 1000.0


def question_of(context_text: str) -> str:
    """The question the prompt asks ("Question: ...", as Search-R1's instruction and the chat data write it)."""
    match = QUESTION_PATTERN.search(context_text)
    return match.group(1).strip() if match else ""


def turn_index(context_text: str, observation_ends) -> int:
    """How many turns the model already took: earlier assistant turns (chat) plus, inside this one (XML), the
    observations it was shown, each ending with one of `observation_ends`."""
    marker = assistant_marker(context_text)
    earlier, _, reply = context_text.rpartition(marker)
    return earlier.count(marker) + sum(reply.count(end) for end in observation_ends)
