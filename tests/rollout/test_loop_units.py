"""The episode loop (slime_search_r1/loop.py) driven directly: a scripted protocol, token driver and tool stand in
for the real ones, so each rule of the loop's table (how an episode ends, what each turn is offered, what the record
counts, where a resumed episode stands) is pinned to exact values in-process, without an engine, a server or a
tokenizer. The end-to-end files (test_status_table.py, test_long_horizon.py, test_partial_rollout.py) prove the same
rules through the real protocols and drivers."""

import asyncio
import copy
from argparse import Namespace
from types import SimpleNamespace

import pytest

from slime.utils.types import Sample
from slime_search_r1 import loop
from slime_search_r1.episode import (
    ENGINE_VERSIONS,
    Action,
    EpisodeState,
    FinishReason,
    Reply,
    ToolCall,
    ToolStats,
    Turn,
    episode_record,
    write_episode,
)
from slime_search_r1.registry import PROTOCOLS, TOKEN_DRIVERS, TOOLS
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.tokens.engine import EngineProtocolError
from slime_search_r1.tools.access import ChunkResult
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError

TOOL = "echo"
ABSENT = object()  # an argument the loop did not pass


async def echo(arguments: dict, state) -> str:
    return arguments["text"]


def make_tool(run=echo, name: str = TOOL) -> Tool:
    return Tool(
        name=name,
        description="",
        parameters={},
        read_arguments=dict,
        run=run,
        usage="",
        xml_argument="text",
        xml_usage="",
        observation_budget=lambda config: 100,
    )


def call(text: str, call_id: str = "c0", name: str = TOOL) -> ToolCall:
    return ToolCall(call_id, name, {"text": text}, parsed={"text": text})


# What the scripted model writes: each turn's text names the Action the protocol reads from it.
SEARCH = "search"
ANSWER = "answer"
JUNK = "junk"


def action_of(text: str, tool: str = TOOL) -> Action:
    if text == ANSWER:
        return Action(final=True, message={"role": "assistant", "content": ANSWER})
    if text == JUNK:
        return Action(invalid=True, message={"role": "assistant", "content": JUNK})
    if text.startswith(SEARCH):  # "search", or "search:a,b": one call per name after the colon
        texts = text.partition(":")[2].split(",") if ":" in text else ["result"]
        calls = [call(result, f"c{i}", tool) for i, result in enumerate(texts)]
        return Action(calls=calls, message={"role": "assistant", "content": text})
    raise AssertionError(text)


class ScriptedProtocol:
    """Reads a turn by its text; replies with `reply_length` ids per result (and `force_extra` more when told to
    answer now), counting `truncated` cut results per reply."""

    records_conversation = True
    prompt_text = "the prompt"

    def __init__(self, state, sampling_params):
        self.state = state
        self.sampling_params = {**sampling_params, "stop": ["</search>"]}
        self.reply_length = 2
        self.force_extra = 3
        self.truncated = 0
        self.reads: list[tuple] = []
        self.replies: list[tuple] = []

    def read(self, turn, state):
        self.reads.append((turn, state))
        return action_of(turn.text, next(iter(state.tools), TOOL))

    def reply(self, action, results, turn, state, force_answer=ABSENT):
        # every reply is about the action read from this turn, in this episode
        assert isinstance(action, Action) and isinstance(turn, Turn) and state is self.state
        self.replies.append((dict(results), turn, state, force_answer))
        ids = [9] * (self.reply_length * max(len(results), 1))
        for text in results.values():
            ids += [8] * (len(text) - 1)  # a longer text takes more ids (a short form fewer)
        if force_answer is True:
            ids += [5] * self.force_extra
        messages = [{"role": "tool", "content": text} for text in results.values()]
        return Reply(ids=ids, messages=messages, truncated=self.truncated)


class FakeTrajectory:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.saved_per_turn = 0
        self.segments: list = []
        self.response_length = 0
        self.versions = [(0, 1, "3")]
        self.lag_masked = 0
        self.lag_calls: list = []
        self.decoded_with: list = []
        self.segment_samples_of = None

    def shorten_read_observations(self) -> int:
        return self.saved_per_turn

    def decode_response(self, tokenizer) -> None:
        self.decoded_with.append(tokenizer)

    def mask_lagging_spans(self, lag, reference=None) -> int:
        self.lag_calls.append((lag, reference))
        return self.lag_masked

    def segment_samples(self, tokenizer):
        return self.segment_samples_of(tokenizer)


class ScriptedDriver:
    """Each generate() takes the next scripted turn: (text, number of ids, finish_type), or with a fourth item
    whether the engine said abort (an abort whose tokens had already ended the turn); finish_type "abort" implies it;
    an exception instead is raised."""

    resumable = True
    prepared: list = []

    def __init__(self, state, trajectory, protocol, script=(), context_length=10, response_length=0):
        self.state, self.trajectory, self.protocol = state, trajectory, protocol
        self.script = list(script)
        self.context_length = context_length
        self.response_length = response_length
        self.params: list[dict] = []
        self.observations: list[tuple] = []
        self.finished: list = []
        self.written = None

    @classmethod
    async def prepare(cls, state) -> None:
        cls.prepared.append(state)

    async def generate(self, sampling_params: dict) -> Turn:
        self.params.append(sampling_params)
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        text, length, finish_type, *engine_aborted = step
        self.response_length += length
        self.context_length += length
        self.trajectory.response_length = self.response_length
        aborted = engine_aborted[0] if engine_aborted else finish_type == "abort"
        self.written = Turn(ids=[1] * length, finish_type=finish_type, text=text, engine_aborted=aborted)
        return self.written

    def written_turn(self) -> Turn:
        return self.written

    def add_observation(self, ids, short_ids=ABSENT) -> None:
        self.observations.append((list(ids), short_ids))
        self.response_length += len(ids)
        self.context_length += len(ids)
        self.trajectory.response_length = self.response_length

    async def finish(self, status) -> None:
        self.finished.append(status)


