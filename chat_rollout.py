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

from async_http import RequestFailed, post_json
from chat_template import ChatRenderer
from chat_tools import NO_ACTION_HINT, SEARCH_TOOL, AssistantTurn, parse_generated_turn, parse_openai_message
from observations import encode_text
from router_tracking import (
    RouterTrackingError,
    fill_sample_from_router,
    require_endpoint,
    retrieve,
    router_base_url,
    router_session,
)
from search_backend import SearchError
from search_r1_config import SearchR1Config
from search_results import format_documents
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from token_drivers import ExactDriver, RadixDriver
from trajectory import METADATA_KEY, EpisodeStats, record_finish, reset_response_fields
from xml_rollout import context_limit, encode_prompt, timed_search


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


async def tool_results(turn: AssistantTurn, config: SearchR1Config, stats: EpisodeStats, tokenizer) -> list[dict]:
    """Messages that answer the model's turn: one tool message per call, or a hint when it did nothing usable."""
    if not turn.tool_calls:
        return [{"role": "user", "content": NO_ACTION_HINT}]
    runnable = [call for call in turn.tool_calls if call.error is None]
    found = await asyncio.gather(*(timed_search(config, q, stats) for call in runnable for q in call.queries))
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


def _finish_chat(sample: Sample, conversation: list[dict]) -> Sample:
    sample.metadata[METADATA_KEY]["conversation"] = conversation
    return sample


async def run_chat_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    if config.token_tracking_mode == "router_handler":
        return await run_chat_handler_episode(args, sample, sampling_params, config, evaluation)
    state = GenerateState(args)
    tokenizer = state.tokenizer
    messages = initial_messages(sample.prompt)
    renderer = ChatRenderer(tokenizer, sample_tools(sample), sample.apply_chat_template_kwargs)
    prompt_text = renderer.render(messages, add_generation_prompt=True)
    prompt_ids = encode_prompt(tokenizer, prompt_text)
    if config.token_tracking_mode == "router_radix":
        await require_endpoint(router_base_url(args), "/retrieve_from_text", "router_radix")
        driver = RadixDriver(args, sample, tokenizer, prompt_ids, config, prompt_text=prompt_text)
    else:
        driver = ExactDriver(args, sample, tokenizer, prompt_ids, config)
    stats = driver.stats
    stats.evaluation = evaluation
    response_budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    max_context = context_limit(args, config, evaluation)
    end_of_turn = renderer.end_of_turn_text(messages)
    stop_ids = list(sampling_params.get("stop_token_ids") or [])
    eot_token = renderer.end_of_turn_token(messages)
    if eot_token is not None and eot_token not in stop_ids:
        stop_ids.append(eot_token)
    base_params = {**sampling_params, "stop_token_ids": stop_ids}
    conversation: list[dict] = []

    def tokens_left() -> int:
        return min(response_budget - driver.response_length, max_context - driver.context_length)

    async def finish(status: Sample.Status, reason: str) -> Sample:
        return _finish_chat(await driver.finish(status, reason), conversation)

    for turn_index in range(config.max_turns):
        if state.aborted:
            return await finish(Sample.Status.ABORTED, "rollout_aborted")
        if tokens_left() <= 0:
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        generated = await driver.generate({**base_params, "max_new_tokens": tokens_left()})
        if generated.finish_type == "abort":
            return await finish(Sample.Status.ABORTED, "engine_abort")
        stats.turns += 1
        turn = parse_generated_turn(generated.text, end_of_turn.strip(), turn_index)
        conversation.append(turn.message())
        if turn.is_final_answer:
            return await finish(Sample.Status.COMPLETED, "answer")
        if generated.finish_type == "length":
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        if turn_index == config.max_turns - 1:
            return await finish(Sample.Status.TRUNCATED, "max_turns")
        try:
            replies = await tool_results(turn, config, stats, tokenizer)
        except SearchError:
            sample.remove_sample = config.drop_failed_samples
            return await finish(Sample.Status.FAILED, "search_failed")
        followup = renderer.followup_ids(messages + conversation[:-1], replies, generated.ids)
        if len(followup) >= tokens_left():
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        driver.add_observation(followup)
        conversation.extend(replies)
    raise AssertionError("unreachable: the last turn always returns")


