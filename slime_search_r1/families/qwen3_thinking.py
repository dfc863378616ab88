"""Qwen3-Thinking-2507: Qwen2.5's JSON calls, and a thought the generation prompt opens (it ends with `<think>\\n`, so
the response begins mid-thought and holds only `</think>`); no toggle.

SGLang 0.5.23 (srt/parser/template_detection.py): a template that writes `<|im_start|>assistant\\n<think>\\n` and never
mentions thinking otherwise is the `force_reasoning_pattern` reasoning-mode rule (REASONING_MODE_RULES, line 164),
reasoning parser `deepseek-r1` (`_is_deepseek_r1`, line 522; REASONING_PARSER_RULES, line 576). Its tool-call rule
for such a template is `deepseek_r1` -> deepseekv3 (TOOL_CALL_PARSER_RULES, line 622), which does not read this
template's `<tool_call>` JSON: serve it with `--tool-call-parser qwen25`. Our rule: SGLang's forced-thought pattern,
or the template's generation prompt opening a thought with no `enable_thinking` toggle, and `<tool_call>` calls.
"""

import re

from slime_search_r1.families import PROMPT_OPENS, ModelFamily, Thinking
from slime_search_r1.families.qwen25 import CALL_FORMAT, read_json_tool_calls

# SGLang's force_reasoning_pattern (template_detection.py, line 164), over the template's source text.
FORCED_THOUGHT = re.compile(r"<\|im_start\|>assistant\\n<think>\\n")
# The generation prompt as the official Qwen3-Thinking-2507 template writes it, in two string literals.
GENERATION_PROMPT_THOUGHT = re.compile(
    r"if\s+add_generation_prompt\s*%}\s*{{-?\s*'<\|im_start\|>assistant\\n(?:<think>\\n)?'\s*}}\s*"
    r"(?:{{-?\s*'<think>\\n'\s*}})?",
)


def opens_a_thought_in_the_prompt(template: str) -> bool:
    if "enable_thinking" in template or "<tool_call>" not in template or "<function=" in template:
        return False
    if FORCED_THOUGHT.search(template) and "thinking" not in template:
        return True
    prompt = GENERATION_PROMPT_THOUGHT.search(template)
    return prompt is not None and "<think>" in prompt.group(0)


QWEN3_THINKING = ModelFamily(
    name="qwen3_thinking",
    models="Qwen3-Thinking-2507 (e.g. Qwen3-4B-Thinking-2507)",
    read_calls=read_json_tool_calls,
    call_format=CALL_FORMAT,
    tool_call_parser="qwen25",
    reasoning_parser="deepseek-r1",
    thinking=Thinking(PROMPT_OPENS),
    matches=opens_a_thought_in_the_prompt,
    rule="SGLang template_detection.py: force_reasoning_pattern (line 164) -> reasoning parser deepseek-r1 "
    "(line 576); tool calls ours (SGLang's line 622 would say deepseekv3): qwen25",
    rewrites_history=True,
)
