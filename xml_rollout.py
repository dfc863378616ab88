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
from sglang_engine import EngineTurn, engine_url, generate_turn, keep_first_tokens, routing_headers
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from trajectory import Trajectory
from xml_actions import STOP_STRINGS, parse_action, with_stop_strings

logger = logging.getLogger(__name__)


@lru_cache(maxsize=4096)
def _prompt_ids(tokenizer, prompt: str) -> tuple[int, ...]:
    # GRPO rolls out every prompt n_samples_per_prompt times: tokenize it once.
    return tuple(encode_text(tokenizer, prompt, special_tokens_as_text=False))


def encode_prompt(tokenizer, sample: Sample) -> list[int]:
    """Prompt ids as slime computes them: the chat-templated string (or messages rendered here)."""
    prompt = sample.prompt
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=True, **(sample.apply_chat_template_kwargs or {})
        )
    return list(_prompt_ids(tokenizer, prompt))


def context_limit(args, config: SearchR1Config, evaluation: bool) -> int:
    limits = [config.max_context_length]
    for name in ("eval_max_context_len", "rollout_max_context_len") if evaluation else ("rollout_max_context_len",):
        value = getattr(args, name, None)
        if value:
            limits.append(int(value))
            break
    return min(limits)


def cut_after_first_stop(turn: EngineTurn, tokenizer, text: str) -> tuple[EngineTurn, str]:
    """Drop tokens sampled after the first </search> or </answer> (an engine that ran past its stop strings).

    Keeping a prefix of what was sampled keeps every kept token and log prob exact.
    """
    hits = [(pos, stop) for stop in STOP_STRINGS if (pos := text.find(stop)) >= 0]
    if not hits or len(turn.ids) <= 1:
        return turn, text
    pos, stop = min(hits)

    def contains_stop(count: int) -> bool:
        return tokenizer.decode(turn.ids[:count], skip_special_tokens=False).find(stop) == pos

    if not contains_stop(len(turn.ids) - 1):  # the usual case: the stop string ends in the last token
        return turn, text
    low, high = 1, len(turn.ids) - 1  # smallest count whose decoded prefix holds the stop string
    while low < high:
        mid = (low + high) // 2
        if contains_stop(mid):
            high = mid
        else:
            low = mid + 1
    kept = keep_first_tokens(turn, low)
    return kept, tokenizer.decode(kept.ids, skip_special_tokens=False)


async def run_xml_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    state = GenerateState(args)
    tokenizer = state.tokenizer
    url = engine_url(args)
    trajectory = Trajectory(
        args,
        sample,
        encode_prompt(tokenizer, sample),
        track_log_probs=config.return_logprob,
        train_observations=config.train_observations,
    )
    stats = trajectory.stats
    stats.evaluation = evaluation
    response_budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    max_context = context_limit(args, config, evaluation)
    use_slime_post = config.engine_transport == "slime" or bool(getattr(args, "use_distributed_post", False))
    headers = routing_headers(args, sample)
    # A new dict per turn: in evaluation slime shares one sampling_params dict across all samples.
    base_params = {**sampling_params, "stop": with_stop_strings(sampling_params.get("stop"))}

    def tokens_left() -> int:
        return min(response_budget - trajectory.response_length, max_context - trajectory.context_length)

    for turn_index in range(config.max_turns):
        if state.aborted:
            return trajectory.finish(Sample.Status.ABORTED, "rollout_aborted", tokenizer)
        if tokens_left() <= 0:
            return trajectory.finish(Sample.Status.TRUNCATED, "token_budget", tokenizer)

        turn = await generate_turn(
            url,
            list(trajectory.sample.tokens),
            {**base_params, "max_new_tokens": tokens_left()},
            config.return_logprob,
            use_slime_post=use_slime_post,
            headers=headers,
        )
        if turn.finish_type == "abort":
            return trajectory.finish(Sample.Status.ABORTED, "engine_abort", tokenizer)
        stats.turns += 1
        text = tokenizer.decode(turn.ids, skip_special_tokens=False)
        turn, text = cut_after_first_stop(turn, tokenizer, text)
        trajectory.add_generated(turn.ids, turn.log_probs, turn.meta_info)
        action = parse_action(text)

        if action.kind == "answer":
            return trajectory.finish(Sample.Status.COMPLETED, "answer", tokenizer)
        if turn.finish_type == "length":
            return trajectory.finish(Sample.Status.TRUNCATED, "token_budget", tokenizer)
        if turn_index == config.max_turns - 1:
            # No turn is left to read a search result or a retry hint, so neither is produced.
            return trajectory.finish(Sample.Status.TRUNCATED, "max_turns", tokenizer)

        if action.kind == "search":
            started = time.perf_counter()
            try:
                contents = await search(config, action.content)
            except SearchError as exc:
                stats.search_failures += 1
                stats.search_error = str(exc)[:500]
                logger.warning("search failed for good, sample marked FAILED: %s", exc)
                sample.remove_sample = config.drop_failed_samples
                return trajectory.finish(Sample.Status.FAILED, "search_failed", tokenizer)
            finally:
                stats.search_seconds += time.perf_counter() - started
            stats.searches += 1
            observation, truncated = information_ids(tokenizer, contents, config.max_obs_tokens)
            stats.truncated_observations += truncated
        else:
            observation = invalid_action_ids(tokenizer)

        if len(observation) >= tokens_left():
            # The observation plus at least one generated token must fit in the budget.
            return trajectory.finish(Sample.Status.TRUNCATED, "token_budget", tokenizer)
        trajectory.add_observation(observation)

    raise AssertionError("unreachable: the last turn always returns")
