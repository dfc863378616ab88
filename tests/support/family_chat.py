"""Chat-mode episodes on each model family's real tokenizer and template: the cases (checkpoint x enable_thinking where
the template toggles it) and what the scripted model writes in each family's own formats.

The model writes a thought as its generation prompt leaves it: it opens `<think>` itself when the prompt opens
none, it only closes the thought the prompt opened (Qwen3-Thinking-2507, Qwen3.5), and writes none after the empty
thought a prompt with thinking off holds. Calls are written as the family's SGLang parser reads them.
"""

import json
from dataclasses import dataclass

from slime_search_r1.families import ModelFamily, thought_in_prompt
from slime_search_r1.registry import MODEL_FAMILIES
from support.model_tokenizers import CHECKPOINTS

# The family each checkpoint's template is placed in (families/detection.py), as SGLang's rules say.
CHECKPOINT_FAMILIES = {
    "qwen2.5-3b": "qwen25",
    "llama-3.2-3b-instruct": "llama3",
    "qwen3-4b": "qwen3",
    "qwen3-4b-instruct-2507": "qwen25",
    "qwen3-4b-thinking-2507": "qwen3_thinking",
    "qwen3.5-4b": "qwen35",
}
TOGGLES_THINKING = ("qwen3-4b", "qwen3.5-4b")  # their templates read enable_thinking


@dataclass(frozen=True)
class FamilyCase:
    checkpoint: str
    template_kwargs: dict

    @property
    def family(self) -> ModelFamily:
        return MODEL_FAMILIES.get(CHECKPOINT_FAMILIES[self.checkpoint])

    @property
    def id(self) -> str:
        thinking = self.template_kwargs.get("enable_thinking")
        return self.checkpoint + ("" if thinking is None else f"-thinking-{'on' if thinking else 'off'}")


CASES = [
    FamilyCase(name, kwargs)
    for name in CHECKPOINTS
    for kwargs in (({"enable_thinking": True}, {"enable_thinking": False}) if name in TOGGLES_THINKING else ({},))
]


def call_text(family: ModelFamily, query: str) -> str:
    """One search call as the family's model writes it."""
    if family.tool_call_parser == "qwen3_coder":
        return f"<tool_call>\n<function=search>\n<parameter=query>\n{query}\n</parameter>\n</function>\n</tool_call>"
    if family.tool_call_parser == "llama3":
        return json.dumps({"name": "search", "parameters": {"query": query}})
    return "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": query}}) + "\n</tool_call>"


def calls_text(family: ModelFamily, queries: list[str]) -> str:
    """Several search calls in one turn, as the family's model writes them (Llama's separated by "; ")."""
    return ("; " if family.tool_call_parser == "llama3" else "\n").join(call_text(family, query) for query in queries)


def thought_text(family: ModelFamily, prompt_text: str, thought: str) -> str:
    """A thought as the model writes it after this generation prompt (nothing when thinking is off)."""
    state = thought_in_prompt(family, prompt_text)
    opening, closing = family.think_tags
    if state == "open":
        return f"{thought}\n{closing}\n\n"
    if state == "closed":
        return ""
    return f"{opening}{thought}{closing}\n"


def two_searches_then_answer(family: ModelFamily, prompt_text: str) -> list[str]:
    """What the model writes on each turn: a search, another, the answer (the episode the rollout tests run). A Llama
    call is the whole turn, or follows `<|python_tag|>` after the model's text (SGLang's llama3 detector reads no
    other)."""
    think = lambda text: thought_text(family, prompt_text, text)  # noqa: E731
    first, second = call_text(family, "capital of France"), call_text(family, "Paris France capital city")
    if family.tool_call_parser == "llama3":
        turns = [first, think("Check once more.") + "<|python_tag|>" + second]
    else:
        turns = [think("Look it up.") + first, think("Check once more.") + second]
    return [*turns, think("The documents agree: Paris.") + "<answer> Paris </answer>"]
