"""Long horizons (issue 30 items 4-6): a forced final answer, episodes split into several samples, pages in chunks.

Episodes run through slime's own path (GenerateState.submit_generate_tasks -> generate_and_rm_group -> generate_and_rm
-> generate()): the stand-in follows slime's code and SLIME_SRC runs slime's, including its check of the rollout_id
contract and its flattening of the groups. Every fidelity property is checked per sample: each engine call belongs to
exactly one segment, whose tokens start with the call's context; sampled ids at mask 1 with their log probs; all else
masked.
"""

import asyncio
import itertools
import os
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from generate_with_search import post_process_rewards, reward_func
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.launch.__main__ import main as launch
from slime_search_r1.launch.checks import PLUGIN
from slime_search_r1.loop import enabled_tools
from slime_search_r1.protocols.chat import FORCE_ANSWER_MESSAGE, FORCED_ANSWER_KEY
from slime_search_r1.protocols.xml_tags import FORCE_ANSWER_NOTE, prompt_text
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config
from slime_search_r1.slime_flags import REWARD_POST_PROCESS_PATH
from slime_search_r1.tools import access
from slime_search_r1.tools.access import ACCESS
from slime_search_r1.tools.search import SEARCH as SEARCH_TOOL
from slime_search_r1.training.metrics import search_metrics
from support.episodes import (
    ANSWER,
    CHAT_LABEL,
    MODE_IDS,
    MODES,
    QUESTION,
    SEARCH,
    chat_messages,
    conversation,
    info,
    label,
    run_episode,
    searches,
)
from support.fake_retriever import page_url
from support.fidelity import assert_faithful
from support.slime_group_math import slime_post_process_rewards
from support.slime_rollout import chat_prompt, slime_sampling_params

PARIS = page_url('"Paris"\n')


def chat_call(tool: str, argument: str, value: str) -> str:
    return f'<tool_call>\n{{"name": "{tool}", "arguments": {{"{argument}": "{value}"}}}}\n</tool_call>'


READ_THE_PAGE = {
    "generate": [
        "<think>Search first.</think>\n<search> capital of France </search>",
        *[f"<think>Read on.</think>\n<access> {PARIS} </access>"] * 3,
        "<think>The page says Paris.</think>\n<answer> Paris </answer>",
    ],
    "chat": [
        chat_call("search", "query", "capital of France"),
        *[chat_call("access", "url", PARIS)] * 3,
        "<think>The page says Paris.</think>\n<answer> Paris </answer>",
    ],
}


def read_the_page_then(answer: str, mode: str = "generate") -> list[str]:
    return [*READ_THE_PAGE[mode][:-1], READ_THE_PAGE[mode][-1].replace("Paris </answer>", f"{answer} </answer>")]


# ---- slime's path -------------------------------------------------------------------------------------------------


async def slime_rollout(args, groups: list[list[Sample]]) -> list:
    """One rollout through slime's GenerateState and generate_and_rm_group, every group to its end."""
    state = GenerateState(args)
    state.submit_generate_tasks(groups)
    done = await asyncio.gather(*state.pendings)
    state.reset()
    return list(done)


def slime_flattened(groups: list) -> list[Sample]:
    """What slime's RolloutManager._get_rollout_data does with the rollout's groups before training: check the
    rollout_id contract, then flatten."""
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated

    validate_rollout_id_annotated(groups)
    data = groups
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    return data


def assert_segments_faithful(segments: list[Sample], calls, tokenizer, **checks) -> None:
    """Each engine call belongs to exactly one segment (its context is a prefix of that segment's tokens and reaches
    into its response), and every segment is faithful to its own calls."""
    owners = []
    for call in calls:
        owning = [
            index
            for index, segment in enumerate(segments)
            if segment.tokens[: len(call.input_ids)] == call.input_ids
            and len(call.input_ids) >= len(segment.tokens) - segment.response_length
        ]
        assert len(owning) == 1, f"an engine call belongs to segments {owning}"
        owners.append(owning[0])
    for index, segment in enumerate(segments):
        prefix = segment.tokens[: len(segment.tokens) - segment.response_length]
        mine = [call for call, owner in zip(calls, owners, strict=True) if owner == index]
        assert mine, f"segment {index} holds no engine call"
        assert_faithful(segment, mine, tokenizer, prefix, **checks)


