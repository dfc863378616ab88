"""Qwen3-Coder: no thoughts, and calls as
`<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
Qwen3.5 writes its calls the same way (qwen35.py).

Calls are read as SGLang's qwen3_coder detector reads them (srt/function_call/qwen3_coder_detector.py,
detect_and_parse): every `<function=NAME>` of a block (its `</function>` may be missing), every `<parameter=P>` of it
(its `</parameter>` may be missing), one newline stripped from each end of a value, the value converted by the
parameter's JSON-schema type (`_convert_param_value`: string as is, integer, number, boolean, object or array as JSON,
"null" as None); an unclosed `<tool_call>` is read when no block is closed. A block without a function is unparsable
here (the detector skips it), with why: e.g. a JSON call in a model that calls tools this way.

SGLang 0.5.23 (srt/parser/template_detection.py): `<function=` and `<parameter=` in the template is `_is_qwen3_coder`
(line 496), tool-call parser `qwen3_coder` (TOOL_CALL_PARSER_RULES, line 619).
"""

import ast
import json
import re

from slime_search_r1.families import CallsRead, ModelFamily, Thinking
from slime_search_r1.families.tool_call_blocks import read_blocks

CALL_FORMAT = "<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>"
FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)
TEXT_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def schema_type(schema: object) -> str:
    """The one type a parameter's schema gives its value, as the detector infers it (utils.py
    infer_type_from_json_schema): `type` (the first non-null of a list), else the types of anyOf/oneOf (one type,
    or one besides null; string when they differ and one is string; else the first), else "string"."""
    if not isinstance(schema, dict):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if isinstance(kind, str):
        return kind.lower()
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        kinds = [schema_type(branch) for branch in branches if isinstance(branch, dict)]
        distinct = list(dict.fromkeys(kinds))
        if len(distinct) == 1 or (len(distinct) == 2 and "null" in distinct):
            return next(k for k in distinct if k != "null") if "null" in distinct else distinct[0]
        if distinct:
            return "string" if "string" in distinct else distinct[0]
    return "string"


def convert(value: str, schema: object) -> object:
    """A parameter's text as the value its schema asks for; text that does not convert stays text."""
    if value.lower() == "null":
        return None
    kind = schema_type(schema)
    if kind in TEXT_TYPES:
        return value
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        exact = "." not in value and "e" not in value.lower()
        return int(number) if exact and number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def parameter_schemas(name: str, tool_schemas: list[dict]) -> dict:
    for schema in tool_schemas:
        function = schema.get("function") or {}
        if schema.get("type", "function") == "function" and function.get("name") == name:
            parameters = function.get("parameters")
            if not isinstance(parameters, dict):
                return {}
            return parameters.get("properties") if isinstance(parameters.get("properties"), dict) else parameters
    return {}


def block_reader(tool_schemas: list[dict]):
    def read_block(block: str) -> list[tuple[object, object]] | str:
        functions = FUNCTION.findall(block)
        if not functions:
            return f"no <function=NAME> in the block; this model calls tools as {CALL_FORMAT}"
        calls = []
        for closed, unclosed in functions:
            body = closed or unclosed
            if ">" not in body:
                return f"a <function= without its name's closing '>'; this model calls tools as {CALL_FORMAT}"
            name, parameters = body[: body.index(">")], body[body.index(">") + 1 :]
            schemas, arguments = parameter_schemas(name, tool_schemas), {}
            for found in PARAMETER.findall(parameters):
                if ">" not in found:
                    continue
                key, value = found[: found.index(">")], found[found.index(">") + 1 :]
                value = value.removeprefix("\n").removesuffix("\n")
                arguments[key] = convert(value, schemas[key]) if key in schemas else value
            calls.append((name, arguments))
        return calls

    return read_block


def read_function_tool_calls(text: str, tool_schemas: list[dict]) -> CallsRead:
    return read_blocks(text, block_reader(tool_schemas), unclosed_read=True)


def writes_function_calls(template: str) -> bool:
    """SGLang's _is_qwen3_coder (template_detection.py, line 496)."""
    return "<function=" in template and "<parameter=" in template


def is_qwen3_coder(template: str) -> bool:
    return writes_function_calls(template) and "enable_thinking" not in template


QWEN3_CODER = ModelFamily(
    name="qwen3_coder",
    models="Qwen3-Coder",
    read_calls=read_function_tool_calls,
    call_format=CALL_FORMAT,
    tool_call_parser="qwen3_coder",
    reasoning_parser=None,
    thinking=Thinking(),
    matches=is_qwen3_coder,
    rule="SGLang template_detection.py: _is_qwen3_coder (line 496) -> tool-call parser qwen3_coder (line 619)",
)
