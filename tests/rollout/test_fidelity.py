"""Token exactness (support/fidelity.py): what the engine conditioned on is a prefix of sample.tokens, sampled ids
keep mask 1 and the engine's log probs, observations mask 0 and log prob 0.0, observation ids are the canonical
tokenization of their text, stop-string cuts and top-p replay spans follow the tokens, nothing is re-tokenized on
the way to the engine, and a retried sample starts clean."""

import asyncio
import json
import os

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from generate_with_search import generate, reward_func
from slime.utils.types import Sample
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.protocols.chat_template import ChatRenderer
from slime_search_r1.tools.search import SEARCH_SCHEMA
from slime_search_r1.protocols.xml_tags import INFORMATION_CLOSE, INFORMATION_OPEN, information_ids
from slime_search_r1.tools.search import format_documents
from support.episodes import (
    search_failures,
    searches,
    ANSWER_TURN,
    CALL,
    CHAT_ANSWER,
    QUESTION,
    SEARCH_TURN,
    WRONG_TURN,
    chat_messages,
    chat_prompt_ids,
    conversation,
    info,
    rollout,
    run_chat,
    xml_sample,
)
from support.fake_router import RadixCache
from support.fake_sglang import render_openai_messages
from support.fidelity import assert_canonical_observation, assert_faithful
from support.loopback import serve_in_thread
from support.slime_rollout import chat_prompt, router_address, slime_sampling_params

# ---- the invariants on random episodes --------------------------------------------------------------------------

WORDS = ["Paris", "capital", "France", "river", "the", "é", "東京", "🙂", "42", "  ", "\n", "<", ">", "/", "&"]
text = st.lists(st.sampled_from(WORDS), min_size=0, max_size=40).map(" ".join)

turn = st.one_of(
    st.builds(lambda t, q: f"<think>{t}</think>\n<search> {q} </search>", text, text),
    st.builds(lambda t, a: f"<think>{t}</think>\n<answer> {a} </answer>", text, text),
    st.builds(lambda t, a, junk: f"<think>{t}</think><answer>{a}</answer>{junk}", text, text, text),
    st.builds(lambda t, q, junk: f"<search>{q}</search>{junk}<answer>{t}</answer>", text, text, text),
    text,  # no action at all
    st.builds(lambda t: f"{t}<|im_end|> trailing", text),  # EOS in the middle of the turn
    st.builds(lambda n: "<think>" + "long thought " * n + "</think>", st.integers(10, 300)),
)

