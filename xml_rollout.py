"""Search-R1's XML-tag rollout (LLM_API_MODE=generate), token in and token out.

Each turn sends the exact id list being trained (`sample.tokens`) to SGLang and appends the ids and
log probs it sampled; observations are tokenized on their own and appended with loss mask 0.
Nothing is ever re-tokenized, so the engine's context is always a prefix of `sample.tokens`.
"""

import logging
import time
from functools import lru_cache

from observations import encode_text, information_ids, invalid_action_ids
from search_backend import SearchError, search
from search_r1_config import SearchR1Config
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from token_drivers import ExactDriver, RadixDriver
from xml_actions import STOP_STRINGS, parse_action, with_stop_strings

logger = logging.getLogger(__name__)


@lru_cache(maxsize=4096)
def _prompt_ids(tokenizer, prompt: str) -> tuple[int, ...]:
    # GRPO rolls out every prompt n_samples_per_prompt times: tokenize it once.
    return tuple(encode_text(tokenizer, prompt, special_tokens_as_text=False))


def prompt_string(tokenizer, sample: Sample) -> str:
    """The prompt as slime's --apply-chat-template leaves it, rendering messages here if it did not."""
    if isinstance(sample.prompt, str):
        return sample.prompt
    return tokenizer.apply_chat_template(
        list(sample.prompt), tokenize=False, add_generation_prompt=True, **(sample.apply_chat_template_kwargs or {})
    )


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Prompt ids as slime computes them: the prompt string tokenized with its special tokens."""
    return list(_prompt_ids(tokenizer, prompt))


async def timed_search(config: SearchR1Config, query: str, stats) -> list[str]:
    """search() with the per-sample counters kept; SearchError (after retries) is logged and re-raised."""
    started = time.perf_counter()
    try:
        contents = await search(config, query)
    except SearchError as exc:
        stats.search_failures += 1
        stats.search_error = str(exc)[:500]
        logger.warning("search failed for good, sample marked FAILED: %s", exc)
        raise
    finally:
        stats.search_seconds += time.perf_counter() - started
    stats.searches += 1
    return contents


def context_limit(args, config: SearchR1Config, evaluation: bool) -> int:
    limits = [config.max_context_length]
    for name in ("eval_max_context_len", "rollout_max_context_len") if evaluation else ("rollout_max_context_len",):
        value = getattr(args, name, None)
        if value:
            limits.append(int(value))
            break
    return min(limits)


def make_driver(args, sample, tokenizer, config: SearchR1Config, prompt_ids: list[int], prompt_text: str):
    if config.token_tracking_mode == "router_radix":
        return RadixDriver(args, sample, tokenizer, prompt_ids, config, prompt_text=prompt_text)
    return ExactDriver(args, sample, tokenizer, prompt_ids, config, cut_at_stops=STOP_STRINGS)


async def run_xml_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    state = GenerateState(args)
    tokenizer = state.tokenizer
    prompt_text = prompt_string(tokenizer, sample)
    driver = make_driver(args, sample, tokenizer, config, encode_prompt(tokenizer, prompt_text), prompt_text)
    stats = driver.stats
    stats.evaluation = evaluation
    response_budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    max_context = context_limit(args, config, evaluation)
    # A new dict per turn: in evaluation slime shares one sampling_params dict across all samples.
    base_params = {**sampling_params, "stop": with_stop_strings(sampling_params.get("stop"))}

    def tokens_left() -> int:
        return min(response_budget - driver.response_length, max_context - driver.context_length)

    for turn_index in range(config.max_turns):
        if state.aborted:
            return await driver.finish(Sample.Status.ABORTED, "rollout_aborted")
        if tokens_left() <= 0:
            return await driver.finish(Sample.Status.TRUNCATED, "token_budget")

        turn = await driver.generate({**base_params, "max_new_tokens": tokens_left()})
        if turn.finish_type == "abort":
            return await driver.finish(Sample.Status.ABORTED, "engine_abort")
        stats.turns += 1
        action = parse_action(turn.text)

        if action.kind == "answer":
            return await driver.finish(Sample.Status.COMPLETED, "answer")
        if turn.finish_type == "length":
            return await driver.finish(Sample.Status.TRUNCATED, "token_budget")
        if turn_index == config.max_turns - 1:
            # No turn is left to read a search result or a retry hint, so neither is produced.
            return await driver.finish(Sample.Status.TRUNCATED, "max_turns")

        if action.kind == "search":
            try:
                contents = await timed_search(config, action.content, stats)
            except SearchError:
                sample.remove_sample = config.drop_failed_samples
                return await driver.finish(Sample.Status.FAILED, "search_failed")
            observation, truncated = information_ids(tokenizer, contents, config.max_obs_tokens)
            stats.truncated_observations += truncated
        else:
            observation = invalid_action_ids(tokenizer)

        if len(observation) >= tokens_left():
            # The observation plus at least one generated token must fit in the budget.
            return await driver.finish(Sample.Status.TRUNCATED, "token_budget")
        driver.add_observation(observation)

    raise AssertionError("unreachable: the last turn always returns")