def config_of(**overrides) -> SimpleNamespace:
    values = dict(
        max_turns=4,
        force_answer="off",
        force_answer_reserve=0,
        split_trajectories=False,
        llm_api_mode="generate",
        token_tracking_mode="manual",
        tools=[TOOL],
        return_logprob=False,
        train_observations=False,
        max_version_lag=None,
        max_context_length=1000,
    )
    return SimpleNamespace(**{**values, **overrides})


def make_state(config=None, *, args=None, tools=None, conversation=True, aborted=False, sample=None) -> EpisodeState:
    return EpisodeState(
        args or Namespace(partial_rollout=False),
        sample or Sample(prompt="p"),
        config or config_of(),
        None,
        SimpleNamespace(aborted=aborted),
        False,
        {TOOL: make_tool()} if tools is None else tools,
        conversation=[] if conversation else None,
    )


def episode(script, config=None, *, budget=(100, 1000), state=None, **driver):
    """(state, protocol, driver, budget) for a scripted episode; `budget`: (response, context)."""
    state = state or make_state(config)
    protocol = ScriptedProtocol(state, {"temperature": 1.0})
    trajectory = FakeTrajectory()
    return state, protocol, ScriptedDriver(state, trajectory, protocol, script, **driver), loop.Budget(*budget)


async def turns(state, protocol, driver, budget):
    return await loop._turns(state, protocol, driver, budget)


# ---- how an episode ends ----------------------------------------------------------------------------------------


async def test_an_answer_after_a_search_completes_with_exact_counters():
    state, protocol, driver, budget = episode([(SEARCH, 4, "stop"), (ANSWER, 3, "stop")])
    state.stats.turns, state.stats.generated_tokens, state.stats.observation_tokens = 10, 100, 50
    assert await turns(state, protocol, driver, budget) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    assert state.stats.turns == 12
    assert state.stats.generated_tokens == 107
    assert state.stats.observation_tokens == 50 + 2 + 5  # the reply: 2 ids for the result and 5 for its text
    assert state.stats.invalid_actions == 0
    assert state.stats.engine_aborts == 0
    assert state.stats.tools == {TOOL: ToolStats(calls=1, failures=0, seconds=state.stats.tools[TOOL].seconds)}
    assert state.turn_index == 1 and state.stage == "turn" and state.turn_start == 4 + 7
    assert driver.observations == [([9, 9] + [8] * 5, ABSENT)]  # no short form: the ids alone
    assert state.conversation == [
        {"role": "assistant", "content": SEARCH},
        {"role": "tool", "content": "result"},
        {"role": "assistant", "content": ANSWER},
    ]
    read_turn, read_state = protocol.reads[0]
    assert read_turn.text == SEARCH and read_state is state
    results, reply_turn, reply_state, force = protocol.replies[0]
    assert results == {"c0": "result"} and reply_turn is read_turn and reply_state is state and force is ABSENT


async def test_each_turn_is_offered_exactly_the_budget_left():
    state, protocol, driver, budget = episode(
        [(SEARCH, 4, "stop"), (ANSWER, 3, "stop")], budget=(50, 200), context_length=170
    )
    await turns(state, protocol, driver, budget)
    # turn 0: min(50 - 0, 200 - 170) = 30; turn 1: after 4 generated and 7 shown, min(50 - 11, 200 - 181) = 19
    assert [params["max_new_tokens"] for params in driver.params] == [30, 19]
    assert driver.params[0] == {"temperature": 1.0, "stop": ["</search>"], "max_new_tokens": 30}
    assert "max_new_tokens" not in protocol.sampling_params  # a new dict per turn: slime's may be shared


async def test_min_new_tokens_never_exceeds_what_is_left():
    state, protocol, driver, budget = episode([(SEARCH, 4, "stop"), (ANSWER, 3, "stop")], budget=(20, 1000))
    protocol.sampling_params["min_new_tokens"] = 15
    await turns(state, protocol, driver, budget)
    assert [(p["min_new_tokens"], p["max_new_tokens"]) for p in driver.params] == [(15, 20), (9, 9)]
    assert protocol.sampling_params["min_new_tokens"] == 15


async def test_a_zero_min_new_tokens_is_left_as_it_is():
    state, protocol, driver, budget = episode([(ANSWER, 3, "stop")])
    protocol.sampling_params["min_new_tokens"] = 0
    await turns(state, protocol, driver, budget)
    assert driver.params[0]["min_new_tokens"] == 0


async def test_an_engine_abort_counts_and_aborts():
    state, protocol, driver, budget = episode([(SEARCH, 2, "abort")])
    state.stats.engine_aborts = 2
    assert await turns(state, protocol, driver, budget) == (Sample.Status.ABORTED, FinishReason.ENGINE_ABORT)
    assert state.stats.engine_aborts == 3
    assert state.stats.turns == 0  # finished when it resumes
    assert state.stats.generated_tokens == 2
    assert protocol.reads == []


async def test_an_abort_whose_tokens_ended_the_turn_is_counted_and_the_episode_goes_on():
    # the engine said abort, but its last token ended the turn (engine_rules.settle made it a stop): read, run,
    # answered
    state, protocol, driver, budget = episode([(SEARCH, 4, "stop", True), (ANSWER, 3, "stop", True)])
    assert await turns(state, protocol, driver, budget) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    assert state.stats.engine_aborts == 2 and state.stats.aborts_after_turn_end == 2
    assert state.stats.turns == 2 and len(protocol.reads) == 2 and len(driver.observations) == 1


