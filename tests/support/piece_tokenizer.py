"""A tokenizer of a few whole and split pieces, for in-process token-tracking tests that need decode() only: it
decodes as a Hugging Face tokenizer does (special tokens kept unless skip_special_tokens=True, False by default)
and, like the fast tokenizers, refuses a flag that is not a bool."""

PIECES = {
    1: "<search>",
    2: " Paris",
    3: "</sea",
    4: "rch>",
    5: "</search>",
    6: " x",
    7: "<answer>",
    8: "</answer>",
    9: "\n",
    10: "</ans",
    11: "wer>",
    99: "<|im_end|>",
}
SPECIAL = {99}


class PieceTokenizer:
    eos_token_id = None  # no EOS of its own: a test names the stop ids it sends

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if not isinstance(skip_special_tokens, bool):
            raise TypeError(f"{skip_special_tokens!r} is not an instance of 'bool'")
        return "".join(PIECES[i] for i in ids if not (skip_special_tokens and i in SPECIAL))


TOKENIZER = PieceTokenizer()