def openai_sampling(sampling_params: dict, max_tokens: int) -> dict:
    """slime's SGLang sampling params as /v1/chat/completions fields (SGLang accepts top_k and stop_token_ids)."""
    fields = {"max_tokens": max_tokens}
    for name in ("temperature", "top_p", "top_k", "stop", "stop_token_ids", "skip_special_tokens"):
        if sampling_params.get(name) is not None:
            fields[name] = sampling_params[name]
    return fields


async def run_chat_handler_episode(args, sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    """TOKEN_TRACKING_MODE=router_handler: messages in and out, tokens from the router's messages cache."""
    state = GenerateState(args)
    tokenizer = state.tokenizer
    base_url = router_base_url(args)
    await require_endpoint(base_url, "/retrieve_from_messages_template", "router_handler")
    messages = initial_messages(sample.prompt)
    tools = sample_tools(sample)
    renderer = ChatRenderer(tokenizer, tools, sample.apply_chat_template_kwargs)
    prompt_ids = encode_prompt(tokenizer, renderer.render(messages, add_generation_prompt=True))
    reset_response_fields(sample, prompt_ids, config.return_logprob)
    stats = EpisodeStats(evaluation=evaluation)
    response_budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    max_context = context_limit(args, config, evaluation)
    conversation: list[dict] = []
    used = 0  # response tokens so far: generated plus template follow-ups

    async def finish(status: Sample.Status, reason: str) -> Sample:
        if status != Sample.Status.ABORTED:
            payload = {"messages": messages + conversation, "tools": tools, "add_generation_prompt": False}
            retrieved = await retrieve(base_url, "/retrieve_from_messages_template", payload)
            fill_sample_from_router(
                args,
                sample,
                prompt_ids,
                retrieved,
                tokenizer,
                track_log_probs=config.return_logprob,
                train_observations=config.train_observations,
            )
        return _finish_chat(record_finish(sample, stats, status, reason), conversation)

    def tokens_left() -> int:
        return min(response_budget - used, max_context - len(prompt_ids) - used)

    for turn_index in range(config.max_turns):
        if state.aborted:
            return await finish(Sample.Status.ABORTED, "rollout_aborted")
        if tokens_left() <= 0:
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        request = {"model": "default", "messages": messages + conversation, "tools": tools, "stream": False}
        request.update(openai_sampling(sampling_params, tokens_left()))
        try:
            output = await post_json(router_session(), base_url + "/v1/chat/completions", request, None)
            choice = output["choices"][0]
        except (RequestFailed, KeyError, IndexError, TypeError) as exc:
            raise RouterTrackingError(f"the router's /v1/chat/completions failed: {exc}") from exc
        if choice.get("finish_reason") == "abort":
            return await finish(Sample.Status.ABORTED, "engine_abort")
        stats.turns += 1
        used += int((output.get("usage") or {}).get("completion_tokens", 0))
        turn = parse_openai_message(choice.get("message") or {}, turn_index)
        conversation.append(turn.message())
        if turn.is_final_answer:
            return await finish(Sample.Status.COMPLETED, "answer")
        if choice.get("finish_reason") == "length":
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        if turn_index == config.max_turns - 1:
            return await finish(Sample.Status.TRUNCATED, "max_turns")
        try:
            replies = await tool_results(turn, config, stats, tokenizer)
        except SearchError:
            sample.remove_sample = config.drop_failed_samples
            return await finish(Sample.Status.FAILED, "search_failed")
        # The router adds the template's follow-up; count it the same way to keep the budget.
        followup = len(renderer.followup_ids(messages + conversation[:-1], replies, []))
        if followup >= tokens_left():
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        used += followup
        conversation.extend(replies)
    raise AssertionError("unreachable: the last turn always returns")
