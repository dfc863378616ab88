"""LLM_API_MODE=chat: the model calls a `search` tool through OpenAI-style messages.

manual        the chat template is rendered here and each turn goes through /generate with input_ids:
              generated ids and log probs are the engine's, follow-up ids are the template's delta.
router_radix  the same rendered text goes through the slime router's /generate; the trajectory comes
              from its /retrieve_from_text (this loses the messages' semantics for the router).
router_handler messages go through the router's /v1/chat/completions; the trajectory comes from its
              /retrieve_from_messages_template, prompt tokens sliced off.
"""

import asyncio
import copy

from chat_template import ChatRenderer, chat_template_kwargs
from chat_tools import NO_ACTION_HINT, SEARCH_TOOL, AssistantTurn, parse_generated_turn, parse_openai_message
from episode import encode_prompt, episode_budget, run_episode, timed_search
from observations import encode_text
from search_r1_config import SearchR1Config
from search_results import format_documents
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from token_drivers import ExactDriver, GeneratedTurn, HandlerDriver, RadixDriver
from trajectory import METADATA_KEY, EpisodeStats


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


def sample_tools(sample: Sample) -> list[dict]:
    """The tool list slime read with --tool-key (sample.metadata['tools']), or the built-in search tool."""
    tools = (sample.metadata or {}).get("tools") or [SEARCH_TOOL]
    names = [(tool.get("function") or {}).get("name") for tool in tools if isinstance(tool, dict)]
    if "search" not in names:
        raise ValueError(f"the sample's tools {names} have no 'search' function")
    return copy.deepcopy(tools)


async def tool_results(turn: AssistantTurn, config: SearchR1Config, stats: EpisodeStats, tokenizer, aborted=None):
    """Messages that answer the model's turn: one tool message per call, or a hint when it did nothing usable."""
    if not turn.tool_calls:
        return [{"role": "user", "content": NO_ACTION_HINT}]
    runnable = [call for call in turn.tool_calls if call.error is None]
    found = await asyncio.gather(*(timed_search(config, q, stats, aborted) for call in runnable for q in call.queries))
    messages, position = [], 0
    for call in turn.tool_calls:
        if call.error is not None:
            content = f'Error: {call.error}. Call search with {{"query": "..."}}.'
        else:
            contents = [c for result in found[position : position + len(call.queries)] for c in result]
            position += len(call.queries)
            docs = encode_text(tokenizer, format_documents(contents).strip())
            if len(docs) > config.max_obs_tokens:
                stats.truncated_observations += 1
                docs = docs[: config.max_obs_tokens]
            content = tokenizer.decode(docs, skip_special_tokens=False)
        messages.append({"role": "tool", "tool_call_id": call.call_id, "name": call.name, "content": content})
    return messages


def is_invalid_action(turn: AssistantTurn) -> bool:
    """A turn with a malformed call, or with neither a call nor an answer (the chat twin of XML's invalid action)."""
    malformed = bool(turn.unparsable) or any(call.error for call in turn.tool_calls)
    return malformed or not (turn.tool_calls or turn.answers)


class ChatProtocol:
    def __init__(self, renderer: ChatRenderer, messages, conversation, config, stats, tokenizer, sampling_params):
        self.renderer, self.messages, self.conversation = renderer, messages, conversation
        self.config, self.stats, self.tokenizer = config, stats, tokenizer
        self.end_of_turn = renderer.end_of_turn_text
        # The assistant turn ends with the template's end-of-turn token (<|im_end|> for Qwen2.5).
        stop_ids = list(sampling_params.get("stop_token_ids") or [])
        eot_token = renderer.end_of_turn_token
        if eot_token is not None and eot_token not in stop_ids:
            stop_ids.append(eot_token)
        self.sampling_params = {**sampling_params, "stop_token_ids": stop_ids}
        self.turn: AssistantTurn | None = None
        self.pending: list[dict] = []
        self.aborted = None

    def read(self, turn: GeneratedTurn, turn_index: int) -> bool:
        if turn.message is not None:
            self.turn = parse_openai_message(turn.message, turn_index)
        else:
            self.turn = parse_generated_turn(turn.text, self.end_of_turn.strip(), turn_index)
        self.conversation.append(self.turn.message())
        # Nothing stops a chat turn at </answer>: one cut by length after it was not finished.
        cut = turn.finish_type == "length" and not self.turn.content.rstrip().endswith("</answer>")
        if turn.finish_type != "length" and is_invalid_action(self.turn):  # a turn cut short is the budget's doing
            self.stats.invalid_actions += 1
        return self.turn.is_final_answer and not cut

    async def respond(self, turn: GeneratedTurn) -> list[int]:
        self.pending = await tool_results(self.turn, self.config, self.stats, self.tokenizer, self.aborted)
        history = self.messages + self.conversation[:-1]
        return self.renderer.followup_ids(history, self.pending, turn.ids)

    def accept(self) -> None:
        self.conversation.extend(self.pending)

    def on_finish(self, sample: Sample) -> None:
        sample.metadata[METADATA_KEY]["conversation"] = self.conversation


async def run_chat_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    state = GenerateState(args)
    tokenizer = state.tokenizer
    messages = initial_messages(sample.prompt)
    tools = sample_tools(sample)
    renderer = ChatRenderer(tokenizer, tools, chat_template_kwargs(args, sample), messages)
    prompt_text = renderer.render(messages, add_generation_prompt=True)
    prompt_ids = encode_prompt(tokenizer, prompt_text)
    conversation: list[dict] = []
    if config.token_tracking_mode == "router_handler":
        await HandlerDriver.check_router(args, config)
        driver = HandlerDriver(
            args, sample, tokenizer, prompt_ids, config, messages=messages, conversation=conversation, tools=tools
        )
    elif config.token_tracking_mode == "router_radix":
        await RadixDriver.check_router(args, config)
        driver = RadixDriver(args, sample, tokenizer, prompt_ids, config, prompt_text=prompt_text)
    else:
        driver = ExactDriver(args, sample, tokenizer, prompt_ids, config)
    protocol = ChatProtocol(renderer, messages, conversation, config, driver.stats, tokenizer, sampling_params)
    budget = episode_budget(args, sampling_params, config, evaluation)
    return await run_episode(state, driver, protocol, config, budget, evaluation)
