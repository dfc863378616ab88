"""The episode loop every mode shares: generate a turn, read it, reply, until the episode ends.

The loop owns one EpisodeState (state.py) and hands it on. A driver says where a turn's tokens come from
(tokens/); a protocol reads what the model did into an Action and answers it with a Reply (protocols/);
the loop commits each Reply to the trajectory (trajectory.py) and decides how the episode ends:

  answer                          COMPLETED
  engine abort, or slime's abort  ABORTED (checked before every turn)
  response or context budget out  TRUNCATED (each turn is offered exactly what is left)
  max_turns reached               TRUNCATED; a tool call on the last turn is not run (no turn would read it)
  search failing after retries    FAILED, with remove_sample when drop_failed_samples
"""

from dataclasses import dataclass
from typing import Protocol

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.config import SearchR1Config
from slime_search_r1.protocols.actions import Action, Reply
from slime_search_r1.protocols.chat import ChatProtocol
from slime_search_r1.protocols.xml import XmlProtocol
from slime_search_r1.search.dispatch import SearchError
from slime_search_r1.state import EpisodeState
from slime_search_r1.tokens.engine import Turn
from slime_search_r1.tokens.legacy_router import RouterHandlerDriver, RouterRadixDriver
from slime_search_r1.tokens.manual import ManualDriver
from slime_search_r1.tokens.text import encode_prompt
from slime_search_r1.trajectory import Trajectory


class TurnProtocol(Protocol):
    """What the model writes and what it is shown (protocols/xml.py, protocols/chat.py)."""

    prompt_text: str
    sampling_params: dict  # slime's, plus what ends this protocol's turns
    cut_at_stops: tuple[str, ...]  # stop strings after which a turn is cut (for engines that run past them)

    def read(self, turn: Turn, state: EpisodeState) -> Action:
        """What the model did in `turn`."""

    async def reply(self, action: Action, turn: Turn, state: EpisodeState) -> Reply:
        """The environment's answer (raises SearchError when a search fails for good)."""


class TokenDriver(Protocol):
    """Where a turn's tokens come from (tokens/manual.py, tokens/legacy_router.py)."""

    context_length: int
    response_length: int
    trajectory: Trajectory  # what the driver writes the sample's response through

    async def generate(self, sampling_params: dict) -> Turn:
        """One model turn."""

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


async def token_driver(state: EpisodeState, protocol: TurnProtocol) -> TokenDriver:
    """The driver of TOKEN_TRACKING_MODE, over a fresh trajectory of the sample.

    The router modes first check that the router serves them, so a sample is not touched when it cannot."""
    config = state.config
    if config.token_tracking_mode != "manual":
        driver_class = RouterHandlerDriver if config.token_tracking_mode == "router_handler" else RouterRadixDriver
        await driver_class.check_router(state.args, config)
    prompt_ids = encode_prompt(state.tokenizer, protocol.prompt_text)
    trajectory = Trajectory(
        state.args,
        state.sample,
        prompt_ids,
        track_log_probs=config.return_logprob,
        train_observations=config.train_observations,
    )
    if config.token_tracking_mode == "router_handler":
        return RouterHandlerDriver(state, trajectory, messages=protocol.messages, tools=protocol.tools)
    if config.token_tracking_mode == "router_radix":
        return RouterRadixDriver(state, trajectory, prompt_text=protocol.prompt_text)
    return ManualDriver(state, trajectory, cut_at_stops=protocol.cut_at_stops)


async def run_episode(args, sample: Sample, sampling_params: dict, config: SearchR1Config, evaluation: bool):
    """One sample's whole episode; returns the sample with its trajectory, status and metadata."""
    slime_state = GenerateState(args)
    state = EpisodeState(
        args,
        sample,
        config,
        slime_state.tokenizer,
        slime_state,
        evaluation,
        conversation=[] if config.llm_api_mode == "chat" else None,
    )
    protocol: TurnProtocol = (ChatProtocol if config.llm_api_mode == "chat" else XmlProtocol)(state, sampling_params)
    driver = await token_driver(state, protocol)
    status, reason = await _turns(state, protocol, driver, episode_budget(args, sampling_params, config, evaluation))
    await driver.finish(status)
    driver.trajectory.decode_response(state.tokenizer)
    return state.record(status, reason)


async def _turns(state: EpisodeState, protocol: TurnProtocol, driver: TokenDriver, budget: Budget):
    """(status, reason) of the episode, the trajectory written as it goes."""
    config, stats = state.config, state.stats
    for turn_index in range(config.max_turns):
        state.turn_index = turn_index
        if state.aborted:
            return Sample.Status.ABORTED, "rollout_aborted"
        if budget.left(driver) <= 0:
            return Sample.Status.TRUNCATED, "token_budget"
        # A new dict per turn: in evaluation slime shares one sampling_params dict across all samples.
        params = {**protocol.sampling_params, "max_new_tokens": budget.left(driver)}
        if params.get("min_new_tokens"):
            params["min_new_tokens"] = min(params["min_new_tokens"], params["max_new_tokens"])
        turn = await driver.generate(params)
        if turn.finish_type == "abort":
            return Sample.Status.ABORTED, "engine_abort"
        stats.turns += 1
        action = protocol.read(turn, state)
        if action.message is not None:
            state.conversation.append(action.message)
        if action.invalid and turn.finish_type != "length":  # a turn cut short is the budget's doing
            stats.invalid_actions += 1
        if action.final:
            return Sample.Status.COMPLETED, "answer"
        if turn.finish_type == "length":
            return Sample.Status.TRUNCATED, "token_budget"
        if turn_index == config.max_turns - 1:
            return Sample.Status.TRUNCATED, "max_turns"
        try:
            reply = await protocol.reply(action, turn, state)
        except SearchError:
            if state.aborted:  # slime aborted while the search waited or retried
                return Sample.Status.ABORTED, "rollout_aborted"
            return Sample.Status.FAILED, "search_failed"
        if len(reply.ids) >= budget.left(driver):
            # The reply plus at least one generated token must fit.
            return Sample.Status.TRUNCATED, "token_budget"
        driver.add_observation(reply.ids)
        stats.observation_tokens += len(reply.ids)
        stats.truncated_observations += reply.truncated
        if state.conversation is not None:
            state.conversation.extend(reply.messages)
    raise AssertionError("unreachable: the last turn always returns")