# ---- 4. forced final answer ---------------------------------------------------------------------------------------


@pytest.fixture
def always_searches(policy, search_config):
    def arm(mode: str, max_turns: int = 3, **settings):
        policy.scripts[QUESTION + "?"] = [SEARCH[mode]]
        search_config.update(max_turns=max_turns, **settings)

    return arm


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_final_turn_adds_one_generation_whose_tool_calls_are_not_run(
    mode, make_args, tokenizer, engine, retriever, search_config, always_searches
):
    always_searches(mode, force_answer="off")
    off = await run_episode(mode, make_args, tokenizer, search_config)
    assert len(engine.calls_for(off.prompt_ids)) == 3 and searches(off.sample) == 2  # the last turn's call not run
    engine.calls.clear()
    retriever.requests = 0

    always_searches(mode, force_answer="final_turn")
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    calls = engine.calls_for(episode.prompt_ids)
    assert len(calls) == 3 + 1  # max_turns + 1 generations
    assert searches(episode.sample) == 3 == retriever.requests  # max_turns searches: the final turn's is not run
    record = info(episode.sample)
    assert record["turns"] == 4
    assert record["forced_answer"] == {"mode": "final_turn", "turn": 3, "trigger": "max_turns", "tokens": 0}
    assert (episode.sample.status, record["finish_reason"]) == (Sample.Status.TRUNCATED, "max_turns")
    assert_faithful(episode.sample, calls, tokenizer, episode.prompt_ids)


def forced_reply(calls, tokenizer, prompt_length: int, sample: Sample) -> tuple[str, list[int]]:
    """The text of the reply before the last engine call, and its loss mask."""
    before, last = calls[-2], calls[-1]
    start = len(before.input_ids) + len(before.output_ids)
    reply = last.input_ids[start:]
    return tokenizer.decode(reply), sample.loss_mask[start - prompt_length : len(last.input_ids) - prompt_length]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_inject_puts_the_instruction_once_masked_and_shortens_that_turns_budget(
    mode, make_args, tokenizer, engine, retriever, search_config, always_searches
):
    always_searches(mode, force_answer="off")
    off = await run_episode(mode, make_args, tokenizer, search_config)
    budget_without = engine.calls_for(off.prompt_ids)[-1].sampling_params["max_new_tokens"]
    engine.calls.clear()

    always_searches(mode, force_answer="inject")
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    sample, calls = episode.sample, engine.calls_for(episode.prompt_ids)
    instruction = FORCE_ANSWER_NOTE.strip() if mode == "generate" else FORCE_ANSWER_MESSAGE
    assert len(calls) == 3 and searches(sample) == 2  # no extra turn; the last turn's call is not run
    assert sample.response.count(instruction) == 1
    reply, mask = forced_reply(calls, tokenizer, len(episode.prompt_ids), sample)
    assert instruction in reply and set(mask) == {0}  # outside the loss
    if mode == "chat":
        forced = [m for m in conversation(sample) if m.get(FORCED_ANSWER_KEY)]
        assert forced == [{"role": "user", "content": FORCE_ANSWER_MESSAGE, FORCED_ANSWER_KEY: True}]
    record = info(sample)["forced_answer"]
    assert record["mode"] == "inject" and record["turn"] == 2 and record["trigger"] == "max_turns"
    assert record["tokens"] > 0
    assert calls[-1].sampling_params["max_new_tokens"] == budget_without - record["tokens"]
    assert_faithful(sample, calls, tokenizer, episode.prompt_ids)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize(("force", "max_turns"), [("final_turn", 2), ("inject", 3)])