# Every example runs a whole episode against loopback servers that live as long as the test function.
# FIDELITY_EXAMPLES=500 for a longer search than the suite's.
EPISODES = settings(
    max_examples=int(os.environ.get("FIDELITY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Retrieved text: the model's words plus what makes tokenization boundaries interesting (trailing punctuation
# and newlines that merge with the template's text, and strings that look like special or added tokens).
DOC_WORDS = [*WORDS, "amora.", ".\n", "\n\n", "?!", "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_response>"]
doc_text = st.lists(st.sampled_from(DOC_WORDS), min_size=0, max_size=40).map(" ".join)
docs = st.lists(st.builds(lambda title, body: f'"{title}"\n{body}', text, doc_text), min_size=1, max_size=5)
# The settings space both property tests draw from, so their ranges cannot drift apart.
EPISODE_SETTINGS = dict(
    corpus=docs,
    max_turns=st.integers(1, 4),
    budget=st.integers(1, 700),
    max_obs_tokens=st.integers(16, 200),
    simple_mask=st.booleans(),
    non_canonical=st.booleans(),
)


@EPISODES
@given(
    turns=st.lists(turn, min_size=1, max_size=5),
    log_probs=st.booleans(),
    honor_stops=st.booleans(),
    evaluation=st.booleans(),
    **EPISODE_SETTINGS,
)
def test_random_episodes_are_token_exact(
    make_args,
    tokenizer,
    engine,
    policy,
    retriever,
    search_config,
    turns,
    corpus,
    max_turns,
    budget,
    max_obs_tokens,
    simple_mask,
    log_probs,
    honor_stops,
    evaluation,
    non_canonical,
):
    question = "Where is the thing"
    policy.scripts = {question + "?": turns}
    engine.calls.clear()
    engine.honor_stop_strings = honor_stops
    engine.split_every = 2 if non_canonical else 0
    retriever.docs = [{"id": str(i), "contents": c} for i, c in enumerate(corpus)]
    search_config.update(
        max_turns=max_turns,
        max_obs_tokens=max_obs_tokens,
        loss_mask_mode="simple" if simple_mask else "strict",
        return_logprob=log_probs,
    )
    args = make_args()
    prompt = chat_prompt(tokenizer, question)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    params = slime_sampling_params(budget)

    async def episode():
        try:
            sample = Sample(prompt=prompt, label={"ground_truth": {"target": ["Paris"]}})
            sample = await generate(args, sample, params, evaluation=evaluation)
            reward = await reward_func(args, sample)
            return sample, reward
        finally:
            await close_loop_sessions()

    sample, reward = asyncio.run(episode())
    calls = engine.calls_for(prompt_ids)
    assert_faithful(
        sample,
        calls,
        tokenizer,
        prompt_ids,
        track_log_probs=log_probs,
        train_observations=simple_mask,
        allow_cut=not honor_stops,
        canonical_observations=True,
    )
    assert sample.response_length <= budget
    assert len(calls) <= max_turns
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert 0.0 <= reward <= 1.0
    if evaluation:
        assert reward in (0.0, 1.0)


def tool_call(queries) -> str:
    query = queries[0] if len(queries) == 1 else queries
    # written the way the chat template renders it (router_handler re-renders the model's turns)
    payload = json.dumps({"name": "search", "arguments": {"query": query}}, ensure_ascii=False)
    return "<tool_call>\n" + payload + "\n</tool_call>"


words = st.lists(st.sampled_from(["Paris", "river", "東京", "🙂", "42", "capital"]), min_size=1, max_size=6).map(
    " ".join
)
chat_turn = st.one_of(
    st.builds(lambda t, qs: f"<think>{t}</think>\n{tool_call(qs)}", text, st.lists(words, min_size=1, max_size=3)),
    st.builds(lambda qs: tool_call(qs), st.lists(words, min_size=1, max_size=2)),
    st.builds(lambda t, a: f"<think>{t}</think>\n<answer> {a} </answer>", text, text),
    st.builds(lambda t: f'<tool_call>\n{{"name": "search", "arguments": {{"query": {t}\n</tool_call>', text),
    st.builds(lambda t: f'<tool_call>\n{{"name": "lookup", "arguments": {{"query": "{t}"}}}}\n</tool_call>', words),
    text,
    st.builds(lambda n: "<think>" + "long thought " * n + "</think>", st.integers(10, 300)),
)
MODES = [("chat", "manual"), ("chat", "router_radix"), ("chat", "router_handler"), ("generate", "router_radix")]


@EPISODES
@given(
    mode=st.sampled_from(MODES),
    chat_turns=st.lists(chat_turn, min_size=1, max_size=5),
    xml_turns=st.lists(turn, min_size=1, max_size=5),
    **EPISODE_SETTINGS,
)
def test_random_chat_and_router_episodes_are_token_exact(
    make_args,
    tokenizer,
    engine,
    policy,
    retriever,
    search_config,
    router,
    router_args,
    mode,
    chat_turns,
    xml_turns,
    corpus,
    max_turns,
    budget,
    max_obs_tokens,
    simple_mask,
    non_canonical,
):
    api_mode, tracking = mode
    question = "Where is the thing"
    policy.scripts = {question + "?": chat_turns if api_mode == "chat" else xml_turns}
    engine.calls.clear()
    # A text-keyed cache gives one tokenization per text: two samples that wrote the same text with different
    # tokens would share one. Each example starts with an empty cache so it only holds this episode.
    router.cache = RadixCache(tokenizer)
    # the handler re-renders the model's turns: exact only for the tokenization the template gives back
    engine.split_every = 2 if non_canonical and tracking != "router_handler" else 0
    retriever.docs = [{"id": str(i), "contents": c} for i, c in enumerate(corpus)]
    search_config.update(
        llm_api_mode=api_mode,
        token_tracking_mode=tracking,
        max_turns=max_turns,
        max_obs_tokens=max_obs_tokens,
        loss_mask_mode="simple" if simple_mask else "strict",
    )
    args = make_args() if tracking == "manual" else router_args()
    if api_mode == "chat":
        prompt = chat_messages(question)
        prompt_ids = chat_prompt_ids(tokenizer, prompt)
    else:
        prompt = chat_prompt(tokenizer, question)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)

    async def episode():
        try:
            sample = Sample(prompt=prompt, label={"ground_truth": {"target": ["Paris"]}})
            sample = await generate(args, sample, slime_sampling_params(budget))
            return sample, await reward_func(args, sample)
        finally:
            await close_loop_sessions()

    sample, reward = asyncio.run(episode())
    calls = engine.calls_for(prompt_ids)
    # the router modes take observation ids from the router's cache: only manual mode tokenizes them itself
    canonical = tracking == "manual"
    assert_faithful(
        sample, calls, tokenizer, prompt_ids, train_observations=simple_mask, canonical_observations=canonical
    )
    assert len(calls) <= max_turns
    assert sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert 0.0 <= reward <= 1.0


async def test_many_concurrent_samples_are_each_token_exact_and_scored_alone(
    make_args, tokenizer, engine, policy, retriever, search_config
):
    questions = [f"Which city is number {i}" for i in range(64)]
    for i, question in enumerate(questions):
        turns = [SEARCH_TURN, ANSWER_TURN] if i % 2 else ["no tags here", SEARCH_TURN, WRONG_TURN]
        policy.scripts[question + "?"] = turns
    args = make_args()
    samples = [xml_sample(tokenizer, q) for q in questions]
    results = await asyncio.gather(*(generate(args, s, slime_sampling_params(1024)) for s in samples))
    for i, (question, sample) in enumerate(zip(questions, results, strict=True)):
        prompt_ids = tokenizer.encode(chat_prompt(tokenizer, question), add_special_tokens=False)
        assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
        # odd: right answer, valid format; even: wrong answer after an invalid turn (EOS breaks the format)
        assert await reward_func(args, sample) == (1.0 if i % 2 else pytest.approx(0.1))


# ---- observation ids are the canonical tokenization of their text -----------------------------------------------
# A model deployed behind /v1/chat/completions sees the server tokenize the whole rendered conversation, so tool
# results are trained on in that tokenization, split only at the template's own tokens; retrieved text that merely
# looks like a special token stays text. XML <information> blocks are tokenized whole the same way.

SPECIAL_LOOKALIKES = ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]
PIECES = [
    *SPECIAL_LOOKALIKES,
    "<tool_call>",  # an added but not special token: a server makes it one token, and so do we
    "</tool_response>",
    "amora.",
    ".",
    "\n",
    "\n\n",
    " ",
    "?!",
    "東京",
    "🙂",
    "é",
    "Doc 1(Title: Paris)",
]
content = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(st.characters(exclude_categories=("Cs", "Co")), max_size=12)),
    max_size=12,
).map("".join)
PROPERTY = settings(max_examples=150, deadline=None)