async def test_an_engine_answer_that_cannot_be_trained_on_fails_the_episode_with_its_reason():
    problem = EngineProtocolError("the engine's log prob of output token 3 (id 7) is null: ...")
    state, protocol, driver, budget = episode([(SEARCH, 4, "stop"), problem])
    assert await turns(state, protocol, driver, budget) == (Sample.Status.FAILED, FinishReason.ENGINE_ERROR)
    assert state.stats.engine_error == str(problem)
    assert state.stats.turns == 1 and state.stats.generated_tokens == 4
    long = EngineProtocolError("x" * 900)
    state, protocol, driver, budget = episode([long])
    await turns(state, protocol, driver, budget)
    assert state.stats.engine_error == "x" * 500


async def test_slime_s_abort_flag_stops_before_the_engine_is_called():
    state = make_state(aborted=True)
    state, protocol, driver, budget = episode([(ANSWER, 3, "stop")], state=state)
    assert await turns(state, protocol, driver, budget) == (Sample.Status.ABORTED, FinishReason.ROLLOUT_ABORTED)
    assert driver.params == []


async def test_a_turn_cut_by_the_length_limit_is_truncated_and_not_counted_invalid():
    state, protocol, driver, budget = episode([(JUNK, 5, "length")], budget=(5, 1000))
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET)
    assert state.stats.invalid_actions == 0
    assert state.stats.turns == 1


async def test_a_search_cut_by_the_length_limit_does_not_run():
    state, protocol, driver, budget = episode([(SEARCH, 5, "length")], budget=(5, 1000))
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET)
    assert protocol.replies == [] and TOOL not in state.stats.tools


async def test_a_turn_the_engine_ended_by_length_before_its_offer_reached_the_engines_limit():
    """SGLang lowers max_new_tokens without a word where its context (or KV pool) ends: a length finish with fewer
    tokens than were offered is the engine's limit, not the budget's."""
    state, protocol, driver, budget = episode([(JUNK, 5, "length")], budget=(100, 1000))
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.CONTEXT_LENGTH)
    assert driver.params[0]["max_new_tokens"] == 100 and not state.stats.invalid_actions


async def test_invalid_turns_are_counted_and_the_episode_goes_on():
    state, protocol, driver, budget = episode([(JUNK, 2, "stop"), (JUNK, 2, "stop"), (ANSWER, 2, "stop")])
    state.stats.invalid_actions = 3
    assert await turns(state, protocol, driver, budget) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    assert state.stats.invalid_actions == 5
    assert state.turn_index == 2


async def test_max_turns_without_an_answer_truncates_and_the_last_turn_s_calls_do_not_run():
    state, protocol, driver, budget = episode([(SEARCH, 2, "stop")] * 3, config_of(max_turns=3))
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.MAX_TURNS)
    assert len(driver.params) == 3
    assert len(protocol.replies) == 2  # the third turn's call is not run
    assert state.stats.tools[TOOL].calls == 2
    assert state.stage == "turn" and state.turn_index == 2


async def test_a_context_already_full_ends_before_the_engine_is_called():
    # a prompt that fills the context exactly (or a resumed response that used its budget): nothing is left
    for context_length, generated in ((1000, False), (999, True)):
        state, protocol, driver, budget = episode([(ANSWER, 1, "stop")], context_length=context_length)
        status, reason = await turns(state, protocol, driver, budget)
        assert (len(driver.params) == 1) is generated
        if not generated:
            assert (status, reason) == (Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET)
        else:
            assert driver.params[0]["max_new_tokens"] == 1


async def test_a_reply_that_leaves_no_token_to_generate_is_not_shown():
    # 4 generated: 8 left; a reply of 2 + 5 = 7 ids leaves one token, a reply of 8 leaves none
    for reply_length, shown in ((2, True), (3, False)):
        state, protocol, driver, budget = episode([(SEARCH, 4, "stop"), (ANSWER, 1, "stop")], budget=(12, 1000))
        protocol.reply_length = reply_length
        status, reason = await turns(state, protocol, driver, budget)
        assert (status == Sample.Status.COMPLETED) is shown
        if not shown:
            assert reason == FinishReason.TOKEN_BUDGET
            assert driver.observations == [] and state.stats.observation_tokens == 0


@pytest.mark.parametrize(("left", "runs", "answers"), [(8, True, True), (2, True, False), (1, False, False)])
async def test_a_call_is_not_run_when_no_reply_could_fit_with_one_more_token(left, runs, answers):
    # the turn ends with a call (an engine may complete it with the last allowed token) and leaves `left` tokens; its
    # reply takes 2 + 5 ids: with 2 left the call runs and its reply is too long, with 1 no reply of any length fits
    state, protocol, driver, budget = episode([(SEARCH, 20 - left, "stop"), (ANSWER, 1, "stop")], budget=(20, 1000))
    status, reason = await turns(state, protocol, driver, budget)
    assert (TOOL in state.stats.tools) is runs
    if answers:
        assert (status, reason) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    else:
        assert (status, reason) == (Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET)


async def test_truncated_results_are_counted_over_the_episode():
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop"), (SEARCH, 1, "stop"), (ANSWER, 1, "stop")])
    protocol.truncated = 2
    state.stats.truncated_observations = 1
    await turns(state, protocol, driver, budget)
    assert state.stats.truncated_observations == 5


