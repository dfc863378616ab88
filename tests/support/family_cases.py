"""The model-family cases the family tests run in both modes: each checkpoint with a real tokenizer and official
template (support/model_tokenizers.py), under each --apply-chat-template-kwargs its template's thinking switch takes.

The family a checkpoint is placed in is its MODEL preset's (launch/presets.py; test_family_parsers.py checks that
families/detection.py places it there). What the tests check the plugin against is written out here rather than
derived by the code under test: the token that ends an assistant turn in its template, who opens the thought with
thinking on (the model, as Search-R1's prompt asks; or the prompt, whose generation prompt ends with "<think>\\n"),
and whether the template reads `enable_thinking` (off: the generation prompt holds an empty thought).
"""

from dataclasses import dataclass, field

from slime_search_r1.families import ModelFamily
from slime_search_r1.launch.presets import MODEL_PRESETS
from slime_search_r1.registry import MODEL_FAMILIES
from support.model_tokenizers import CHECKPOINTS

# who opens the first thought of the model's turn
MODEL_THINKS = "model"  # the generation prompt ends at the assistant header: the model writes <think> itself
PROMPT_THINKS = "prompt"  # the generation prompt ends with "<think>\n": the turn starts mid-thought
THINKING_OFF = "off"  # the generation prompt holds an empty "<think>\n\n</think>\n\n"

# checkpoint -> (its template's end-of-turn token, who opens the thought with thinking on, reads enable_thinking)
TEMPLATE_FACTS = {
    "qwen2.5-3b": ("<|im_end|>", MODEL_THINKS, False),
    "llama-3.2-3b-instruct": ("<|eot_id|>", MODEL_THINKS, False),
    "qwen3-4b": ("<|im_end|>", MODEL_THINKS, True),
    "qwen3-4b-instruct-2507": ("<|im_end|>", MODEL_THINKS, False),
    "qwen3-4b-thinking-2507": ("<|im_end|>", PROMPT_THINKS, False),
    "qwen3.5-4b": ("<|im_end|>", PROMPT_THINKS, True),
}


@dataclass(frozen=True)
class FamilyCase:
    checkpoint: str
    template_kwargs: dict = field(default_factory=dict)  # slime's --apply-chat-template-kwargs

    @property
    def family(self) -> ModelFamily:
        return MODEL_FAMILIES.get(MODEL_PRESETS[self.checkpoint].family)

    @property
    def end_of_turn(self) -> str:
        """The special token the template closes an assistant message with."""
        return TEMPLATE_FACTS[self.checkpoint][0]

    @property
    def thought(self) -> str:
        """Who opens the first thought: MODEL_THINKS, PROMPT_THINKS, or THINKING_OFF (the template's empty one)."""
        thinking_off = self.template_kwargs.get("enable_thinking") is False
        return THINKING_OFF if thinking_off else TEMPLATE_FACTS[self.checkpoint][1]

    @property
    def id(self) -> str:
        thinking = self.template_kwargs.get("enable_thinking")
        return self.checkpoint + ("" if thinking is None else f"-thinking-{'on' if thinking else 'off'}")


CASES = [
    FamilyCase(name, kwargs)
    for name in CHECKPOINTS
    for kwargs in (({"enable_thinking": True}, {"enable_thinking": False}) if TEMPLATE_FACTS[name][2] else ({},))
]
CASE_IDS = [case.id for case in CASES]
