"""Qwen2.5 (and Qwen3-Instruct-2507, whose template writes calls the same way and never thinks): JSON calls in
`<tool_call>` blocks, no thoughts of the template's own.

Calls are read as SGLang's qwen25 detector reads them (srt/function_call/qwen25_detector.py, detect_and_parse: each
block's JSON, an object or a list of them, its arguments under "arguments" or "parameters": base_format_detector.py
parse_base_json); a block it skips (not JSON, no name) is unparsable here. A block needs no newline after
`<tool_call>` or before `</tool_call>` (the detector's pattern wants them): a call the detector reads is read the same.

SGLang 0.5.23 has no template rule for this family (srt/parser/template_detection.py: no TOOL_CALL_PARSER_RULES entry
matches a template without `enable_thinking`, `<function=` or a forced `<think>`): it is served with
`--tool-call-parser qwen25`. Our rule: the template writes `<tool_call>` and no `<function=`, checked after the
families whose SGLang rules are narrower.
"""

import json

from slime_search_r1.families import CallsRead, ModelFamily, Thinking
from slime_search_r1.families.tool_call_blocks import read_blocks

CALL_FORMAT = '<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>'


def read_json_block(block: str) -> list[tuple[object, object]] | str:
    """A block's {"name", "arguments"} object (or list of them), or why it is not one."""
    try:
        payload = json.loads(block)
    except json.JSONDecodeError:
        return f"not a JSON call; this model calls tools as {CALL_FORMAT}"
    objects = payload if isinstance(payload, list) else [payload]
    if not objects or not all(isinstance(item, dict) and "name" in item for item in objects):
        return 'a JSON value without a "name"; this model calls tools as ' + CALL_FORMAT
    return [(item["name"], item.get("parameters") or item.get("arguments", {})) for item in objects]


def read_json_tool_calls(text: str, tool_schemas: list[dict]) -> CallsRead:
    return read_blocks(text, read_json_block)


def writes_json_tool_calls(template: str) -> bool:
    return "<tool_call>" in template and "<function=" not in template


QWEN25 = ModelFamily(
    name="qwen25",
    models="Qwen2.5, Qwen3-Instruct-2507",
    read_calls=read_json_tool_calls,
    call_format=CALL_FORMAT,
    tool_call_parser="qwen25",
    reasoning_parser=None,
    thinking=Thinking(),
    matches=writes_json_tool_calls,
    rule="ours (SGLang 0.5.23 places no such template; --tool-call-parser qwen25): <tool_call> and no <function=",
)
