"""Property test: random scripted episodes under random settings always give a token-exact trajectory."""

import asyncio
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import chat_prompt, slime_sampling_params
from generate_with_search import generate, reward_func
from slime_search_r1.http import close_loop_sessions
from slime.utils.types import Sample
from support.fidelity import assert_faithful

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


# ---- chat mode and the router token-tracking modes -----------------------------------------------------------


def tool_call(queries) -> str:
    import json

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
    from slime_search_r1.data import CHAT_SYSTEM_PROMPT, chat_question
    from slime_search_r1.protocols.tools import SEARCH_SCHEMA
    from support.fake_router import RadixCache

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
        prompt = [
            {"role": "system", "content": CHAT_SYSTEM_PROMPT},
            {"role": "user", "content": chat_question(question)},
        ]
        text = tokenizer.apply_chat_template(prompt, tools=[SEARCH_SCHEMA], tokenize=False, add_generation_prompt=True)
    else:
        prompt = text = chat_prompt(tokenizer, question)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)

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
