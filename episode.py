"""The multi-turn loop every mode shares: generate a turn, decide, answer the model, until done.

A driver says where tokens come from (token_drivers.py); a protocol says what the model writes and
what it is shown back (XML tags in xml_rollout.py, tool calls in chat_rollout.py). Status rules:
  answer                          COMPLETED
  engine abort, or slime's abort  ABORTED (checked before every turn)
  response or context budget out  TRUNCATED (each turn is offered exactly what is left)
  max_turns reached               TRUNCATED; a search on the last turn is not run (no turn would read it)
  search failing after retries    FAILED, with remove_sample when drop_failed_samples
"""

import logging
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from observations import encode_text
from search_backend import SearchAborted, SearchError, search
from search_r1_config import SearchR1Config
from slime.utils.types import Sample
from token_drivers import GeneratedTurn
from trajectory import EpisodeStats

logger = logging.getLogger(__name__)


class TurnProtocol(Protocol):
    sampling_params: dict
    aborted: object  # a callable, set by run_episode: True once slime aborts the rollout

    def read(self, turn: GeneratedTurn, turn_index: int) -> bool:
        """Take in the model's turn; True when it is the final answer."""

    async def respond(self, turn: GeneratedTurn) -> list[int]:
        """Ids of the environment's reply (raises SearchError when the search fails for good)."""

    def accept(self) -> None:
        """The reply was appended to the trajectory."""

    def on_finish(self, sample: Sample) -> None:
        """Last words on the sample's metadata."""


@dataclass(frozen=True)
class Budget:
    response: int
    context: int

    def left(self, driver) -> int:
        return min(self.response - driver.response_length, self.context - driver.context_length)


def episode_budget(args, sampling_params: dict, config: SearchR1Config, evaluation: bool) -> Budget:
    """slime's max_new_tokens is the whole response's budget; the context is capped by config and slime."""
    response = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    limits = [config.max_context_length]
    for name in ("eval_max_context_len", "rollout_max_context_len") if evaluation else ("rollout_max_context_len",):
        if getattr(args, name, None):
            limits.append(int(getattr(args, name)))
            break
    return Budget(response=response, context=min(limits))


@lru_cache(maxsize=4096)
def _prompt_ids(tokenizer, prompt: str) -> tuple[int, ...]:
    # GRPO rolls out every prompt n_samples_per_prompt times: tokenize it once.
    return tuple(encode_text(tokenizer, prompt, special_tokens_as_text=False))


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Prompt ids as slime computes them: the prompt string tokenized with its special tokens."""
    return list(_prompt_ids(tokenizer, prompt))


async def timed_search(config: SearchR1Config, query: str, stats: EpisodeStats, aborted=None) -> list[str]:
    """search() with the per-sample counters kept; SearchError (after retries) is logged and re-raised."""
    started = time.perf_counter()
    try:
        contents = await search(config, query, aborted)
    except SearchAborted:  # it never ran: no latency of its own
        raise
    except SearchError as exc:
        stats.search_latencies.append(time.perf_counter() - started)  # retries included: what the sample waited
        stats.search_failures += 1
        stats.search_error = str(exc)[:500]
        logger.warning("search failed for good, sample marked FAILED: %s", exc)
        raise
    finally:
        stats.search_seconds += time.perf_counter() - started
    stats.search_latencies.append(time.perf_counter() - started)
    stats.searches += 1
    return contents


async def run_episode(state, driver, protocol: TurnProtocol, config: SearchR1Config, budget: Budget, evaluation):
    stats = driver.stats
    stats.evaluation = evaluation
    protocol.aborted = lambda: state.aborted

    async def finish(status: Sample.Status, reason: str) -> Sample:
        finished = await driver.finish(status, reason)
        # after the driver: a router driver refills the sample's fields from its cache
        finished.remove_sample = status == Sample.Status.FAILED and config.drop_failed_samples
        protocol.on_finish(finished)
        return finished

    for turn_index in range(config.max_turns):
        if state.aborted:
            return await finish(Sample.Status.ABORTED, "rollout_aborted")
        if budget.left(driver) <= 0:
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        # A new dict per turn: in evaluation slime shares one sampling_params dict across all samples.
        params = {**protocol.sampling_params, "max_new_tokens": budget.left(driver)}
        if params.get("min_new_tokens"):
            params["min_new_tokens"] = min(params["min_new_tokens"], params["max_new_tokens"])
        turn = await driver.generate(params)
        if turn.finish_type == "abort":
            return await finish(Sample.Status.ABORTED, "engine_abort")
        stats.turns += 1
        if protocol.read(turn, turn_index):
            return await finish(Sample.Status.COMPLETED, "answer")
        if turn.finish_type == "length":
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        if turn_index == config.max_turns - 1:
            return await finish(Sample.Status.TRUNCATED, "max_turns")
        try:
            reply = await protocol.respond(turn)
        except SearchError:
            if state.aborted:  # slime aborted while the search waited or retried
                return await finish(Sample.Status.ABORTED, "rollout_aborted")
            return await finish(Sample.Status.FAILED, "search_failed")
        if len(reply) >= budget.left(driver):
            # The reply plus at least one generated token must fit.
            return await finish(Sample.Status.TRUNCATED, "token_budget")
        driver.add_observation(reply)
        stats.observation_tokens += len(reply)
        protocol.accept()
    raise AssertionError("unreachable: the last turn always returns")