def followup_for(tokenizer, contents: list[str]):
    """(prompt + generated ids, follow-up ids, the whole conversation rendered) for one search turn."""
    messages = chat_messages("Where?")
    renderer = ChatRenderer(tokenizer, [SEARCH_SCHEMA], {}, messages)
    prompt = renderer.render(messages, add_generation_prompt=True)
    turn = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    generated = tokenizer.encode(turn, add_special_tokens=False) + [renderer.end_of_turn_token]
    assistant = {"role": "assistant", "content": turn}
    tools = [
        {"role": "tool", "tool_call_id": f"call_{i}", "name": "search", "content": c} for i, c in enumerate(contents)
    ]
    followup = renderer.followup_ids(messages, tools, generated)
    context = tokenizer.encode(prompt, add_special_tokens=False) + generated
    rendered = renderer.render([*messages, assistant, *tools], add_generation_prompt=True)
    return context, followup, rendered


@PROPERTY
@given(contents=st.lists(content, min_size=1, max_size=3))
@example(contents=["\U0002f800"])  # a CJK compatibility character the tokenizer's NFC normalisation rewrites
def test_tool_results_are_tokenized_as_the_rendered_conversation(tokenizer, contents):
    context, followup, rendered = followup_for(tokenizer, contents)
    # the trajectory's text is the template's render of the conversation, and nothing is re-tokenized before it;
    # as a chat server's, the tokenizer first normalises text (NFC for Qwen2.5: U+2F800 is read as U+4E3D)
    normalizer = tokenizer.backend_tokenizer.normalizer
    assert tokenizer.decode(context + followup, skip_special_tokens=False) == (
        normalizer.normalize_str(rendered) if normalizer else rendered
    )
    assert_canonical_observation(followup, tokenizer)
    if not any(lookalike in c for c in contents for lookalike in SPECIAL_LOOKALIKES):
        # then it is exactly what a chat server's tokenizer makes of the rendered text after the model's turn
        delta = rendered[len(tokenizer.decode(context, skip_special_tokens=False)) :]
        assert followup == tokenizer.encode(delta, add_special_tokens=False)


