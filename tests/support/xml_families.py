"""XML mode (Search-R1's tags) on each model family: the checkpoints and thinking modes the family tests run, what
each one's template and tokenizer are expected to do, and a scripted engine that writes and ends turns in each
family's shape.

Each case is a checkpoint (support/model_tokenizers.py: its real tokenizer and official template) with the
--apply-chat-template-kwargs it runs under, and the facts the tests check the plugin against, written out here
rather than derived by the code under test: the token that ends an assistant turn in its template, and who opens the
thought (the model, as Search-R1's prompt asks; the prompt, whose generation prompt ends with "<think>\\n"; or the
model while the template wrote an empty thought to switch the model's own thinking off).
"""

import functools
import json
from pathlib import Path

import pytest

from slime.utils.types import Sample
from slime_search_r1.data import search_r1_prompt
from support.episodes import QUESTION, label
from support.family_cases import PROMPT_THINKS, FamilyCase
from support.fake_sglang import BASE_MODEL_EOS, FakeSGLangEngine
from support.model_tokenizers import checkpoint_dir, load_checkpoint_tokenizer


def family_tokenizer(case: FamilyCase):
    """The case's tokenizer as slime loads it; a checkpoint the test assets cannot build yet is skipped, named."""
    try:
        return load_checkpoint_tokenizer(case.checkpoint)
    except ValueError as missing:  # checkpoint_dir: an unknown checkpoint
        pytest.skip(f"{case.checkpoint}: no test tokenizer ({missing})")


@functools.cache
def family_dir(checkpoint: str) -> Path:
    """The checkpoint's tokenizer directory, looked up once per process (checkpoint_dir hashes what it is built
    from)."""
    return checkpoint_dir(checkpoint)


def family_prompt(tokenizer, case: FamilyCase, question: str = QUESTION) -> str:
    """Search-R1's prompt as slime's --apply-chat-template renders it with the case's kwargs."""
    messages = [{"role": "user", "content": search_r1_prompt(question)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **case.template_kwargs)


def family_sample(tokenizer, case: FamilyCase, **fields) -> Sample:
    return Sample(prompt=family_prompt(tokenizer, case), label=label("Paris"), **fields)


def served_eos_ids(case: FamilyCase) -> tuple[int, ...]:
    """The served model's EOS set: its generation_config.json's eos_token_id (the base Qwen2.5-3B's otherwise)."""
    path = family_dir(case.checkpoint) / "generation_config.json"
    if not path.is_file():
        return BASE_MODEL_EOS
    value = json.loads(path.read_text())["eos_token_id"]
    return tuple(value if isinstance(value, list) else [value])


# ---- what the model writes, in its family's shape ---------------------------------------------------------------


def thought(case: FamilyCase, text: str, first: bool) -> str:
    """A thought and its closing as the family's model writes it; the first one of a turn the prompt opened holds
    only its text and </think>."""
    opening = "" if first and case.thought == PROMPT_THINKS else "<think>\n"
    return f"{opening}{text}\n</think>\n\n"


def search_then_answer(case: FamilyCase, answer: str = "Paris") -> list[str]:
    return [
        thought(case, "I need to look this up.", first=True) + "<search> capital of France </search>",
        thought(case, "The documents say it.", first=False) + f"<answer> {answer} </answer>",
    ]


def no_action_then_answer(case: FamilyCase) -> list[str]:
    """A first turn with no tag, which the model ends with its end-of-turn token, then the answer."""
    return [thought(case, "It is a capital.", first=True) + "I think it is Paris.", search_then_answer(case)[1]]


class FamilyEngine(FakeSGLangEngine):
    """The test engine serving the case's checkpoint: the scripted model ends each turn with the family's
    end-of-turn token and, when nothing stops it there, writes on (a next user message, then EOS), as a chat model
    whose end-of-turn is not in the engine's stop set does."""

    def __init__(self, tokenizer, policy, case: FamilyCase, **options):
        super().__init__(tokenizer, policy, eos_ids=served_eos_ids(case), **options)
        self.case = case

    @property
    def _turn_ends(self) -> tuple[list[int], list[int]]:
        end = self.tokenizer.convert_tokens_to_ids(self.case.end_of_turn)
        ends = [end, *self.tokenizer.encode("\nThank you!", add_special_tokens=False), self.tokenizer.eos_token_id]
        return ends, ends
