"""What a chat-mode conversation gives the reward: its answer, whether its format is valid, what the tools said.

A conversation is format-valid when every assistant turn but the last makes only well-formed calls to
enabled tools (each answered by its tool message), writes nothing but whitespace and further calls after
its first call (no invented <tool_response>, no answer) and no <answer> before it, no retry hint was needed,
and the last assistant turn makes no call and holds exactly one <answer>…</answer> with nothing after it.
The answer scored is the last <answer> of the final assistant message. qa_em_format.py scores the reading
with Search-R1's table, as it scores XML responses.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from slime_search_r1.protocols.chat import FORCED_ANSWER_KEY, answers_in, parse_openai_message
from slime_search_r1.tools.contract import Tool


def conversation_format_problem(conversation: list[dict], tools: Mapping[str, Tool]) -> str | None:
    """Why the conversation breaks the chat format rule (above), or None; calls are read with the enabled tools."""
    assistants = [i for i, m in enumerate(conversation) if m.get("role") == "assistant"]
    if not assistants:
        return "no assistant turn"
    if any(message.get("role") == "user" and not message.get(FORCED_ANSWER_KEY) for message in conversation):
        return "a retry hint was needed"  # the forced-answer instruction is the environment's, not a retry
    for position, message in enumerate(conversation):
        if message.get("role") != "assistant":
            continue
        turn = parse_openai_message(message, position, tools)
        if turn.unparsable:
            return "unparsable tool call"
        if turn.text_after_tool_calls:
            return "text after a tool call"
        if position != assistants[-1]:
            if not turn.tool_calls:
                return "an assistant turn before the last made no tool call"
            if any(call.error for call in turn.tool_calls):
                return "malformed tool call"
            if turn.answers:
                return "<answer> before the final turn"
            replies = conversation[position + 1 : position + 1 + len(turn.tool_calls)]
            if len(replies) != len(turn.tool_calls) or any(r.get("role") != "tool" for r in replies):
                return "a tool call without its tool message"
        else:
            if turn.tool_calls:
                return "the last turn is a tool call"
            if len(turn.answers) != 1:
                return f"{len(turn.answers)} <answer> blocks in the final turn"
            # from the first </answer>: a stray closing tag after the answer must not hide text before it
            if turn.content[turn.content.index("</answer>") + len("</answer>") :].strip():
                return "text after </answer>"
    return None


@dataclass(frozen=True)
class ConversationReading:
    answer: str | None  # the last <answer> of the final assistant message, unless that message calls a tool
    format_valid: bool
    tool_texts: list[str]  # what retrieving tools said (tool messages): the retrieval bonus looks there


def read_conversation(conversation: list[dict], tools: Mapping[str, Tool]) -> ConversationReading:
    final = next((m for m in reversed(conversation) if m.get("role") == "assistant"), None)
    answers = answers_in(final.get("content") or "") if final and not final.get("tool_calls") else []
    return ConversationReading(
        answer=answers[-1] if answers else None,
        format_valid=conversation_format_problem(conversation, tools) is None,
        tool_texts=[
            message.get("content") or ""
            for message in conversation
            if message.get("role") == "tool" and getattr(tools.get(message.get("name")), "retrieves", False)
        ],
    )