@PROPERTY
@given(contents=st.lists(content, min_size=1, max_size=3))
def test_text_that_looks_like_a_special_token_stays_text(tokenizer, contents):
    _, followup, _ = followup_for(tokenizer, contents)
    special = {tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_LOOKALIKES}
    without_lookalikes = followup_for(tokenizer, ["plain"] * len(contents))[1]
    # only the template's own markers are special ids, however many look-alikes the results hold
    assert [t for t in followup if t in special] == [t for t in without_lookalikes if t in special]


def test_a_result_ending_in_a_full_stop_merges_with_the_template_newline(tokenizer):
    """The issue's example: '.' then the template's '\\n</tool_response>' is '.\\n', '</' when served."""
    _, followup, _ = followup_for(tokenizer, ["Paris is the capital of France, said Lamorna of Samora."])
    pieces = tokenizer.convert_ids_to_tokens(followup)
    end = pieces.index("</")
    assert pieces[end - 1] == ".Ċ"  # not ".", "Ċ" as tokenizing the result on its own gives


information_docs = st.lists(content.map(lambda text: f'"Title"\n{text}'), min_size=1, max_size=4)


class CountedCuts:
    """The tokenizer, with every decode counted: information_ids decodes once per attempt at the cut, and each attempt
    keeps at least one token fewer, so more attempts than `limit` is an endless loop; it fails there, at once."""

    def __init__(self, tokenizer, limit: int):
        self.tokenizer, self.limit, self.attempts = tokenizer, limit, 0

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def decode(self, *args, **kwargs):
        self.attempts += 1
        assert self.attempts <= self.limit, f"the observation cut did not end after {self.limit} attempts"
        return self.tokenizer.decode(*args, **kwargs)


def cut_information(tokenizer, contents: list[str], max_tokens: int) -> tuple[list[int], bool]:
    """information_ids on these passages, stopped at once if it tries more cuts than there are tokens to drop."""
    return information_ids(
        CountedCuts(tokenizer, limit=max_tokens + 1), format_documents([{"contents": c} for c in contents]).strip(),
        max_tokens,
    )  # fmt: skip


def test_the_observation_cut_ends_at_every_budget_including_an_exact_fit(tokenizer):
    # every budget from the tags alone to the whole block: the cut block fills most of them exactly, the case a
    # `<` for `<=` would retry forever; text in several scripts and special-token look-alikes move the boundaries
    contents = [
        "Paris is the capital and most populous city of France. " * 2,
        "東京は日本の首都です。🙂🇫🇷👨‍👩‍👧 é amora.\n\n<|im_end|></information>?!",
    ]
    whole, _ = information_ids(tokenizer, format_documents([{"contents": c} for c in contents]).strip(), 10**6)
    tags = len(tokenizer.encode(INFORMATION_OPEN + INFORMATION_CLOSE, add_special_tokens=False))
    exact = 0
    for max_tokens in range(tags + 1, len(whole)):
        ids, cut = cut_information(tokenizer, contents, max_tokens)
        assert cut and len(ids) <= max_tokens
        exact += len(ids) == max_tokens
    assert exact > (len(whole) - tags) // 2  # the exact fit was tried, many times


@PROPERTY
@given(contents=information_docs, max_tokens=st.integers(16, 120))
def test_information_blocks_are_tokenized_whole_even_when_cut(tokenizer, contents, max_tokens):
    ids, _ = cut_information(tokenizer, contents, max_tokens)
    assert len(ids) <= max_tokens
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(INFORMATION_OPEN)
    assert text.endswith(INFORMATION_CLOSE)
    assert ids == tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


