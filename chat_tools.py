"""LLM_API_MODE=chat: the `search` tool, the chat-format prompt, and reading the model's tool calls."""

import json
import re
from dataclasses import dataclass, field

from qa_em_format import ANSWER_PATTERN

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": (
            "Search Wikipedia and return the top passages. Give one query, or a list of queries to search "
            "several things at once."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    ],
                    "description": "What to search for.",
                }
            },
            "required": ["query"],
        },
    },
}

CHAT_SYSTEM_PROMPT = (
    "You are a helpful assistant that answers questions with the help of a search tool. Reason step by step "
    "inside <think> and </think> every time you get new information. If you lack some knowledge, call the "
    "search tool; you can call it as many times as you want. When no further knowledge is needed, give the "
    "final answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>."
)

MAX_QUERIES_PER_CALL = 5
TOOL_CALL_PATTERN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

NO_ACTION_HINT = (
    "Your last reply had neither a search tool call nor a final answer. Call the search tool, or give the final "
    "answer inside <answer> and </answer>."
)


def chat_question(question: str) -> str:
    """The user turn of the chat-format data (the question gets a `?` like Search-R1's)."""
    question = question.strip()
    return f"Question: {question if question.endswith('?') else question + '?'}"


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: dict
    queries: list[str] = field(default_factory=list)
    error: str | None = None  # why the call cannot run; the model is told in the tool message


def answers_in(content: str) -> list[str]:
    """The stripped contents of every <answer>...</answer> in an assistant message, in order."""
    return [answer.strip() for answer in ANSWER_PATTERN.findall(content)]


# The model's own text after its first tool call (e.g. an invented <tool_response>), kept in the recorded
# assistant message under this key: chat templates ignore it, the chat reward does not.
TEXT_AFTER_TOOL_CALLS = "text_after_tool_calls"


@dataclass
class AssistantTurn:
    content: str
    tool_calls: list[ToolCall]
    unparsable: list[str]  # <tool_call> blocks that are not JSON objects
    text_after_tool_calls: str = ""  # what the model wrote after its first call besides whitespace and parsed calls

    @property
    def answers(self) -> list[str]:
        return answers_in(self.content)

    @property
    def is_final_answer(self) -> bool:
        return not self.tool_calls and not self.unparsable and bool(self.answers)

    def message(self) -> dict:
        """The OpenAI-format assistant message (arguments as a JSON string, as the API sends them)."""
        message: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
                }
                for call in self.tool_calls
            ]
        if self.text_after_tool_calls:
            message[TEXT_AFTER_TOOL_CALLS] = self.text_after_tool_calls
        return message


def _check_call(call_id: str, name: object, arguments: object) -> ToolCall:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(call_id, str(name), {}, error="arguments are not valid JSON")
    if not isinstance(arguments, dict):
        return ToolCall(call_id, str(name), {}, error="arguments must be a JSON object")
    call = ToolCall(call_id, str(name), arguments)
    if name != "search":
        call.error = f"unknown tool {name!r}; the only tool is 'search'"
        return call
    query = arguments.get("query")
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        call.error = "'query' must be a non-empty string or a list of non-empty strings"
    elif len(queries) > MAX_QUERIES_PER_CALL:
        call.error = f"at most {MAX_QUERIES_PER_CALL} queries per call"
    else:
        call.queries = [q.strip() for q in queries]
    return call


def parse_generated_turn(text: str, end_of_turn: str, turn_index: int) -> AssistantTurn:
    """Read a raw assistant turn in Qwen's format: text, then `<tool_call>{"name", "arguments"}</tool_call>`s.

    Only whitespace and further well-formed calls may follow the first call; anything else the model wrote
    there (an invented tool response, an answer, a broken call) is kept as text_after_tool_calls.
    """
    body = text.removesuffix(end_of_turn) if end_of_turn else text
    first_call = body.find("<tool_call>")
    if first_call < 0:
        return AssistantTurn(body.rstrip("\n"), [], [])
    content, rest = body[:first_call].rstrip("\n"), body[first_call:]
    calls, unparsable, leftover, position = [], [], [], 0
    for match in TOOL_CALL_PATTERN.finditer(rest):
        call = _parse_call_block(match.group(1), f"call_{turn_index}_{len(calls)}")
        if call is None:
            unparsable.append(match.group(1))
            continue
        calls.append(call)
        leftover.append(rest[position : match.start()])
        position = match.end()
    leftover.append(rest[position:])
    if rest.count("<tool_call>") > rest.count("</tool_call>"):
        unparsable.append(rest[rest.rfind("<tool_call>") :])  # an unclosed call
    return AssistantTurn(content, calls, unparsable, "".join(leftover).strip())


def _parse_call_block(block: str, call_id: str) -> ToolCall | None:
    """A <tool_call> block's {"name", "arguments"} object, or None when the block is not one."""
    try:
        payload = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or "name" not in payload:
        return None
    return _check_call(call_id, payload["name"], payload.get("arguments", {}))


def parse_openai_message(message: dict, turn_index: int) -> AssistantTurn:
    """Read an assistant message from /v1/chat/completions (the server already parsed the tool calls)."""
    content = message.get("content") or ""
    calls = []
    for index, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") or {}
        call_id = raw.get("id") or f"call_{turn_index}_{index}"
        calls.append(_check_call(call_id, function.get("name"), function.get("arguments", {})))
    unparsable = TOOL_CALL_PATTERN.findall(content) if "<tool_call>" in content else []
    return AssistantTurn(content, calls, unparsable, message.get(TEXT_AFTER_TOOL_CALLS) or "")