async def test_a_forced_turn_that_answers_completes_the_episode_with_the_whole_reward(
    mode, force, max_turns, make_args, tokenizer, engine, policy, retriever, search_config
):
    """Two searches, then the forced turn (the extra one, or the one after the instruction) answers: the episode
    completes and keeps the format bonus (the instruction is the environment's, not the model's)."""
    policy.scripts[QUESTION + "?"] = [SEARCH[mode], SEARCH[mode], ANSWER[mode]]
    search_config.update(max_turns=max_turns, force_answer=force)
    episode = await run_episode(mode, make_args, tokenizer, search_config)
    assert info(episode.sample)["forced_answer"]["turn"] == 2 and searches(episode.sample) == 2
    assert episode.sample.status == Sample.Status.COMPLETED
    assert await reward_func(episode.args, episode.sample) == 1.0
    assert info(episode.sample)["reward"]["format_valid"] == 1.0


async def test_inject_below_the_reserve_forces_the_next_turn(
    make_args, tokenizer, engine, retriever, search_config, always_searches
):
    always_searches("generate", max_turns=8, force_answer="inject", force_answer_reserve=100_000)
    episode = await run_episode("generate", make_args, tokenizer, search_config)
    record = info(episode.sample)
    assert record["forced_answer"]["trigger"] == "reserve" and record["forced_answer"]["turn"] == 1
    assert len(engine.calls_for(episode.prompt_ids)) == 2 and searches(episode.sample) == 1
    assert record["finish_reason"] == "token_budget"
    assert episode.sample.response.count(FORCE_ANSWER_NOTE.strip()) == 1


