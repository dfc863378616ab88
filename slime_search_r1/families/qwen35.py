"""Qwen3.5 (and Qwen3.6): Qwen3-Coder's `<function=…><parameter=…>` calls, and a thought the generation prompt opens
(`<think>\\n`; the response holds only `</think>`), turned off by `enable_thinking=False` (the prompt then holds an
empty `<think>\\n\\n</think>\\n\\n`), or on by `enable_thinking=True` in a template that thinks only when asked.

SGLang 0.5.23 (srt/parser/template_detection.py): `_is_qwen3_coder` (line 496) -> tool-call parser `qwen3_coder`
(TOOL_CALL_PARSER_RULES, line 619, before the `qwen` rule); the `enable_thinking_default_true` reasoning-mode rule
(line 221) -> `_is_qwen3` (line 500) -> reasoning parser `qwen3` (line 568). The template drops the thoughts of turns
before the last user message, so it rewrites history.
"""

from slime_search_r1.families import PROMPT_OPENS, ModelFamily, Thinking
from slime_search_r1.families.qwen3_coder import CALL_FORMAT, read_function_tool_calls, writes_function_calls


def is_qwen35(template: str) -> bool:
    return writes_function_calls(template) and "enable_thinking" in template


QWEN35 = ModelFamily(
    name="qwen35",
    models="Qwen3.5, Qwen3.6",
    read_calls=read_function_tool_calls,
    call_format=CALL_FORMAT,
    tool_call_parser="qwen3_coder",
    reasoning_parser="qwen3",
    thinking=Thinking(PROMPT_OPENS, toggle="enable_thinking"),
    matches=is_qwen35,
    rule="SGLang template_detection.py: _is_qwen3_coder (line 496) -> tool-call parser qwen3_coder (line 619); "
    "enable_thinking_default_true (line 221) -> reasoning parser qwen3 (line 568)",
    rewrites_history=True,
)