async def test_a_chat_episode_is_the_template_s_own_render_of_its_conversation_token_for_token(
    make_args, tokenizer, engine, policy, search_config
):
    # With a canonical tool call, the exact trajectory equals the template's own render of the conversation.
    policy.scripts[QUESTION + "?"] = [CALL, CHAT_ANSWER]
    sample = await run_chat(make_args(), search_config, "chat")
    messages = sample.prompt + conversation(sample)
    rendered = render_openai_messages(tokenizer, messages, [SEARCH_SCHEMA], False)
    assert tokenizer.decode(sample.tokens) + "\n" == rendered
    # token for token too: the tool message is tokenized as a chat server tokenizes the rendered conversation
    # (the result's last "." and the template's "\n" merge into one token, as they do when served)
    assert sample.tokens + tokenizer.encode("\n") == tokenizer.encode(rendered, add_special_tokens=False)


# ---- stop strings: a turn is cut after its stop string, never inside a sampled token ----------------------------


async def test_tokens_sampled_past_a_stop_string_are_cut(make_args, tokenizer, engine, policy, search_config):
    engine.honor_stop_strings = False  # an engine that runs on after </search>
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN + " and then <answer> Rome </answer> junk", ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    calls = engine.calls_for(prompt_ids)
    assert "junk" in tokenizer.decode(calls[0].output_ids)
    assert "Rome" not in sample.response
    assert "junk" not in sample.response
    assert sample.response.startswith(SEARCH_TURN + "\n\n<information>")
    assert sample.status == Sample.Status.COMPLETED
    assert_faithful(sample, calls, tokenizer, prompt_ids, allow_cut=True)
    kept = len(tokenizer.encode(SEARCH_TURN))  # the turn ends in "</search>": its own tokenization is the cut
    assert sample.tokens[len(prompt_ids) : len(prompt_ids) + kept] == calls[0].output_ids[:kept]
    assert kept < len(calls[0].output_ids)


async def test_a_turn_cut_after_its_stop_string_keeps_the_log_probs_of_exactly_the_tokens_it_keeps(
    make_args, tokenizer, engine, policy, search_config
):
    engine.honor_stop_strings = False  # it samples on after </search>; the turn is cut after the tag
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN + " and then <answer> Rome </answer> junk", ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    first, second = engine.calls_for(prompt_ids)
    kept = len(tokenizer.encode(SEARCH_TURN))  # "</search>" ends in a token of its own here
    observation = len(second.input_ids) - len(prompt_ids) - kept
    answer = len(second.output_ids) - 1  # cut after </answer> too: the EOS sampled after it is dropped
    assert kept < len(first.output_ids) and observation > 0
    # position by position: the engine's log prob of each kept token, 0.0 for the observation, then the next turn's
    assert sample.rollout_log_probs == first.log_probs[:kept] + [0.0] * observation + second.log_probs[:answer]
    assert sample.loss_mask == [1] * kept + [0] * observation + [1] * answer
    assert sample.tokens == second.input_ids + second.output_ids[:answer]
    assert second.input_ids[len(prompt_ids) : len(prompt_ids) + kept] == first.output_ids[:kept]


async def test_text_after_the_closing_tag_in_the_same_token_is_kept_and_costs_format(
    make_args, tokenizer, engine, policy, search_config
):
    # "</answer>." ends in the token ">." : the engine stops there and that token is what was sampled.
    policy.scripts[QUESTION + "?"] = ["<think>Easy.</think>\n<answer> Paris </answer>. And then I kept writing."]
    args, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert sample.status == Sample.Status.COMPLETED
    assert sample.response.endswith("</answer>.")
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
    assert await reward_func(args, sample) == pytest.approx(0.8)  # correct, format invalid


# ---- the loss mask and the log probs ----------------------------------------------------------------------------


async def test_the_simple_loss_mask_trains_observations(
    make_args, tokenizer, engine, policy, search_config, monkeypatch
):
    monkeypatch.setitem(search_config, "loss_mask_mode", "simple")
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert set(sample.loss_mask) == {1}
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids, train_observations=True)