async def test_short_form_savings_are_summed_over_the_turns_of_a_split_episode():
    script = [(SEARCH, 1, "stop"), (SEARCH, 1, "stop"), (ANSWER, 1, "stop")]
    state, protocol, driver, budget = episode(script, config_of(split_trajectories=True))
    driver.trajectory.saved_per_turn = 4
    state.stats.short_form_tokens_saved = 1
    await turns(state, protocol, driver, budget)
    assert state.stats.short_form_tokens_saved == 1 + 3 * 4
    state, protocol, driver, budget = episode(script)
    driver.trajectory.saved_per_turn = 4
    await turns(state, protocol, driver, budget)
    assert state.stats.short_form_tokens_saved == 0  # not shortened unless split_trajectories


async def test_without_a_conversation_replies_are_not_recorded():
    state = make_state(conversation=False)
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop"), (JUNK, 1, "stop")], state=state)
    protocol_read = protocol.read

    def read_without_message(turn, state):
        action = protocol_read(turn, state)
        action.message = None
        return action

    protocol.read = read_without_message
    config = state.config
    config.max_turns = 2
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.MAX_TURNS)
    assert state.conversation is None


# ---- tools: failing, aborted, counted ---------------------------------------------------------------------------


async def test_a_tool_failing_for_good_fails_the_episode():
    async def broken(arguments, state):
        raise ToolError("down")

    state = make_state(tools={TOOL: make_tool(broken)})
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop"), (ANSWER, 1, "stop")], state=state)
    assert await turns(state, protocol, driver, budget) == (Sample.Status.FAILED, FinishReason.TOOL_FAILED)
    assert protocol.replies == []


async def test_an_abort_while_calls_run_restores_their_counters_for_the_resume():
    done = asyncio.Event()

    async def first(arguments, state):
        done.set()
        return "first"

    async def aborted(arguments, state):
        await done.wait()
        raise ToolAborted("slime aborted")

    state = make_state(tools={"a": make_tool(first, "a"), "b": make_tool(aborted, "b")})
    state.stats.tools = {"a": ToolStats(calls=1, seconds=[0.5])}
    state.turn_index = 1
    state, protocol, driver, budget = episode([("two calls", 1, "stop")], state=state)
    protocol.read = lambda turn, state: Action(calls=[call("x", "c0", "a"), call("y", "c1", "b")])
    assert await turns(state, protocol, driver, budget) == (Sample.Status.ABORTED, FinishReason.ROLLOUT_ABORTED)
    assert state.stats.tools == {"a": ToolStats(calls=1, seconds=[0.5])}  # as before the turn: they run again
    assert state.stage == "tool" and state.turn_index == 1  # where it resumes: the calls of turn 1


# ---- resuming where an aborted episode stood --------------------------------------------------------------------


async def test_a_turn_cut_mid_generation_continues_without_beginning_again():
    state, protocol, driver, budget = episode([(ANSWER, 3, "stop")], response_length=9)
    state.conversation = [{"role": "assistant"}, {"role": "tool"}]
    state.turn_index, state.stage, state.turn_start, state.turn_started_at = 1, "turn", 6, 1
    assert await turns(state, protocol, driver, budget) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    assert (state.turn_start, state.turn_started_at) == (6, 1)  # the turn began before the abort
    assert driver.params[0]["max_new_tokens"] == 100 - 9


async def test_a_resumed_turn_with_nothing_generated_begins_again():
    state, protocol, driver, budget = episode([(ANSWER, 3, "stop")], response_length=6)
    state.conversation = [{"role": "assistant"}, {"role": "tool"}]
    state.turn_index, state.stage, state.turn_start, state.turn_started_at = 1, "turn", 6, 0
    await turns(state, protocol, driver, budget)
    assert (state.turn_start, state.turn_started_at) == (6, 2)


async def test_only_the_first_turn_of_a_resume_continues():
    state, protocol, driver, budget = episode([(SEARCH, 3, "stop"), (ANSWER, 1, "stop")], response_length=9)
    state.conversation = []
    state.stage, state.turn_start = "turn", 6
    await turns(state, protocol, driver, budget)
    assert state.turn_start == 9 + 3 + 7  # turn 1 began after turn 0 and its reply


async def test_a_resume_at_the_tool_stage_reads_the_written_turn_again_and_runs_its_calls():
    state, protocol, driver, budget = episode([(ANSWER, 2, "stop")], response_length=5)
    driver.written = Turn(ids=[1] * 5, finish_type="stop", text="search:again")
    state.turn_index, state.stage, state.turn_start = 1, "tool", 0
    state.stats.turns = 2
    assert await turns(state, protocol, driver, budget) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    assert protocol.reads[0][0].text == "search:again" and protocol.reads[0][1] is state
    assert protocol.replies[0][0] == {"c0": "again"}
    assert len(driver.params) == 1  # the written turn is not generated again
    assert state.stats.turns == 3  # the resumed turn was counted before the abort
    assert state.turn_index == 2


async def test_an_episode_resumed_past_its_max_turns_ends_max_turns():
    state, protocol, driver, budget = episode([(ANSWER, 1, "stop")], config_of(max_turns=2))
    state.turn_index = 2
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.MAX_TURNS)
    assert driver.params == []


# ---- long horizons: force_answer ----------------------------------------------------------------------------------


async def test_final_turn_runs_one_more_turn_whose_calls_do_not_run():
    config = config_of(max_turns=2, force_answer="final_turn")
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop")] * 3, config)
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.MAX_TURNS)
    assert len(driver.params) == 3 and len(protocol.replies) == 2
    assert state.stats.forced_answer == {"mode": "final_turn", "turn": 2, "trigger": "max_turns", "tokens": 0}