async def test_the_log_hooks_count_forced_answers(make_args, tokenizer, engine, policy, retriever, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"], SEARCH["generate"], ANSWER["generate"]]
    search_config.update(max_turns=2, force_answer="final_turn")
    answered = (await run_episode("generate", make_args, tokenizer, search_config)).sample
    policy.scripts[QUESTION + "?"] = [SEARCH["generate"]]
    ignored = (await run_episode("generate", make_args, tokenizer, search_config)).sample
    search_config.update(force_answer="off")
    policy.scripts[QUESTION + "?"] = [ANSWER["generate"]]
    plain = (await run_episode("generate", make_args, tokenizer, search_config)).sample
    metrics = search_metrics([answered, ignored, plain])
    assert metrics["forced_answer_share"] == pytest.approx(2 / 3)
    assert metrics["forced_answer/answered_share"] == 0.5


# ---- 5 and 6. pages in chunks, episodes split into samples --------------------------------------------------------


@pytest.fixture
def chunked(search_config, monkeypatch):
    """Access on, pages read in 100-token chunks (the Paris page: 3 of them at most), split trajectories."""
    search_config.update(
        max_turns=6,
        tools=["search", "access"],
        split_trajectories=True,
        page_chunk_tokens=100,
        page_short_tokens=8,
    )
    monkeypatch.setattr(access, "MAX_PAGE_CHUNKS", 3)
    return search_config


@pytest.fixture
def split_args(make_args):
    def make(**overrides):
        return make_args(custom_reward_post_process_path=REWARD_POST_PROCESS_PATH, **overrides)

    return make


def new_sample(mode: str, tokenizer, question: str = QUESTION, index: int = 0) -> Sample:
    if mode == "chat":
        metadata = {"tools": [SEARCH_TOOL.schema, ACCESS.schema]}
        return Sample(prompt=chat_messages(question), label=CHAT_LABEL, index=index, group_index=0, metadata=metadata)
    return Sample(prompt=chat_prompt(tokenizer, question), label=label("Paris"), index=index, group_index=0)


def prompt_ids_of(mode: str, args, tokenizer, sample: Sample, config) -> list[int]:
    tools = enabled_tools(resolve_config(config))
    if mode == "chat":
        schemas = [tool.schema for tool in tools.values()]
        text = tokenizer.apply_chat_template(sample.prompt, tools=schemas, tokenize=False, add_generation_prompt=True)
    else:
        text = prompt_text(args, tokenizer, sample, tools)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
async def test_a_three_chunk_page_gives_three_reading_turns_with_one_full_chunk_per_context(
    mode, split_args, tokenizer, engine, policy, retriever, chunked
):
    chunked["llm_api_mode"] = mode
    policy.scripts[QUESTION + "?"] = READ_THE_PAGE[mode]
    args = split_args()
    [[segments]] = await slime_rollout(args, [[new_sample(mode, tokenizer)]])
    prompt_ids = prompt_ids_of(mode, args, tokenizer, new_sample(mode, tokenizer), chunked)
    calls = engine.calls_for(prompt_ids)
    assert len(calls) == 5  # search, access, access (reads part 1), access (reads part 2), answer (reads part 3)

    contexts = [tokenizer.decode(call.input_ids) for call in calls]
    full = [[f"[part {i} of 3]\n" in text for i in (1, 2, 3)] for text in contexts]
    read = [[f"[part {i} of 3, read]\n" in text for i in (1, 2, 3)] for text in contexts]
    assert [sum(parts) for parts in full] == [0, 0, 1, 1, 1]  # one full chunk per context, in the reading turns
    assert [parts.index(True) + 1 for parts in full[2:]] == [1, 2, 3]
    assert read[3] == [True, False, False] and read[4] == [True, True, False]  # what was read: in short form

    ends = re.compile(r"\n\[access the same URL again|</information>|\n</tool_response>")
    chunks = [
        ends.split(text.split(f"[part {i} of 3]\n", 1)[1])[0] for i, text in zip((1, 2, 3), contexts[2:], strict=True)
    ]
    assert retriever.pages[PARIS]["contents"].startswith("".join(chunks))  # the page's start, in order, no overlap
    assert min(len(tokenizer.encode(chunk)) for chunk in chunks[:2]) >= 95

    assert [segment.rollout_id for segment in segments] == [0, 0, 0]  # the sample's index, shared
    starts = [sum(part.response_length for part in segments[:i]) for i in range(3)]  # where each part begins
    assert [info(segment)["segment"] for segment in segments] == [
        {"index": i, "count": 3, "start": start} for i, start in enumerate(starts)
    ]
    record = info(segments[0])
    assert record["page_chunks"] == 3 and record["segments"] == 3 and record["short_form_tokens_saved"] > 150
    assert_segments_faithful(segments, calls, tokenizer)
    assert {segment.reward for segment in segments} == {1.0}


async def test_accessing_a_page_read_to_its_end_says_so(split_args, tokenizer, engine, policy, retriever, chunked):
    access.MAX_PAGE_CHUNKS = 1  # the fixture restores it
    policy.scripts[QUESTION + "?"] = READ_THE_PAGE["generate"][:3] + READ_THE_PAGE["generate"][-1:]
    [[segments]] = await slime_rollout(split_args(), [[new_sample("generate", tokenizer)]])
    shown = "".join(segment.response for segment in segments)
    assert f"The page at {PARIS} has no more text: all 1 parts of it were shown." in shown
    assert retriever.accessed == [PARIS]  # fetched once, then read from the episode's own copy
    assert info(segments[0])["page_chunks"] == 1


async def test_split_segments_train_every_token_once_with_the_episodes_reward_and_its_groups_advantage(
    split_args, tokenizer, engine, policy, retriever, chunked
):
    """A GRPO group of four through slime's generate_and_rm_group: two episodes read the page (3 samples each), two do
    not; the right answers get 1.0, the wrong ones the format bonus. The advantages are those of the same group
    unsplit (one sample per episode) under slime's own group math."""
    scripts = {
        "Reads and is right": read_the_page_then("Paris"),
        "Reads and is wrong": read_the_page_then("Lyon"),
        "Searches and is right": [READ_THE_PAGE["generate"][0], ANSWER["generate"]],
        "Guesses wrong": ["<think>A guess.</think>\n<answer> Berlin </answer>"],
    }
    for question, script in scripts.items():
        policy.scripts[question + "?"] = script
    args = split_args(n_samples_per_prompt=4, rollout_batch_size=1)
    group = [new_sample("generate", tokenizer, question, index) for index, question in enumerate(scripts)]
    groups = await slime_rollout(args, [group])
    episodes = groups[0]
    assert [len(episode) for episode in episodes] == [3, 3, 1, 1]

    for episode, question in zip(episodes, scripts, strict=True):
        calls = engine.calls_for(
            prompt_ids_of("generate", args, tokenizer, new_sample("generate", tokenizer, question), chunked)
        )
        generated = sum(len(call.output_ids) for call in calls)
        assert sum(sum(segment.loss_mask) for segment in episode) == generated == info(episode[0])["generated_tokens"]
        assert len({segment.reward for segment in episode}) == 1
        assert len({segment.rollout_id for segment in episode}) == 1
        assert_segments_faithful(episode, calls, tokenizer)
    rewards = [episode[0].reward for episode in episodes]
    assert rewards == [1.0, 0.2, 1.0, 0.2]

    flat = slime_flattened(groups)
    assert len(flat) == 8
    _, advantages = post_process_rewards(args, flat)
    unsplit = [Sample(index=i, reward=reward) for i, reward in enumerate(rewards)]
    per_episode = slime_post_process_rewards(args, unsplit)[1]
    expected = [per_episode[i] for i, episode in enumerate(episodes) for _ in episode]
    assert advantages == pytest.approx(expected, abs=1e-6)
    # slime's own math on the flat list counts a split episode once per sample (and sees one group of 8)
    assert slime_post_process_rewards(args, flat)[1] != pytest.approx(expected, abs=1e-3)

    metrics = search_metrics(flat)  # one count per episode
    assert metrics["samples"] == 4
    assert metrics["split_share"] == 0.5 and metrics["segments/max"] == 3
    assert metrics["page_chunks/mean"] == 1.5


async def test_split_segments_slice_the_top_p_replay_with_their_tokens(
    split_args, tokenizer, engine, policy, retriever, chunked
):
    engine.top_p_replay = "list"
    policy.scripts[QUESTION + "?"] = READ_THE_PAGE["generate"]
    [[segments]] = await slime_rollout(split_args(rollout_top_p=0.9), [[new_sample("generate", tokenizer)]])
    assert len(segments) == 3
    for segment in segments:
        offsets, ids = segment.rollout_top_p_token_offsets.tolist(), segment.rollout_top_p_token_ids.tolist()
        assert len(offsets) == segment.response_length + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
        response = segment.tokens[len(segment.tokens) - segment.response_length :]
        for position, token in enumerate(response):
            kept = ids[offsets[position] : offsets[position + 1]]
            assert kept[:1] == ([token] if segment.loss_mask[position] else [])


async def test_evaluation_scores_one_sample_per_episode(split_args, tokenizer, engine, policy, retriever, chunked):
    from generate_with_search import generate

    policy.scripts[QUESTION + "?"] = READ_THE_PAGE["generate"]
    sample = await generate(split_args(), new_sample("generate", tokenizer), slime_sampling_params(1024), True)
    assert isinstance(sample, Sample) and sample.status == Sample.Status.COMPLETED
    assert info(sample)["page_chunks"] == 3 and info(sample)["short_form_tokens_saved"] > 0
    assert "segment" not in info(sample)


# ---- every property per segment, on random episodes ----------------------------------------------------------------

PAGE = "https://example.org/long_page"
WORDS = ["Paris", "capital", "France", "river", "é", "東京", "🙂", "42", "\n", "<", "&", "part", "[", "]"]
words = st.lists(st.sampled_from(WORDS), min_size=0, max_size=30).map(" ".join)
access_turn = st.builds(lambda t: f"<think>{t}</think>\n<access> {PAGE} </access>", words)
long_turn = st.one_of(
    access_turn,
    access_turn,  # twice as likely: pages are what splits an episode
    st.builds(lambda t, q: f"<think>{t}</think>\n<search> {q} </search>", words, words),
    st.builds(lambda t, a: f"<think>{t}</think>\n<answer> {a} </answer>", words, words),
    words,  # no action
    st.builds(lambda n: "<think>" + "long thought " * n + "</think>", st.integers(10, 200)),
)


@settings(
    max_examples=int(os.environ.get("FIDELITY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    turns=st.builds(
        lambda reads, rest: reads + rest,
        st.lists(access_turn, max_size=4),
        st.lists(long_turn, min_size=1, max_size=6),
    ),
    page=st.lists(st.sampled_from([*WORDS, "More about the river.", "\n\n"]), min_size=20, max_size=400).map(" ".join),
    chunk=st.integers(16, 120),
    short_fraction=st.floats(0.0, 0.99),
    max_chunks=st.integers(1, 4),
    max_turns=st.integers(1, 8),
    budget=st.integers(64, 3000),
    force=st.sampled_from(["off", "final_turn", "inject"]),
    log_probs=st.booleans(),
    honor_stops=st.booleans(),
    non_canonical=st.booleans(),
)
def test_random_long_horizon_episodes_are_token_exact_in_every_segment(
    split_args, tokenizer, engine, policy, retriever, chunked,
    turns, page, chunk, short_fraction, max_chunks, max_turns, budget, force, log_probs, honor_stops, non_canonical,
):  # fmt: skip
    question = "Where is the long thing"
    policy.scripts = {question + "?": turns}
    engine.calls.clear()
    engine.honor_stop_strings = honor_stops
    engine.split_every = 2 if non_canonical else 0
    retriever.pages[PAGE] = {"url": PAGE, "contents": page}
    chunked.update(
        page_chunk_tokens=chunk,
        page_short_tokens=int(short_fraction * chunk),
        max_turns=max_turns,
        force_answer=force,
        return_logprob=log_probs,
    )
    access.MAX_PAGE_CHUNKS = max_chunks  # the fixture restores it
    args = split_args()
    sample = new_sample("generate", tokenizer, question)

    async def episode():
        from generate_with_search import generate

        try:
            return await generate(args, sample, slime_sampling_params(budget))
        finally:
            await close_loop_sessions()

    segments = asyncio.run(episode())
    calls = engine.calls_for(
        prompt_ids_of("generate", args, tokenizer, new_sample("generate", tokenizer, question), chunked)
    )
    assert isinstance(segments, list) and segments
    record = info(segments[0])
    assert record["segments"] == len(segments) and len({s.rollout_id for s in segments}) == 1
    assert len({s.reward for s in segments}) == 1 and segments[0].reward is not None
    assert sum(sum(s.loss_mask) for s in segments) == record["generated_tokens"]
    assert sum(s.response_length for s in segments) == record["generated_tokens"] + record["observation_tokens"]
    assert sum(s.response_length for s in segments) <= budget
    for call in calls:  # at most one chunk in full in any context
        assert len(re.findall(r"\[part \d+ of \d+\]\n", tokenizer.decode(call.input_ids))) <= 1
    event(f"samples: {min(len(segments), 3)}{'+' if len(segments) > 3 else ''}")
    assert_segments_faithful(
        segments, calls, tokenizer, track_log_probs=log_probs, allow_cut=not honor_stops, canonical_observations=True
    )


# ---- refused before anything runs ---------------------------------------------------------------------------------

SPLIT = {"SEARCH_R1_SPLIT_TRAJECTORIES": "true"}
HOOK = ["--custom-reward-post-process-path", REWARD_POST_PROCESS_PATH]


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        (SPLIT, [*HOOK, "--partial-rollout"], r"SEARCH_R1_SPLIT_TRAJECTORIES=true .* --partial-rollout .*accepted"),
        (
            {**SPLIT, "ASYNC_MODE": "fully"},  # the launch passes slime's fully-async rollout function
            HOOK,
            r"SEARCH_R1_SPLIT_TRAJECTORIES=true .* fully-async rollout's abort check .*accepted",
        ),
        (SPLIT, [*HOOK, "--group-rm"], r"SEARCH_R1_SPLIT_TRAJECTORIES=true .* --group-rm .*accepted"),
        (SPLIT, [], r"SEARCH_R1_SPLIT_TRAJECTORIES=true .* accepted: --custom-reward-post-process-path"),
        (
            {**SPLIT, "SEARCH_R1_TOOLS": "search,access", "SEARCH_R1_PAGE_CHUNK_TOKENS": "2000"},
            [*HOOK, "--rollout-max-response-len", "2048"],
            r"SEARCH_R1_PAGE_CHUNK_TOKENS=2000 cannot fit --rollout-max-response-len 2048.*accepted: 0 \(off\) or up "
            r"to 1983",
        ),
        (
            {"SEARCH_R1_TOOLS": "search,access", "SEARCH_R1_PAGE_CHUNK_TOKENS": "256"},
            [],
            r"SEARCH_R1_PAGE_CHUNK_TOKENS=256 .*accepted: SEARCH_R1_SPLIT_TRAJECTORIES=true",
        ),
        ({**SPLIT, "SEARCH_R1_PAGE_CHUNK_TOKENS": "256"}, HOOK, r"access is not enabled; accepted: SEARCH_R1_TOOLS"),
        (
            {**SPLIT, "SEARCH_R1_TOOLS": "search,access", "SEARCH_R1_PAGE_CHUNK_TOKENS": "8"},
            HOOK,
            r"SEARCH_R1_PAGE_CHUNK_TOKENS=8 is out of range; accepted: 0 \(off\) or 16 to",
        ),
        (
            {
                **SPLIT,
                "SEARCH_R1_TOOLS": "search,access",
                "SEARCH_R1_PAGE_CHUNK_TOKENS": "64",
                "SEARCH_R1_PAGE_SHORT_TOKENS": "64",
            },
            HOOK,
            r"SEARCH_R1_PAGE_SHORT_TOKENS=64 would not shorten .* accepted: 0 to 63",
        ),
        (
            {**SPLIT, "TOKEN_TRACKING_MODE": "router_radix", "LEGACY_SLIME_ROUTER": "1"},
            HOOK,
            r"accepted: TOKEN_TRACKING_MODE=manual",
        ),
    ],
    ids=[
        "split-partial-rollout",
        "split-fully-async",
        "split-group-rm",
        "split-without-the-hook",
        "chunk-over-the-budget",
        "chunks-without-split",
        "chunks-without-access",
        "chunk-too-small",
        "short-form-not-shorter",
        "split-router-mode",
    ],
)
def test_bad_long_horizon_settings_are_refused_at_launch_in_one_line(env, flags, message, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # --rollout-batch-size: the one flag slime's own parser requires (the launch checks with it when slime is there)
    assert launch([str(PLUGIN), "--dry-run", "--", "--rollout-batch-size", "8", *flags]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert re.search(message, lines[0]), lines[0]


async def test_generate_refuses_split_with_partial_rollout_at_its_first_sample(
    split_args, tokenizer, engine, search_config
):
    from generate_with_search import generate

    search_config["split_trajectories"] = True
    with pytest.raises(ConfigError, match="--partial-rollout"):
        await generate(split_args(partial_rollout=True), new_sample("generate", tokenizer), slime_sampling_params(64))
    assert engine.calls == []
