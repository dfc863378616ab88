"""LLM_API_MODE=chat: the model calls tools with OpenAI-style tool calls through its chat template.

An assistant turn is read in its model family's format (families/: each as SGLang's tool-call parser for it
reads it; a call in another family's format is unparsable, with why), or taken as a server parsed it
(router_handler). Each call is answered by a tool message, a turn with neither a
usable call nor an answer by a short user hint; the template's rendering of those messages is what the model
is shown next (chat_template.py). The conversation is recorded as OpenAI messages for the reward.
"""

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from slime_search_r1.episode import Action, Reply, ToolCall, Turn, encode_text
from slime_search_r1.families import CallsRead, ModelFamily
from slime_search_r1.families.detection import check_family_tracking, foreign_calls, tokenizer_family
from slime_search_r1.families.qwen25 import QWEN25
from slime_search_r1.protocols.chat_template import ChatRenderer, chat_template_kwargs, turn_stop_ids
from slime_search_r1.protocols.xml_tags import ANSWER_PATTERN
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.tools.contract import Tool, read_call

TOOL_CALL_PATTERN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# The model's own text after its first tool call (e.g. an invented <tool_response>), kept in the recorded
# assistant message under this key: chat templates ignore it, the chat reward does not.
TEXT_AFTER_TOOL_CALLS = "text_after_tool_calls"
# The calls the model's family could not read, kept in the recorded assistant message under this key as
# {"text", "error"} (why: malformed, or written in another family's format); templates ignore it, the reward does not.
UNPARSABLE_TOOL_CALLS = "unparsable_tool_calls"
# SEARCH_R1_FORCE_ANSWER=inject: the user message after the replies before the forced turn. The recorded message
# carries FORCED_ANSWER_KEY (chat templates ignore it), so the chat reward does not take it for a retry hint.
FORCE_ANSWER_MESSAGE = (
    "No more tool calls will be answered. Give your final answer now, inside <answer> and </answer>."
)
FORCED_ANSWER_KEY = "forced_answer"


def no_action_hint(tools: Mapping[str, Tool]) -> str:
    """The user hint after a turn with neither a usable call nor an answer, naming the enabled tools."""
    names = " or ".join(tools)
    return (
        f"Your last reply had neither a {names} tool call nor a final answer. Call the {names} tool, or give the "
        "final answer inside <answer> and </answer>."
    )


def answers_in(content: str) -> list[str]:
    """The stripped contents of every <answer>...</answer> in an assistant message, in order."""
    return [answer.strip() for answer in ANSWER_PATTERN.findall(content)]


@dataclass
class AssistantMessage:
    """One assistant message, read: its text, its tool calls, and what does not belong there."""

    content: str
    tool_calls: list[ToolCall]
    unparsable: list[str]  # the calls the family's reader could not read
    text_after_tool_calls: str = ""  # what the model wrote after its first call besides whitespace and parsed calls
    unparsable_why: list[str] = field(default_factory=list)  # why, one per unparsable call

    @property
    def answers(self) -> list[str]:
        return answers_in(self.content)

    @property
    def is_final_answer(self) -> bool:
        return not self.tool_calls and not self.unparsable and bool(self.answers)

    @property
    def is_invalid_action(self) -> bool:
        """A malformed call, or neither a call nor an answer (the chat twin of XML's invalid action)."""
        malformed = bool(self.unparsable) or any(call.error for call in self.tool_calls)
        return malformed or not (self.tool_calls or self.answers)

    def to_openai(self) -> dict:
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
        if self.unparsable:
            why = [*self.unparsable_why, *[""] * (len(self.unparsable) - len(self.unparsable_why))]
            message[UNPARSABLE_TOOL_CALLS] = [
                {"text": text, "error": error} for text, error in zip(self.unparsable, why, strict=True)
            ]
        return message