async def test_final_turn_answered_earlier_records_no_forced_answer():
    config = config_of(max_turns=2, force_answer="final_turn")
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop"), (ANSWER, 1, "stop")], config)
    assert await turns(state, protocol, driver, budget) == (Sample.Status.COMPLETED, FinishReason.ANSWER)
    assert state.stats.forced_answer is None


async def test_inject_tells_the_model_to_answer_before_the_last_turn():
    config = config_of(max_turns=3, force_answer="inject")
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop")] * 3, config)
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.MAX_TURNS)
    assert state.stats.forced_answer == {"mode": "inject", "turn": 2, "trigger": "max_turns", "tokens": 3}
    assert [force for *_, force in protocol.replies] == [ABSENT, ABSENT, True]
    assert driver.observations[1] == ([9, 9] + [8] * 5 + [5] * 3, ABSENT)  # the forced reply is shown
    assert len(driver.params) == 3


async def test_inject_by_reserve_ends_token_budget_after_the_forced_turn():
    # budget 40: turn 0 takes 10, its reply 7 leaves 23 < reserve 25: the reply forces the answer on turn 1
    config = config_of(max_turns=10, force_answer="inject", force_answer_reserve=25)
    state, protocol, driver, budget = episode([(SEARCH, 10, "stop"), (SEARCH, 1, "stop")], config, budget=(40, 1000))
    assert await turns(state, protocol, driver, budget) == (Sample.Status.TRUNCATED, FinishReason.TOKEN_BUDGET)
    assert state.stats.forced_answer == {"mode": "inject", "turn": 1, "trigger": "reserve", "tokens": 3}
    assert len(driver.params) == 2 and len(protocol.replies) == 2  # turn 1's call is not run


async def test_inject_reserve_boundary_and_no_reserve():
    # reply 7 ids: left after it 30 - 10 - 7 = 13; a reserve of 13 is not crossed, 14 is
    for reserve, forced in ((13, False), (14, True), (0, False)):
        config = config_of(max_turns=10, force_answer="inject", force_answer_reserve=reserve)
        state, protocol, driver, budget = episode([(SEARCH, 10, "stop"), (ANSWER, 1, "stop")], config, budget=(30, 99))
        await turns(state, protocol, driver, budget)
        assert (state.stats.forced_answer is not None) is forced, reserve


async def test_inject_forced_reply_must_leave_a_token_or_the_plain_reply_is_shown():
    # 20 left after turn 0's 10 tokens: the forced reply of 7 + extra ids is shown only if it is shorter than 20
    for extra, forced in ((12, True), (13, False)):
        config = config_of(max_turns=10, force_answer="inject", force_answer_reserve=100)
        state, protocol, driver, budget = episode([(SEARCH, 10, "stop"), (ANSWER, 1, "stop")], config, budget=(30, 99))
        protocol.force_extra = extra
        await turns(state, protocol, driver, budget)
        assert (state.stats.forced_answer is not None) is forced, extra
        assert len(driver.observations[0][0]) == (7 + extra if forced else 7)


async def test_inject_is_decided_once():
    config = config_of(max_turns=10, force_answer="inject", force_answer_reserve=1000)
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop"), (ANSWER, 1, "stop")], config)
    state.stats.forced_answer = {"mode": "inject", "turn": 5, "trigger": "reserve", "tokens": 3}
    await turns(state, protocol, driver, budget)
    assert [force for *_, force in protocol.replies] == [ABSENT]  # turn 1 is not forced: not recorded as forced
    assert state.stats.forced_answer["turn"] == 5


async def test_a_page_chunk_s_short_form_is_rendered_with_the_same_forcing():
    chunk = ChunkResult("a long page chunk", "short")

    async def page(arguments, state):
        return chunk

    config = config_of(max_turns=2, force_answer="inject")
    state = make_state(config, tools={TOOL: make_tool(page)})
    state, protocol, driver, budget = episode([(SEARCH, 1, "stop"), (ANSWER, 1, "stop")], state=state)
    await turns(state, protocol, driver, budget)
    full, short = protocol.replies[1], protocol.replies[2]
    assert full[0] == {"c0": chunk} and full[3] is True
    assert short[0] == {"c0": "short"} and short[3] is True
    assert driver.observations[0] == ([9, 9] + [8] * 16 + [5] * 3, [9, 9] + [8] * 4 + [5] * 3)
    # a plain result beside the chunk keeps its text in the short form
    config = config_of(max_turns=5)
    state = make_state(config, tools={TOOL: make_tool(page), "plain": make_tool(name="plain")})
    state, protocol, driver, budget = episode([("two", 1, "stop"), (ANSWER, 1, "stop")], state=state)
    protocol.read = lambda turn, state: (
        Action(calls=[call("x", "c0"), call("plain text", "c1", "plain")])
        if turn.text == "two"
        else Action(final=True)
    )
    await turns(state, protocol, driver, budget)
    assert protocol.replies[1][0] == {"c0": "short", "c1": "plain text"} and protocol.replies[1][3] is ABSENT


# ---- the budget, the record, resuming ---------------------------------------------------------------------------


def test_budget_left_is_the_smaller_of_response_and_context():
    budget = loop.Budget(response=50, context=200)
    assert budget.left(SimpleNamespace(response_length=10, context_length=150)) == 40
    assert budget.left(SimpleNamespace(response_length=10, context_length=180)) == 20


