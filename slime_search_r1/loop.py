"""The episode loop every mode shares: generate a turn, read it, run its tool calls, reply, until the episode ends.

The loop owns one EpisodeState (state.py) and hands it on. The token driver TOKEN_TRACKING_MODE names says where a
turn's tokens come from (tokens/); the protocol LLM_API_MODE names reads what the model did into an Action and
turns the results of its tool calls into a Reply (protocols/); the loop runs the calls (tools/calls.py), commits
each Reply to the trajectory (trajectory.py) and decides how the episode ends:

  answer                              COMPLETED  answer
  engine abort, or slime's abort      ABORTED    engine_abort / rollout_aborted (checked before every turn)
  response or context budget out      TRUNCATED  token_budget (each turn is offered exactly what is left)
  max_turns reached                   TRUNCATED  max_turns; a tool call on the last turn is not run (no turn reads it)
  a tool failing after its retries    FAILED     tool_failed, with remove_sample when drop_failed_samples

With slime's --partial-rollout, an ABORTED episode records where it stood (the turn, and whether that turn was being
generated or its tool calls were to run); slime hands the sample back in a later rollout, and the episode resumes
there: a turn cut mid-generation continues from its last token, calls the abort interrupted run again, and the
budgets count what was already done.
"""

import copy
import logging

from dataclasses import dataclass
from typing import Protocol

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.record import FinishReason, episode_record, resume_point
from slime_search_r1.registry import PROTOCOLS, TOKEN_DRIVERS
from slime_search_r1.settings import ConfigError, SearchR1Config
from slime_search_r1.state import EpisodeState
from slime_search_r1.tokens.text import encode_prompt
from slime_search_r1.tools.calls import run_calls
from slime_search_r1.tools.contract import ToolAborted, ToolError
from slime_search_r1.trajectory import Trajectory, why_not_continued
from slime_search_r1.turns import Action, Reply, Turn

logger = logging.getLogger(__name__)


class TurnProtocol(Protocol):
    """What the model writes and what it is shown (registry.PROTOCOLS: protocols/xml_tags.py, protocols/chat.py)."""

    records_conversation: bool  # the episode keeps its messages (state.conversation) for the reward
    prompt_text: str  # the prompt the episode conditions on
    messages: list[dict] | None  # the prompt as chat messages (None when the protocol has none)
    tool_schemas: list[dict] | None  # the tools the chat template shows (None likewise)
    sampling_params: dict  # slime's, plus what ends this protocol's turns
    cut_at_stops: tuple[str, ...]  # stop strings after which a turn is cut (for engines that run past them)

    def __init__(self, state: EpisodeState, sampling_params: dict): ...

    def read(self, turn: Turn, state: EpisodeState) -> Action:
        """What the model did in `turn`."""

    def reply(self, action: Action, results: dict[str, str], turn: Turn, state: EpisodeState) -> Reply:
        """What the model is shown next: the results of its calls (by call id), or what was wrong."""


class TokenDriver(Protocol):
    """Where a turn's tokens come from (registry.TOKEN_DRIVERS: tokens/manual.py, tokens/legacy_router.py)."""

    context_length: int
    response_length: int
    trajectory: Trajectory  # what the driver writes the sample's response through
    resumable: bool  # a partial rollout's aborted episode can continue from its trajectory (written_turn, below)

    @classmethod
    async def prepare(cls, state: EpisodeState) -> None:
        """Checks that can fail before the sample is touched (the router's endpoints)."""

    def __init__(self, state: EpisodeState, trajectory: Trajectory, protocol: TurnProtocol): ...

    async def generate(self, sampling_params: dict) -> Turn:
        """The turn under way (after what it sampled before an abort, if anything)."""

    def written_turn(self) -> Turn:
        """The turn under way as the trajectory holds it (a resumed episode reads it again)."""

    def add_observation(self, ids: list[int]) -> None:
        """The environment's reply follows the turn."""

    async def finish(self, status: Sample.Status) -> None:
        """The trajectory is complete (a router driver fetches it now)."""


@dataclass(frozen=True)
class Budget:
    response: int
    context: int

    def left(self, driver: TokenDriver) -> int:
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


def resumable_record(args, sample: Sample, prompt_ids: list[int], track_log_probs: bool) -> dict | None:
    """The record to resume from: a partial rollout's sample that slime aborted with a response and handed back,
    its fields still lined up; None means the episode starts from clean fields."""
    if not getattr(args, "partial_rollout", False) or sample.status != Sample.Status.ABORTED:
        return None
    record = episode_record(sample)
    if record is None or resume_point(record) is None or sample.response_length == 0:
        return None
    problem = why_not_continued(sample, prompt_ids, track_log_probs)
    if problem is not None:
        logger.warning("an aborted sample starts over instead of resuming: %s", problem)
        return None
    return record


