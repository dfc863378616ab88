"""The episode loop every mode shares: generate a turn, read it, run its tool calls, reply, until the episode ends.

This file is the rollout's map: one XML search episode runs in the files named here, read in this order.

  generate_with_search.generate   settings/ resolves the settings, slime_flags.py checks slime's flags against them
  run_episode (below)             one EpisodeState, the protocol and token driver the settings name, the trajectory;
                                  then per turn:
    driver.generate()  -> Turn    tokens/manual.py: the trajectory's ids to SGLang's /generate (tokens/engine.py),
                                  the answer settled into the turn it ends (tokens/engine_rules.py), the sampled ids
                                  (and log probs) appended to the trajectory (tokens/legacy_router.py: the router
                                  modes)
    protocol.read()    -> Action  protocols/xml_tags.py: Search-R1's tags (protocols/chat.py: OpenAI tool calls)
    run_calls()        -> results tools/contract.py: each call run by its tool and counted under its name;
                                  tools/search.py: the search tool, its backends and its text (tools/access.py: pages)
    protocol.reply()   -> Reply   the results as the model is shown them, appended to the trajectory here
  finish (below)                  the status on the sample and the record in sample.metadata["search_r1"]

episode.py holds what they all share: Turn, Action, ToolCall, Reply, the EpisodeState and the record. The protocol,
token driver and tools are picked by the names the settings give them (registry.py says where each built-in lives,
what a protocol and a token driver provide, and holds what extensions register). How an episode ends:

  answer                              COMPLETED  answer
  engine abort, or slime's abort      ABORTED    engine_abort (slime's abort, or a weight update pausing the engines in
                                                 fully-async training) / rollout_aborted (checked before every turn);
                                                 an aborted answer whose tokens already end the turn ends it as the
                                                 engine would have (tokens/engine_rules.py), and the episode goes on
  response or context budget out      TRUNCATED  token_budget (each turn is offered exactly what is left)
  the engine's context length reached TRUNCATED  context_length: SGLang's length rules (tokens/engine_rules.py) leave
                                                 no room for the next turn, or the engine refused one for its length
                                                 (HTTP 400)
  max_turns reached                   TRUNCATED  max_turns; a tool call on the last turn is not run (no turn reads it)
  a tool failing after its retries    FAILED     tool_failed, with remove_sample (its reward measures the outage)
  the engine's answer unusable        FAILED     engine_error (a 4xx, a 5xx after the retries, a null log prob, ids
                                                 and log probs that disagree, ...: the record's engine_error says
                                                 which), likewise; only an engine that cannot be reached at all after
                                                 the retries raises (EngineUnavailable), failing the rollout
  the template refusing a reply       FAILED     template_error (the chat template raised rendering the follow-up:
                                                 the record's template_error says why), likewise

Long horizons (docs/long_horizon.md):
  force_answer=final_turn   as Search-R1: max_turns turns run their tool calls, then one more turn whose calls are not
                            run; it answers (COMPLETED) or ends max_turns
  force_answer=inject       the reply before the last turn (or the first one after which fewer than
                            force_answer_reserve response tokens are left) ends with the protocol's instruction to
                            answer now, outside the loss; the next turn is the last (max_turns, or token_budget when
                            the reserve triggered it)
  split_trajectories        a context that shows an observation shorter than it was shown (a page chunk read, in its
                            short form) starts a new segment; a training episode is returned as a list of samples,
                            one per segment (one rollout_id), each with the episode's reward

With slime's --partial-rollout, an ABORTED episode records where it stood (the turn, and whether that turn was being
generated or its tool calls were to run); slime hands the sample back in a later rollout, and the episode resumes
there: a turn cut mid-generation continues from its last token, calls the abort interrupted run again, and the
budgets count what was already done. slime's fully-async worker hands an aborted sample back the same way. Each
engine call's tokens are recorded with the weight version that sampled them (the Trajectory's `versions`, per
token when SGLang reports spans); max_version_lag masks the ones that lag the newest version the engines have shown
when the episode ends, and again when slime forms the batch (training/advantages.py).
"""