async def test_the_strict_loss_mask_masks_observations(make_args, tokenizer, engine, policy, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    _, sample, _ = await rollout(make_args, tokenizer)
    assert 0 in sample.loss_mask, "no observation position is masked"
    assert 1 in sample.loss_mask, "no sampled position is trained"
    assert sum(sample.loss_mask) < sample.response_length


async def test_without_log_probs_none_are_asked_for_or_recorded(
    make_args, tokenizer, engine, policy, search_config, monkeypatch
):
    monkeypatch.setitem(search_config, "return_logprob", False)
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    args, sample, prompt_ids = await rollout(make_args, tokenizer)
    calls = engine.calls_for(prompt_ids)
    assert not any(c.return_logprob for c in calls)
    assert sample.rollout_log_probs is None
    assert_faithful(sample, calls, tokenizer, prompt_ids, track_log_probs=False)
    assert await reward_func(args, sample) == 1.0


# ---- top-p replay spans -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["list", "base64"])
async def test_top_p_replay_spans_follow_the_tokens_even_when_cut(
    make_args, tokenizer, engine, policy, search_config, encoding
):
    engine.top_p_replay = encoding
    engine.honor_stop_strings = False  # the first turn is cut after </search>: its spans are cut with it
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN + " and more text after the tag", ANSWER_TURN]
    _, sample, prompt_ids = await rollout(make_args, tokenizer, rollout_top_p=0.9)
    # slime keeps the replay arrays as torch int32 tensors
    assert sample.rollout_top_p_token_ids.dtype == torch.int32
    assert sample.rollout_top_p_token_offsets.dtype == torch.int32
    offsets, ids = sample.rollout_top_p_token_offsets.tolist(), sample.rollout_top_p_token_ids.tolist()
    assert len(offsets) == sample.response_length + 1
    assert offsets[-1] == len(ids)
    response = sample.tokens[len(prompt_ids) :]
    for position, token in enumerate(response):
        kept = ids[offsets[position] : offsets[position + 1]]
        if sample.loss_mask[position]:
            assert kept[0] == token, f"the sampled token at {position} does not lead its own nucleus"
        else:
            assert kept == [], f"observation token at {position} has a nucleus"


# ---- nothing is re-tokenized on the way to the engine -----------------------------------------------------------


async def test_a_proxy_that_rewrites_input_ids_is_caught(make_args, tokenizer, engine, search_config):
    import httpx
    from fastapi import FastAPI, Request

    proxy = FastAPI()

    @proxy.post("/generate")
    async def rewrite(request: Request):
        body = await request.json()
        body["input_ids"] = body["input_ids"][:-1]  # e.g. a middleware that re-tokenizes the decoded text
        async with httpx.AsyncClient() as client:
            return (await client.post(engine.url + "/generate", json=body)).json()

    with serve_in_thread(proxy) as url:
        _, sample, _ = await rollout(lambda **kw: make_args(**router_address(url), **kw), tokenizer)
    # the episode ends FAILED, nothing trained from the answer, the reason in its record
    assert sample.status == Sample.Status.FAILED and sample.response_length == 0
    assert info(sample)["finish_reason"] == "engine_error"
    assert "rewrote or truncated input_ids" in info(sample)["engine_error"]


# ---- a retried sample starts clean ------------------------------------------------------------------------------


async def test_a_retried_sample_starts_clean(make_args, tokenizer, engine, policy, retriever, search_config):
    policy.scripts[QUESTION + "?"] = [SEARCH_TURN, ANSWER_TURN]
    retriever.down = True
    args, sample, prompt_ids = await rollout(make_args, tokenizer)
    assert sample.status == Sample.Status.FAILED
    sample.reward = 0.0
    sample.metadata["user_key"] = "kept"

    retriever.down = False
    engine.calls.clear()
    _, again, _ = await rollout(make_args, tokenizer, sample=sample)
    assert again is sample
    assert sample.status == Sample.Status.COMPLETED
    assert sample.remove_sample is False
    assert sample.reward is None
    assert search_failures(sample) == 0
    assert searches(sample) == 1
    assert sample.metadata["user_key"] == "kept"
    calls = engine.calls_for(prompt_ids)  # slime's per-sample prefix-cache counters count this run only
    assert sample.prefix_cache_info.total_prompt_tokens == sum(len(c.input_ids) for c in calls)
    assert_faithful(sample, engine.calls_for(prompt_ids), tokenizer, prompt_ids)