@pytest.mark.parametrize(
    "sampling, fields, evaluation, expected",
    [
        ({"max_new_tokens": 300}, {}, False, (300, 1000)),
        ({}, {}, False, (512, 1000)),
        ({"max_new_tokens": None}, {"rollout_max_context_len": 800}, False, (512, 800)),
        ({}, {"rollout_max_context_len": 800, "eval_max_context_len": 700}, False, (512, 800)),
        ({}, {"rollout_max_context_len": 800, "eval_max_context_len": 700}, True, (512, 700)),
        ({}, {"rollout_max_context_len": 800, "eval_max_context_len": 900}, True, (512, 900)),
        ({}, {"rollout_max_context_len": 800, "eval_max_context_len": None}, True, (512, 800)),
        ({}, {"rollout_max_context_len": 800}, True, (512, 800)),
        ({}, {"rollout_max_context_len": 1200}, False, (512, 1000)),
        ({}, {"rollout_max_context_len": "800"}, False, (512, 800)),
    ],
)
def test_episode_budget(sampling, fields, evaluation, expected):
    args = Namespace(rollout_max_response_len=512, **fields)
    budget = loop.episode_budget(args, sampling, config_of(max_context_length=1000), evaluation)
    assert (budget.response, budget.context) == expected
    assert type(budget.response) is int and type(budget.context) is int


def record_state(status=Sample.Status.ABORTED, partial_rollout=True, **config):
    args = Namespace(partial_rollout=partial_rollout) if partial_rollout is not None else Namespace()
    state = make_state(config_of(**config), args=args)
    state.turn_index, state.stage, state.turn_start, state.turn_started_at = 2, "tool", 30, 4
    return state


def test_finish_records_where_an_aborted_partial_rollout_stood():
    state = record_state()
    sample = loop.finish(state, Sample.Status.ABORTED, FinishReason.ENGINE_ABORT, [(0, 5, "1")])
    record = episode_record(sample)
    assert record["resume"] == {"turn_index": 2, "stage": "tool", "turn_start": 30, "conversation_start": 4}
    assert record["finish_reason"] == "engine_abort"
    assert record["versions"] == [[0, 5, "1"]]
    assert sample.status == Sample.Status.ABORTED and sample.remove_sample is False


@pytest.mark.parametrize(
    "status, partial_rollout",
    [(Sample.Status.ABORTED, False), (Sample.Status.ABORTED, None), (Sample.Status.TRUNCATED, True)],
)
def test_finish_records_no_resume_point_otherwise(status, partial_rollout):
    sample = loop.finish(record_state(status, partial_rollout), status, FinishReason.MAX_TURNS)
    assert "resume" not in episode_record(sample)
    assert episode_record(sample)["versions"] == []
    assert sample.status == status


@pytest.mark.parametrize(
    "status, removed",
    [(Sample.Status.FAILED, True), (Sample.Status.TRUNCATED, False), (Sample.Status.COMPLETED, False)],
)
def test_finish_removes_failed_samples_only(status, removed):
    sample = loop.finish(record_state(status), status, FinishReason.TOOL_FAILED)
    assert sample.remove_sample is removed


PROMPT = [1, 2, 3]


def aborted_sample(response_length=2, resume=True, status=Sample.Status.ABORTED, **fields) -> Sample:
    values = dict(
        prompt="p",
        tokens=PROMPT + [7] * response_length,
        response_length=response_length,
        loss_mask=[1] * response_length,
        status=status,
    )
    sample = Sample(**{**values, **fields})
    point = {"turn_index": 1, "stage": "turn", "turn_start": 1, "conversation_start": 0}
    write_episode(sample, {"turns": 1, **({"resume": point} if resume else {})})
    return sample


def test_resumable_record_of_a_partial_rollout_s_aborted_sample():
    sample = aborted_sample()
    assert loop.resumable_record(Namespace(partial_rollout=True), sample, PROMPT, False) is episode_record(sample)


@pytest.mark.parametrize(
    "args, sample, prompt, log_probs",
    [
        (Namespace(partial_rollout=False), aborted_sample(), PROMPT, False),
        (Namespace(), aborted_sample(), PROMPT, False),
        (Namespace(partial_rollout=True), aborted_sample(status=Sample.Status.COMPLETED), PROMPT, False),
        (Namespace(partial_rollout=True), aborted_sample(resume=False), PROMPT, False),
        (Namespace(partial_rollout=True), aborted_sample(response_length=0), PROMPT, False),
        (Namespace(partial_rollout=True), aborted_sample(), [1, 2, 4], False),  # the prompt renders differently
        (Namespace(partial_rollout=True), aborted_sample(), PROMPT, True),  # no log probs to continue
    ],
    ids=["no-partial-rollout", "no-flag", "not-aborted", "no-resume-point", "empty-response", "prompt", "log-probs"],
)
def test_resumable_record_starts_over_otherwise(args, sample, prompt, log_probs):
    assert loop.resumable_record(args, sample, prompt, log_probs) is None


def test_resumable_record_with_log_probs_that_line_up():
    sample = aborted_sample(rollout_log_probs=[-0.5, -0.25])
    assert loop.resumable_record(Namespace(partial_rollout=True), sample, PROMPT, True) is episode_record(sample)


def test_resumable_record_of_a_sample_without_a_record():
    sample = aborted_sample()
    sample.metadata = {}
    assert loop.resumable_record(Namespace(partial_rollout=True), sample, PROMPT, False) is None


# ---- run_episode: the parts wired together ----------------------------------------------------------------------

TOKENIZER = object()


class EpisodeDriver(ScriptedDriver):
    script: list = []
    made: list = []

    def __init__(self, state, trajectory, protocol):
        super().__init__(state, trajectory, protocol, type(self).script, response_length=state.sample.response_length)
        type(self).made.append(self)