import copy
import logging
from dataclasses import dataclass, replace

from slime.rollout.rm_hub import async_rm
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.episode import (
    ENGINE_VERSIONS,
    Action,
    EpisodeState,
    FinishReason,
    RenderError,
    Reply,
    Turn,
    encode_prompt,
    episode_record,
    resume_point,
    write_episode,
)
from slime_search_r1.registry import PROTOCOLS, TOKEN_DRIVERS, TOOLS, TokenDriver, TurnProtocol
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.view import SearchR1Config
from slime_search_r1.tokens.engine import EngineLengthRefusal, EngineProtocolError
from slime_search_r1.tokens.engine_rules import LEARNED_LIMITS, EngineLimits, stated_limits
from slime_search_r1.tokens.manual import Trajectory, why_not_continued
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError, run_calls

logger = logging.getLogger(__name__)


def enabled_tools(config) -> dict[str, Tool]:
    """The tools the `tools` setting enables, by name, in its order."""
    return {name: TOOLS.get(name) for name in config.tools}


@dataclass(frozen=True)
class Budget:
    """What an episode may still use: response tokens, the context the settings and slime allow, and what the engine
    accepts of one request (tokens/engine_rules.py)."""

    response: int
    context: int
    engine: EngineLimits = EngineLimits()

    def _own(self, driver: TokenDriver, reply: int) -> int:
        return min(self.response - driver.response_length, self.context - driver.context_length) - reply

    def left(self, driver: TokenDriver, reply: int = 0) -> int:
        """New tokens the next turn may ask for once a reply of `reply` tokens is appended (0 or less: none)."""
        engine = self.engine.new_tokens(driver.context_length + reply)
        own = self._own(driver, reply)
        return own if engine is None else min(own, engine)

    def reason(self, driver: TokenDriver, reply: int = 0) -> FinishReason:
        """Why nothing (more) fits: the engine's context length where it binds before the budget's, else the budget."""
        engine = self.engine.new_tokens(driver.context_length + reply)
        if engine is not None and engine < self._own(driver, reply):
            return FinishReason.CONTEXT_LENGTH
        return FinishReason.TOKEN_BUDGET


def episode_budget(args, sampling_params: dict, config: SearchR1Config, evaluation: bool) -> Budget:
    """slime's max_new_tokens is the whole response's budget; the context is capped by config and slime, and each
    request by the engine's length rules (its flags on `args`)."""
    response = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    limits = [config.max_context_length]
    for name in ("eval_max_context_len", "rollout_max_context_len") if evaluation else ("rollout_max_context_len",):
        if getattr(args, name, None):
            limits.append(int(getattr(args, name)))
            break
    return Budget(response=response, context=min(limits), engine=EngineLimits.from_args(args))


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
        enabled_tools(config),
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
    if config.max_version_lag is not None and status != Sample.Status.ABORTED:  # an aborted one has more to come
        lag_mask = driver.trajectory.mask_lagging_spans(config.max_version_lag, ENGINE_VERSIONS.newest)
        state.stats.lag_masked_tokens = lag_mask
    versions = driver.trajectory.versions
    if not config.split_trajectories or evaluation:  # evaluation scores one sample per episode (slime, evaluate.py)
        return finish(state, status, reason, versions)
    if status != Sample.Status.ABORTED:  # an aborted one is not trained: slime generates it again from the start
        state.stats.segments = sum(segment.start < trajectory.response_length for segment in trajectory.segments)
    return await split_for_training(args, finish(state, status, reason, versions), trajectory, state.tokenizer)


