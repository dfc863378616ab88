"""Chat-mode episodes on each model family's real tokenizer and template (the cases: support/family_cases.py): what the
scripted model writes in each family's own formats.

The model writes a thought as its generation prompt leaves it: it opens `<think>` itself when the prompt opens
none, it only closes the thought the prompt opened (Qwen3-Thinking-2507, Qwen3.5), and writes none after the empty
thought a prompt with thinking off holds. Calls are written as the family's SGLang parser reads them.
"""

import json

from slime_search_r1.families import THINK_TAGS, ModelFamily
from slime_search_r1.protocols.xml_tags import prompt_thought


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
    state = prompt_thought(prompt_text)
    opening, closing = THINK_TAGS
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