async def run_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    """One sample's whole episode; returns the sample with its trajectory, status and metadata."""
    slime_state = GenerateState(args)
    protocol_class = PROTOCOLS.get(config.llm_api_mode)
    state = EpisodeState(
        args,
        sample,
        config,
        slime_state.tokenizer,
        slime_state,
        evaluation,
        conversation=[] if protocol_class.records_conversation else None,
    )
    protocol: TurnProtocol = protocol_class(state, sampling_params)
    driver_class = TOKEN_DRIVERS.get(config.token_tracking_mode)
    if getattr(args, "partial_rollout", False) and not getattr(driver_class, "resumable", False):
        raise ConfigError(
            f"--partial-rollout resumes aborted episodes from the trajectory they wrote, which "
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} cannot continue; use TOKEN_TRACKING_MODE=manual"
        )
    await driver_class.prepare(state)
    prompt_ids = encode_prompt(state.tokenizer, protocol.prompt_text)
    record = resumable_record(args, sample, prompt_ids, config.return_logprob)
    trajectory = Trajectory(
        args,
        sample,
        prompt_ids,
        track_log_probs=config.return_logprob,
        train_observations=config.train_observations,
        continued=record is not None,
    )
    if record is not None:
        state.resume(record, sample.response_length)
    driver: TokenDriver = driver_class(state, trajectory, protocol)
    status, reason = await _turns(state, protocol, driver, episode_budget(args, sampling_params, config, evaluation))
    await driver.finish(status)
    driver.trajectory.decode_response(state.tokenizer)
    return state.finish(status, reason)


async def _turns(
    state: EpisodeState, protocol: TurnProtocol, driver: TokenDriver, budget: Budget
) -> tuple[Sample.Status, FinishReason]:
    """(status, reason) of the episode, the trajectory written as it goes; a resumed episode starts where it stood."""
    config, stats = state.config, state.stats
    continuing = state.stage == "turn" and driver.response_length > state.turn_start  # a turn cut by an abort
    while state.turn_index < config.max_turns:
        last_turn = state.turn_index == config.max_turns - 1
        if state.stage == "tool":  # resumed after its turn was read: read it again, run its calls
            turn = driver.written_turn()
            action = protocol.read(turn, state)
        else:
            if not continuing:
                state.begin_turn(driver.response_length)
            continuing = False
            if state.aborted:
                return Sample.Status.ABORTED, FinishReason.ROLLOUT_ABORTED
            if budget.left(driver) <= 0:
                return Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET
            # A new dict per turn: in evaluation slime shares one sampling_params dict across all samples.
            params = {**protocol.sampling_params, "max_new_tokens": budget.left(driver)}
            if params.get("min_new_tokens"):
                params["min_new_tokens"] = min(params["min_new_tokens"], params["max_new_tokens"])
            before = driver.response_length
            turn = await driver.generate(params)
            stats.generated_tokens += driver.response_length - before
            if turn.finish_type == "abort":
                return Sample.Status.ABORTED, FinishReason.ENGINE_ABORT
            stats.turns += 1
            action = protocol.read(turn, state)
            if action.message is not None:
                state.conversation.append(action.message)
            if action.invalid and turn.finish_type != "length":  # a turn cut short is the budget's doing
                stats.invalid_actions += 1
            if action.final:
                return Sample.Status.COMPLETED, FinishReason.ANSWER
            if turn.finish_type == "length":
                return Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET
            if last_turn:
                return Sample.Status.TRUNCATED, FinishReason.MAX_TURNS
            state.stage = "tool"
        counters = copy.deepcopy(stats.tools)
        try:
            results = await run_calls(action.calls, state.tools, state)
        except ToolAborted:
            stats.tools = counters  # the calls run again when the episode resumes
            return Sample.Status.ABORTED, FinishReason.ROLLOUT_ABORTED
        except ToolError:
            return Sample.Status.FAILED, FinishReason.TOOL_FAILED
        reply = protocol.reply(action, results, turn, state)
        if len(reply.ids) >= budget.left(driver):
            # The reply plus at least one generated token must fit.
            return Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET
        driver.add_observation(reply.ids)
        stats.observation_tokens += len(reply.ids)
        stats.truncated_observations += reply.truncated
        if state.conversation is not None:
            state.conversation.extend(reply.messages)
        state.turn_index += 1
        state.stage = "turn"
    return Sample.Status.TRUNCATED, FinishReason.MAX_TURNS  # resumed with fewer max_turns than it had taken