async def split_for_training(args, sample: Sample, trajectory: Trajectory, tokenizer) -> list[Sample]:
    """split_trajectories: the episode as a list of samples, one per segment (a list of one when it was never
    split, so that every entry of slime's groups has one shape), each with the reward of the whole episode. That
    reward is computed here, through slime's own reward call (the configured --custom-rm-path) on the episode as it
    happened, because each segment holds only part of it; slime sees it set and does not score the segments."""
    if sample.status == Sample.Status.ABORTED:
        return [sample]
    sample.reward = await async_rm(args, sample)
    segments = trajectory.segment_samples(tokenizer)
    start = 0  # where each segment's part begins in the episode's response (the record's spans count from there)
    for index, segment in enumerate(segments):
        episode_record(segment)["segment"] = {"index": index, "count": len(segments), "start": start}
        start += segment.response_length
    return segments


def finish(state: EpisodeState, status: Sample.Status, reason: FinishReason, versions=()) -> Sample:
    """The episode's end on the sample: its status, and its record in its metadata (where it stood too, when slime
    aborted it in a partial rollout: slime hands the sample back to be resumed; `versions`: the trajectory's weight
    version per engine call)."""
    sample = state.sample
    resumable = status == Sample.Status.ABORTED and bool(getattr(state.args, "partial_rollout", False))
    write_episode(sample, state.record(reason, resumable=resumable, versions=versions))
    sample.status = status
    sample.remove_sample = status == Sample.Status.FAILED
    return sample


async def _turns(
    state: EpisodeState, protocol: TurnProtocol, driver: TokenDriver, budget: Budget
) -> tuple[Sample.Status, FinishReason]:
    """(status, reason) of the episode, the trajectory written as it goes; a resumed episode starts where it stood."""
    config, stats = state.config, state.stats
    final_turn = config.force_answer == "final_turn"
    turns = config.max_turns + 1 if final_turn else config.max_turns  # final_turn: one more, its calls not run
    continuing = state.stage == "turn" and driver.response_length > state.turn_start  # a turn cut by an abort
    while state.turn_index < turns:
        forced = stats.forced_answer is not None and stats.forced_answer["turn"] == state.turn_index
        last_turn = state.turn_index == turns - 1 or forced
        if state.stage == "tool":  # resumed after its turn was read: read it again, run its calls
            turn = driver.written_turn()
            action = protocol.read(turn, state)
        else:
            if not continuing:
                state.begin_turn(driver.response_length)
                if final_turn and state.turn_index == config.max_turns:
                    stats.forced_answer = forced_answer("final_turn", state.turn_index, "max_turns")
            continuing = False
            if state.aborted:
                return Sample.Status.ABORTED, FinishReason.ROLLOUT_ABORTED
            if config.split_trajectories:  # observations read since the last turn: their short forms from now on
                stats.short_form_tokens_saved += driver.trajectory.shorten_read_observations()
            if budget.left(driver) <= 0:
                return Sample.Status.TRUNCATED, budget.reason(driver)
            # A new dict per turn: in evaluation slime shares one sampling_params dict across all samples.
            params = {**protocol.sampling_params, "max_new_tokens": budget.left(driver)}
            if params.get("min_new_tokens"):
                params["min_new_tokens"] = min(params["min_new_tokens"], params["max_new_tokens"])
            spent = budget.reason(driver)  # what a turn that uses up its max_new_tokens reached
            before = driver.response_length
            try:
                turn = await driver.generate(params)
            except EngineLengthRefusal as exc:  # limits the flags did not tell: the refusal states them
                stated = stated_limits(str(exc), driver.context_length)
                if stated is not None:
                    narrower = replace(budget, engine=budget.engine.tighter(LEARNED_LIMITS.learn(stated)))
                    if 0 < narrower.left(driver) < params["max_new_tokens"]:  # the turn fits them: asked again
                        budget = narrower
                        continuing = driver.response_length > state.turn_start  # a resumed turn stays one
                        continue
                stats.length_refusal = str(exc)[:500]
                return Sample.Status.TRUNCATED, FinishReason.CONTEXT_LENGTH
            except EngineProtocolError as exc:
                stats.engine_error = str(exc)[:500]
                return Sample.Status.FAILED, FinishReason.ENGINE_ERROR
            sampled = driver.response_length - before
            stats.generated_tokens += sampled
            if turn.engine_aborted:
                stats.engine_aborts += 1
                stats.aborts_after_turn_end += turn.finish_type != "abort"
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
            if turn.finish_type == "length":  # its max_new_tokens used up, or fewer: the engine lowered them (KV pool)
                lowered = sampled < params["max_new_tokens"]
                return Sample.Status.TRUNCATED, FinishReason.CONTEXT_LENGTH if lowered else spent
            if last_turn:
                if forced and stats.forced_answer["trigger"] == "reserve":
                    return Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET
                return Sample.Status.TRUNCATED, FinishReason.MAX_TURNS
            state.stage = "tool"
        if budget.left(driver, reply=1) <= 0:  # no reply fits with a token after it: its calls would run for nothing
            return Sample.Status.TRUNCATED, budget.reason(driver, reply=1)
        counters = copy.deepcopy(stats.tools)
        try:
            results = await run_calls(action.calls, state.tools, state)
        except ToolAborted:
            stats.tools = counters  # the calls run again when the episode resumes
            return Sample.Status.ABORTED, FinishReason.ROLLOUT_ABORTED
        except ToolError:
            return Sample.Status.FAILED, FinishReason.TOOL_FAILED
        try:
            reply, short_ids = _reply(state, protocol, driver, budget, action, results, turn)
        except RenderError as exc:  # this conversation's, not the rollout's: the other samples go on
            stats.template_error = str(exc)[:500]
            return Sample.Status.FAILED, FinishReason.TEMPLATE_ERROR
        if budget.left(driver, reply=len(reply.ids)) <= 0:
            # The reply plus at least one generated token must fit.
            return Sample.Status.TRUNCATED, budget.reason(driver, reply=len(reply.ids))
        if short_ids is None:
            driver.add_observation(reply.ids)
        else:
            driver.add_observation(reply.ids, short_ids)
        stats.observation_tokens += len(reply.ids)
        stats.truncated_observations += reply.truncated
        if state.conversation is not None:
            state.conversation.extend(reply.messages)
        state.turn_index += 1
        state.stage = "turn"
    return Sample.Status.TRUNCATED, FinishReason.MAX_TURNS  # resumed with fewer max_turns than it had taken


