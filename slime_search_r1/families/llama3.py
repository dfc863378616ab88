"""Llama 3.2 (3.1 alike): a call is a bare JSON object, `{"name": NAME, "parameters": {...}}`, as the whole turn or
after `<|python_tag|>`; several are separated by ";"; no thoughts. Its template renders one call per assistant
turn (a turn with more is refused, calls_per_turn), the tool message as ipython (its text JSON-quoted), and a turn
ends with `<|eot_id|>`.

Calls are read as SGLang's llama3 detector reads them (srt/function_call/llama32_detector.py, detect_and_parse): the
text after `<|python_tag|>`, or the whole turn when it starts with "{", decoded object by object (a Python dict
literal too); arguments under "parameters" or "arguments" (base_format_detector.py parse_base_json). What the
detector skips (an object without a name, text that does not decode) is unparsable here, with why.

SGLang 0.5.23 has no template rule for Llama (srt/parser/template_detection.py: no TOOL_CALL_PARSER_RULES entry
matches it): it is served with `--tool-call-parser llama3`. Our rule: the template frames turns with
`<|start_header_id|>` and asks for calls with a "parameters" key.
"""

import ast
import json

from slime_search_r1.families import CallsRead, ModelFamily, Thinking

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"
CALL_FORMAT = '{"name": ..., "parameters": {...}}'
_decoder = json.JSONDecoder()


def _balanced_object(text: str, start: int) -> int:
    """Where the {...} starting at `start` closes (counting braces), or `start` when it never does."""
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return start


def _next_object(text: str, start: int) -> tuple[object, int] | None:
    """The JSON (or Python dict literal) value at `start` and where it ends, or None."""
    try:
        return _decoder.raw_decode(text, start)
    except json.JSONDecodeError:
        pass
    end = _balanced_object(text, start)
    if end > start:
        try:
            value = ast.literal_eval(text[start:end].strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
        if isinstance(value, dict):
            return value, end
    return None


def read_llama3_calls(text: str, tool_schemas: list[dict]) -> CallsRead:
    if PYTHON_TAG in text:
        content, action = text.split(PYTHON_TAG, 1)
    elif text.startswith("{"):
        content, action = "", text
    else:
        return CallsRead(text.rstrip("\n"))
    turn, position = CallsRead(content.rstrip("\n")), 0
    while position < len(action):
        found = _next_object(action, position)
        if found is None:
            restart = action.find('{"name":', position + 1)
            if restart < 0:
                break
            turn.unparsable.append((action[position:restart], f"not a JSON call; calls are {CALL_FORMAT}"))
            position = restart
            continue
        value, end = found
        if isinstance(value, dict) and value.get("name"):
            turn.calls.append((value["name"], value.get("parameters") or value.get("arguments", {})))
        else:
            turn.unparsable.append((action[position:end], f'a JSON value without a "name"; calls are {CALL_FORMAT}'))
        position = end + len(SEPARATOR)
    rest = action[position:].strip()
    if rest.startswith("{"):
        turn.unparsable.append((rest, f"not a JSON call; this model calls tools as {CALL_FORMAT}"))
    else:
        turn.text_after_calls = rest
    return turn


def is_llama3(template: str) -> bool:
    return "<|start_header_id|>" in template and '"parameters"' in template


LLAMA3 = ModelFamily(
    name="llama3",
    models="Llama-3.2 (3B-Instruct), Llama-3.1",
    read_calls=read_llama3_calls,
    call_format=CALL_FORMAT,
    tool_call_parser="llama3",
    calls_per_turn=1,  # the template raises "This model only supports single tool-calls at once!"
    reasoning_parser=None,
    thinking=Thinking(),
    matches=is_llama3,
    rule="ours (SGLang 0.5.23 places no Llama template; --tool-call-parser llama3): <|start_header_id|> and "
    '"parameters"',
)