@pytest.fixture
def wired(monkeypatch):
    """run_episode over the scripted protocol, driver and tool, with the trajectories it makes kept."""
    trajectories: list[FakeTrajectory] = []

    def trajectory(*args, **kwargs):
        trajectories.append(FakeTrajectory(*args, **kwargs))
        return trajectories[-1]

    rewarded: list = []

    async def async_rm(args, sample):
        rewarded.append((args, sample))
        return 0.75

    states: list = []

    def generate_state(args):
        states.append(args)
        return SimpleNamespace(tokenizer=TOKENIZER, aborted=False)

    def encode_prompt(tokenizer, text):
        assert tokenizer is TOKENIZER and text == ScriptedProtocol.prompt_text
        return PROMPT

    monkeypatch.setattr(loop, "GenerateState", generate_state)
    monkeypatch.setattr(loop, "encode_prompt", encode_prompt)
    monkeypatch.setattr(loop, "Trajectory", trajectory)
    monkeypatch.setattr(loop, "async_rm", async_rm)
    monkeypatch.setitem(PROTOCOLS._entries, "generate", ScriptedProtocol)  # in the built-ins' place, undone after
    monkeypatch.setitem(TOKEN_DRIVERS._entries, "manual", EpisodeDriver)
    monkeypatch.setitem(TOOLS._entries, "search", make_tool(name="search"))
    EpisodeDriver.made, EpisodeDriver.prepared = [], []
    EpisodeDriver.script = [(SEARCH, 4, "stop"), (ANSWER, 3, "stop")]
    return SimpleNamespace(trajectories=trajectories, rewarded=rewarded, drivers=EpisodeDriver.made, states=states)


def episode_config(**overrides):
    return config_of(tools=["search"], **overrides)


async def run(args=None, sample=None, config=None, evaluation=False, budget=64):
    args = args or Namespace(partial_rollout=False, rollout_max_response_len=999)
    sample = sample or Sample(prompt="p")
    return await loop.run_episode(args, sample, {"max_new_tokens": budget}, config or episode_config(), evaluation)


async def test_run_episode_wires_the_parts(wired):
    args = Namespace(partial_rollout=False, rollout_max_response_len=999)
    sample = await run(args, config=episode_config(return_logprob=True, train_observations=True))
    record = episode_record(sample)
    assert sample.status == Sample.Status.COMPLETED and record["finish_reason"] == "answer"
    assert record["evaluation"] is False
    assert record["versions"] == [[0, 1, "3"]]
    assert record["conversation"][0] == {"role": "assistant", "content": SEARCH}
    assert record["tools"]["search"]["calls"] == 1
    (trajectory,) = wired.trajectories
    assert trajectory.args == (args, sample, PROMPT)
    assert trajectory.kwargs == {"track_log_probs": True, "train_observations": True, "continued": False}
    assert trajectory.decoded_with == [TOKENIZER]
    assert trajectory.lag_calls == []
    (driver,) = wired.drivers
    assert driver.finished == [Sample.Status.COMPLETED]
    assert driver.params[0]["max_new_tokens"] == 64
    assert driver.state.tokenizer is TOKENIZER and driver.state.args is args
    assert EpisodeDriver.prepared == [driver.state]
    assert wired.states == [args]
    assert isinstance(driver.protocol, ScriptedProtocol) and driver.protocol.state is driver.state
    assert driver.protocol.sampling_params == {"max_new_tokens": 64, "stop": ["</search>"]}
    assert "resumes" in record and record["resumes"] == 0


async def test_run_episode_budget_from_slime_s_args(wired):
    args = Namespace(partial_rollout=False, rollout_max_response_len=50, rollout_max_context_len=900)
    await run(args, budget=None)
    args.eval_max_context_len = 40
    await run(args, budget=None, evaluation=True)
    # the response budget from --rollout-max-response-len; in evaluation the context from --eval-max-context-len
    # (the prompt takes 10)
    assert [driver.params[0]["max_new_tokens"] for driver in wired.drivers] == [50, 30]


async def test_run_episode_in_evaluation(wired):
    sample = await run(evaluation=True, config=episode_config(split_trajectories=True))
    assert isinstance(sample, Sample)  # evaluation scores one sample per episode, even when split
    assert episode_record(sample)["evaluation"] is True
    assert wired.rewarded == []


async def test_run_episode_without_a_conversation(wired, monkeypatch):
    monkeypatch.setattr(ScriptedProtocol, "records_conversation", False)
    read = ScriptedProtocol.read

    def read_without_message(self, turn, state):  # as the real protocols do when they keep no conversation
        action = read(self, turn, state)
        action.message = None
        return action

    monkeypatch.setattr(ScriptedProtocol, "read", read_without_message)
    sample = await run()
    assert "conversation" not in episode_record(sample)