def forced_answer(mode: str, turn: int, trigger: str, tokens: int = 0) -> dict:
    """The record of a forced answer: on which turn, why (max_turns or reserve) and the instruction's tokens."""
    return {"mode": mode, "turn": turn, "trigger": trigger, "tokens": tokens}


def _reply(
    state: EpisodeState,
    protocol: TurnProtocol,
    driver: TokenDriver,
    budget: Budget,
    action: Action,
    results: dict[str, str],
    turn: Turn,
) -> tuple[Reply, list[int] | None]:
    """What the model is shown after `turn`, with the instruction to answer now when force_answer=inject calls for
    it here; and the reply's short form when a result has one (a page chunk: tools/access.py), else None."""
    config, stats = state.config, state.stats
    reply = protocol.reply(action, results, turn, state)
    forcing: dict = {}  # the keyword is passed only when set: a protocol of your own needs it only with inject
    if config.force_answer == "inject" and stats.forced_answer is None:
        next_is_last = state.turn_index + 1 == config.max_turns - 1
        reserve = config.force_answer_reserve
        low = bool(reserve) and budget.left(driver, reply=len(reply.ids)) < reserve
        if next_is_last or low:
            forced = protocol.reply(action, results, turn, state, force_answer=True)
            if budget.left(driver, reply=len(forced.ids)) > 0:  # else the reply alone may still fit
                trigger = "max_turns" if next_is_last else "reserve"
                extra = len(forced.ids) - len(reply.ids)
                stats.forced_answer = forced_answer("inject", state.turn_index + 1, trigger, extra)
                reply, forcing = forced, {"force_answer": True}
    shorter = {call_id: short for call_id, text in results.items() if (short := getattr(text, "short_form", None))}
    if not shorter:
        return reply, None
    return reply, protocol.reply(action, {**results, **shorter}, turn, state, **forcing).ids