def parse_generated_turn(
    text: str,
    end_of_turn: str,
    turn_index: int,
    tools: Mapping[str, Tool],
    family: ModelFamily = QWEN25,
    tool_schemas: list[dict] | None = None,
) -> AssistantMessage:
    """Read a raw assistant turn in `family`'s format (Qwen2.5's: text, then `<tool_call>{"name", "arguments"}
    </tool_call>`s); `tool_schemas`: the tools the template showed (a reader may convert arguments by their types).

    Only whitespace and further well-formed calls may follow the first call; anything else the model wrote
    there (an invented tool response, an answer, a broken call) is kept as text_after_tool_calls. A turn whose
    calls another family's reader reads, and this family's does not, has them unparsable, saying so; so does a turn
    with more calls than the family's template renders in one turn (calls_per_turn: Llama's, one).
    """
    body = text.removesuffix(end_of_turn) if end_of_turn else text
    schemas = tool_schemas if tool_schemas is not None else [tool.schema for tool in tools.values()]
    read = family.read_calls(body, schemas)
    if not read.calls:
        other = foreign_calls(family, body, schemas)
        if other is not None:
            why = (
                f"a tool call in the {other.name} format ({other.call_format}), which this model's family "
                f"({family.name}) does not write; its calls are {family.call_format}"
            )
            read.unparsable = [(body[len(read.content) :].strip(), why)]
    limit = family.calls_per_turn
    if limit is not None and len(read.calls) > limit:
        why = (
            f"{len(read.calls)} tool calls in one turn; this model's chat template ({family.name}) renders at most "
            f"{limit} per assistant turn, so none was run: make one call per turn"
        )
        read = CallsRead(read.content, unparsable=[(body[len(read.content) :].strip(), why)])
    calls = [
        read_call(f"call_{turn_index}_{index}", name, arguments, tools)
        for index, (name, arguments) in enumerate(read.calls)
    ]
    return AssistantMessage(
        read.content,
        calls,
        [text for text, _ in read.unparsable],
        read.text_after_calls,
        [why for _, why in read.unparsable],
    )


def parse_openai_message(message: dict, turn_index: int, tools: Mapping[str, Tool]) -> AssistantMessage:
    """Read an assistant message from /v1/chat/completions (the server already parsed the tool calls)."""
    content = message.get("content") or ""
    calls = []
    for index, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") or {}
        call_id = raw.get("id") or f"call_{turn_index}_{index}"
        calls.append(read_call(call_id, function.get("name"), function.get("arguments", {}), tools))
    unparsable = TOOL_CALL_PATTERN.findall(content) if "<tool_call>" in content else []
    recorded = [item for item in message.get(UNPARSABLE_TOOL_CALLS) or [] if isinstance(item, dict)]
    unparsable += [str(item.get("text", "")) for item in recorded]
    why = [""] * (len(unparsable) - len(recorded)) + [str(item.get("error", "")) for item in recorded]
    return AssistantMessage(content, calls, unparsable, message.get(TEXT_AFTER_TOOL_CALLS) or "", why)