async def test_run_episode_masks_lagging_tokens_of_an_ended_episode(wired, monkeypatch):
    config = episode_config(max_version_lag=2)
    original = FakeTrajectory.__init__

    def with_lag(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.lag_masked = 6

    monkeypatch.setattr(FakeTrajectory, "__init__", with_lag)
    answered = list(EpisodeDriver.script)
    sample = await run(config=config)
    EpisodeDriver.script = [(SEARCH, 2, "abort")]
    aborted = await run(config=config)  # an aborted episode has more to come: nothing is masked yet
    assert wired.trajectories[0].lag_calls == [(2, None)] and episode_record(sample)["lag_masked_tokens"] == 6
    ENGINE_VERSIONS.observe(["7"])  # the engines have shown version 7: the mask measures against it
    EpisodeDriver.script = answered
    try:
        await run(config=config)
    finally:
        ENGINE_VERSIONS.forget()
    assert wired.trajectories[2].lag_calls == [(2, 7)]
    assert wired.trajectories[1].lag_calls == [] and episode_record(aborted)["lag_masked_tokens"] == 0


async def test_run_episode_refuses_partial_rollout_with_a_driver_that_cannot_resume(wired, monkeypatch):
    args = Namespace(partial_rollout=True, rollout_max_response_len=999)
    monkeypatch.setattr(EpisodeDriver, "resumable", False)
    with pytest.raises(ConfigError, match=r"^--partial-rollout .*TOKEN_TRACKING_MODE=manual cannot continue; use "):
        await run(args)
    assert await run() is not None  # without --partial-rollout it runs
    monkeypatch.delattr(EpisodeDriver, "resumable")
    monkeypatch.delattr(ScriptedDriver, "resumable")
    with pytest.raises(ConfigError):
        await run(args)
    with pytest.raises(ConfigError):  # a driver class without the attribute cannot resume either
        await run(Namespace(partial_rollout=True, rollout_max_response_len=999))


async def test_run_episode_without_the_partial_rollout_flag_runs_any_driver(wired, monkeypatch):
    monkeypatch.setattr(EpisodeDriver, "resumable", False)
    sample = await run(Namespace(rollout_max_response_len=999))
    assert sample.status == Sample.Status.COMPLETED


async def test_run_episode_resumes_an_aborted_partial_rollout_sample(wired):
    args = Namespace(partial_rollout=True, rollout_max_response_len=999)
    sample = aborted_sample(response_length=2, rollout_log_probs=[-0.5, -0.25])
    EpisodeDriver.script = [(ANSWER, 3, "stop")]
    sample = await run(args, sample, episode_config(return_logprob=True))
    record = episode_record(sample)
    assert wired.trajectories[0].kwargs["continued"] is True
    assert wired.trajectories[0].args[1] is sample
    assert record["resumes"] == 1 and record["resumed_at"] == [2] and record["turns"] == 2
    assert wired.drivers[0].params[0]["max_new_tokens"] == 64 - 2
    assert sample.status == Sample.Status.COMPLETED


async def test_run_episode_starts_over_a_sample_without_the_log_probs_it_needs(wired):
    args = Namespace(partial_rollout=True, rollout_max_response_len=999)
    sample = aborted_sample(response_length=2)
    EpisodeDriver.script = [(ANSWER, 3, "stop")]
    sample = await run(args, sample, episode_config(return_logprob=True))
    assert wired.trajectories[0].kwargs["continued"] is False
    assert episode_record(sample)["resumes"] == 0


async def test_run_episode_keeps_a_resumable_record_when_aborted_again(wired):
    args = Namespace(partial_rollout=True, rollout_max_response_len=999)
    EpisodeDriver.script = [(SEARCH, 2, "abort")]
    sample = await run(args)
    assert episode_record(sample)["resume"]["stage"] == "turn"
    assert wired.drivers[0].finished == [Sample.Status.ABORTED]


def segment_copies(sample, count):
    def segments(tokenizer):
        assert tokenizer is TOKENIZER
        parts = []
        for length in range(1, count + 1):
            part = copy.deepcopy(sample)
            part.response_length = length
            parts.append(part)
        return parts

    return segments


async def test_run_episode_splits_a_training_episode_with_its_reward(wired, monkeypatch):
    made = []
    original = FakeTrajectory.__init__

    def with_segments(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.segments = [SimpleNamespace(start=0), SimpleNamespace(start=5), SimpleNamespace(start=14)]
        self.segment_samples_of = segment_copies(args[1], 3)
        made.append(self)

    monkeypatch.setattr(FakeTrajectory, "__init__", with_segments)
    args = Namespace(partial_rollout=False, rollout_max_response_len=999)
    sample = Sample(prompt="p")
    segments = await run(args, sample, episode_config(split_trajectories=True))
    assert made[0].response_length == 14  # 4 + 7 + 3: the segment starting at 14 holds nothing
    assert [episode_record(s)["segment"] for s in segments] == [
        {"index": 0, "count": 3, "start": 0},
        {"index": 1, "count": 3, "start": 1},
        {"index": 2, "count": 3, "start": 3},
    ]
    assert all(episode_record(s)["segments"] == 2 for s in segments)
    assert wired.rewarded == [(args, sample)] and sample.reward == 0.75
    assert all(episode_record(s)["versions"] == [[0, 1, "3"]] for s in segments)
    assert all(s.status == Sample.Status.COMPLETED for s in segments)


async def test_run_episode_does_not_split_or_score_an_aborted_training_episode(wired, monkeypatch):
    original = FakeTrajectory.__init__

    def with_segments(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.segments = [SimpleNamespace(start=0), SimpleNamespace(start=1)]

    monkeypatch.setattr(FakeTrajectory, "__init__", with_segments)
    EpisodeDriver.script = [(SEARCH, 2, "abort")]
    sample = Sample(prompt="p")
    out = await run(sample=sample, config=episode_config(split_trajectories=True))
    assert out == [sample] and sample.status == Sample.Status.ABORTED
    assert episode_record(sample)["segments"] == 1 and wired.rewarded == []


def test_enabled_tools_in_the_setting_s_order(monkeypatch):
    monkeypatch.setitem(TOOLS._entries, "search", "the search tool")
    monkeypatch.setitem(TOOLS._entries, "access", "the access tool")
    tools = loop.enabled_tools(config_of(tools=["access", "search"]))
    assert list(tools.items()) == [("access", "the access tool"), ("search", "the search tool")]


def test_forced_answer_record():
    assert loop.forced_answer("inject", 3, "reserve") == {
        "mode": "inject",
        "turn": 3,
        "trigger": "reserve",
        "tokens": 0,
    }
