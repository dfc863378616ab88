"""Qwen3 (the hybrid thinking models, e.g. Qwen3-4B): Qwen2.5's JSON calls, thoughts the model opens with `<think>`,
turned off by `enable_thinking=False` (the generation prompt then holds an empty `<think>\\n\\n</think>\\n\\n`).

SGLang 0.5.23 (srt/parser/template_detection.py): the template's `enable_thinking is defined and enable_thinking is
false` is the `enable_thinking_default_true` reasoning-mode rule (REASONING_MODE_RULES, line 221), which `_is_qwen3`
(line 500) reads: tool-call parser `qwen` (TOOL_CALL_PARSER_RULES, line 620: the qwen25 detector) and reasoning
parser `qwen3` (REASONING_PARSER_RULES, line 568). The template splits an assistant message at `</think>` and drops
the thought of a turn before the last user message, so it rewrites history.
"""

import re

from slime_search_r1.families import MODEL_OPENS, ModelFamily, Thinking
from slime_search_r1.families.qwen25 import CALL_FORMAT, read_json_tool_calls

# The patterns of SGLang's enable_thinking_default_true rule (template_detection.py, lines 221-241).
THINKING_ON_BY_DEFAULT = (
    r"{%\s*if\s+not\s+enable_thinking\s+is\s+defined\s*%}.*?{%\s*set\s+enable_thinking\s*=\s*(?:true|True)\s*%}",
    r"set\s+enable_thinking\s*=\s*enable_thinking\s+if\s+enable_thinking\s+is\s+defined\s+else\s+(?:true|True)",
    r"enable_thinking\s+is\s+defined\s+and\s+(?:enable_thinking\s+is\s+false|not\s+enable_thinking)",
    r"enable_thinking\s+is\s+not\s+defined\s+or\s+enable_thinking",
    r"namespace\([^)]*enable_thinking\s*=\s*true",
)


def toggles_thinking_on_by_default(template: str) -> bool:
    """SGLang's enable_thinking_default_true rule: the template thinks unless enable_thinking is False."""
    return any(re.search(pattern, template, re.DOTALL) for pattern in THINKING_ON_BY_DEFAULT)


def is_qwen3(template: str) -> bool:
    return "<tool_call>" in template and "<function=" not in template and toggles_thinking_on_by_default(template)


QWEN3 = ModelFamily(
    name="qwen3",
    models="Qwen3 (hybrid thinking, e.g. Qwen3-4B)",
    read_calls=read_json_tool_calls,
    call_format=CALL_FORMAT,
    tool_call_parser="qwen",
    reasoning_parser="qwen3",
    thinking=Thinking(MODEL_OPENS, toggle="enable_thinking"),
    matches=is_qwen3,
    rule="SGLang template_detection.py: enable_thinking_default_true (line 221) -> _is_qwen3 (line 500): "
    "tool-call parser qwen (line 620), reasoning parser qwen3 (line 568)",
    rewrites_history=True,
)