def initial_messages(prompt) -> list[dict]:
    """A private copy of the prompt messages (the caller's object is never touched)."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = [dict(m) for m in copy.deepcopy(list(prompt))]
    if not messages or not all(isinstance(m.get("role"), str) for m in messages):
        raise ValueError(
            "chat mode needs sample.prompt as a list of {'role', 'content'} messages (run slime without "
            "--apply-chat-template; see oai_format_data_preprocess.py)"
        )
    return messages


def sample_tools(sample, tools: Mapping[str, Tool]) -> list[dict]:
    """The tool list slime read with --tool-key (sample.metadata['tools']), or the enabled tools' schemas; a tool
    listed there that the `tools` setting does not enable would be shown to the model but refused when called."""
    listed = (sample.metadata or {}).get("tools") or [tool.schema for tool in tools.values()]
    names = [(tool.get("function") or {}).get("name") for tool in listed if isinstance(tool, dict)]
    not_enabled = [name for name in names if name not in tools]
    if not_enabled:
        raise ConfigError(
            f"the sample's tool list (slime's --tool-key column) offers {', '.join(map(repr, not_enabled))}, which "
            f"the tools setting does not enable (it enables {', '.join(tools)}): set SEARCH_R1_TOOLS to match the "
            "data, or convert the data again (oai_format_data_preprocess.py --tools)"
        )
    return copy.deepcopy(listed)


class ChatProtocol:
    records_conversation = True

    def __init__(self, state, sampling_params: dict):
        self.tokenizer = state.tokenizer
        self.tools = state.tools
        self.messages = initial_messages(state.sample.prompt)
        self.tool_schemas = sample_tools(state.sample, self.tools)
        self.family = tokenizer_family(state.config.model_family, state.tokenizer)
        check_family_tracking(self.family, state.config.token_tracking_mode)
        kwargs = chat_template_kwargs(state.args, state.sample)
        self.renderer = ChatRenderer(state.tokenizer, self.tool_schemas, kwargs, self.messages)
        self.prompt_text = self.renderer.render(self.messages, add_generation_prompt=True)
        # The assistant turn ends with the template's end-of-turn token (<|im_end|> for Qwen2.5), on any served model.
        stop_ids = turn_stop_ids(sampling_params, state.tokenizer, self.renderer.end_of_turn_token)
        self.sampling_params = {**sampling_params, "stop_token_ids": stop_ids}
        self.cut_at_stops: tuple[str, ...] = ()

    def read(self, turn: Turn, state) -> Action:
        if turn.message is not None:
            message = parse_openai_message(turn.message, state.turn_index, self.tools)
        else:
            end_of_turn = self.renderer.end_of_turn_text.strip()
            message = parse_generated_turn(
                turn.text, end_of_turn, state.turn_index, self.tools, self.family, self.tool_schemas
            )
        # Nothing stops a chat turn at </answer>: one cut by length after it was not finished.
        cut = turn.finish_type == "length" and not message.content.rstrip().endswith("</answer>")
        return Action(
            calls=message.tool_calls,
            final=message.is_final_answer and not cut,
            invalid=message.is_invalid_action,
            message=message.to_openai(),
        )

    def reply(self, action: Action, results: dict[str, str], turn: Turn, state, force_answer: bool = False) -> Reply:
        """Each call's tool message (or the hint after a turn without one); with `force_answer`, then the user message
        that tells the model to answer now."""
        messages, truncated = self.tool_messages(action.calls, results, state.config)
        if force_answer:
            messages.append({"role": "user", "content": FORCE_ANSWER_MESSAGE, FORCED_ANSWER_KEY: True})
        history = self.messages + state.history_before_turn()
        ids = self.renderer.followup_ids(history, messages, turn.ids, action.message)
        return Reply(ids, messages, truncated)

    def tool_messages(self, calls: list[ToolCall], results: dict[str, str], config) -> tuple[list[dict], int]:
        """One tool message per call (its result, cut to its tool's budget, or what was wrong with the call), or a
        hint when there was no call; and how many results were cut."""
        if not calls:
            return [{"role": "user", "content": no_action_hint(self.tools)}], 0
        messages, truncated = [], 0
        for call in calls:
            tool = self.tools.get(call.name)
            if call.error is not None:
                usage = tool.usage if tool else " ".join(t.usage for t in self.tools.values())
                content = f"Error: {call.error}. {usage}"
            else:
                ids, budget = encode_text(self.tokenizer, results[call.call_id]), tool.observation_budget(config)
                if len(ids) > budget:
                    truncated += 1
                    ids = ids[:budget]
                content = self.tokenizer.decode(ids, skip_special_tokens=False)
            messages.append({"role": "tool", "tool_call_id": call.call_id, "name": call.name, "content": content})
        return messages, truncated
