"""Scripted episodes shared by the rollout tests: the question, what the model writes in each protocol, the labels,
and the runners that hand a sample to generate() the way slime does.

XML mode (LLM_API_MODE=generate): the prompt is the chat-templated string slime builds with --apply-chat-template.
Chat mode: the prompt is the messages, with the search tool in sample.metadata["tools"] (--tool-key tools).
"""

import copy
from dataclasses import dataclass

from generate_with_search import generate
from slime.utils.types import Sample
from slime_search_r1.data import CHAT_SYSTEM_PROMPT, chat_question
from slime_search_r1.tools.search import SEARCH, SEARCH_SCHEMA
from support.slime_rollout import chat_prompt, slime_sampling_params

QUESTION = "What is the capital of France"

# The tools when only Search-R1's search is enabled (the default), for the reading and scoring functions.
SEARCH_ONLY = {"search": SEARCH}
# Search-R1's invalid-action message, word for word (search_r1/llm_agent/generation.py), for tests to compare with.
SEARCH_R1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)

# ---- what the model writes in XML mode --------------------------------------------------------------------------
SEARCH_TURN = "<think>I need to look this up.</think>\n<search> capital of France </search>"
ANSWER_TURN = "<think>The documents say Paris.</think>\n<answer> Paris </answer>"
WRONG_TURN = "<think>The documents say Berlin.</think>\n<answer> Berlin </answer>"
NO_ACTION_TURN = "I think it is Paris."
LONG_THOUGHT = "<think>" + " ".join(f"step {i} of my reasoning." for i in range(200)) + "</think>"

# ---- what the model writes in chat mode -------------------------------------------------------------------------
CALL = (
    "<think>I should search.</think>\n"
    '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'
)
BARE_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n</tool_call>'
CALL_TWO = '<tool_call>\n{"name": "search", "arguments": {"query": ["capital of France", "Berlin"]}}\n</tool_call>'
CALL_BERLIN = '<tool_call>\n{"name": "search", "arguments": {"query": "Berlin"}}\n</tool_call>'
CHAT_ANSWER = "<think>The passage says Paris.</think>\n<answer> Paris </answer>"
CHAT_WRONG = "<think>Maybe Berlin.</think>\n<answer> Berlin </answer>"
MALFORMED = '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>'
WRONG_TOOL = '<tool_call>\n{"name": "lookup", "arguments": {"query": "France"}}\n</tool_call>'
INVENTED_RESPONSE = CALL + "\n<tool_response>\nParis is the capital of France.\n</tool_response>"

# Two searches, then the answer: the episode the partial-rollout and fully-async tests interrupt anywhere.
TWO_SEARCHES_THEN_ANSWER = {
    "generate": [
        "<think>I need to look this up first.</think>\n<search> capital of France </search>",
        "<think>Paris is the capital, but let me check once more.</think>\n"
        "<search> Paris France capital city </search>",
        "<think>The documents agree: Paris.</think>\n<answer> Paris </answer>",
    ],
    "chat": [
        '<think>Look it up.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "capital of France"}}\n'
        "</tool_call>",
        '<tool_call>\n{"name": "search", "arguments": {"query": "Paris France capital city"}}\n</tool_call>',
        "<think>The documents agree: Paris.</think>\n<answer> Paris </answer>",
    ],
}

# The two protocols side by side, for tests that hold in both: LLM_API_MODE -> what the model writes.
MODES = ["generate", "chat"]
MODE_IDS = ["xml", "chat"]
SEARCH = {"generate": SEARCH_TURN, "chat": CALL}
ANSWER = {"generate": ANSWER_TURN, "chat": CHAT_ANSWER}
WRONG = {"generate": WRONG_TURN, "chat": CHAT_WRONG}

# The labels slime hands over: Search-R1's reward_model column (XML tests) and the chat tests' shorter form.
CHAT_LABEL = {"ground_truth": {"target": ["Paris"]}}


def label(*answers: str) -> dict:
    return {"style": "rule", "ground_truth": {"target": list(answers)}}


def info(sample: Sample) -> dict:
    """The plugin's per-sample record."""
    return sample.metadata["search_r1"]


def searches(sample: Sample) -> int:
    """Search calls that returned results."""
    return info(sample)["tools"].get("search", {}).get("calls", 0)


def search_failures(sample: Sample) -> int:
    return info(sample)["tools"].get("search", {}).get("failures", 0)


def search_seconds(sample: Sample) -> list[float]:
    """Each search call's latency, failed ones included."""
    return info(sample)["tools"].get("search", {}).get("seconds", [])


def conversation(sample: Sample) -> list[dict]:
    """Chat mode: the episode's turns as OpenAI messages."""
    return info(sample)["conversation"]


def chat_messages(question: str = QUESTION) -> list[dict]:
    return [{"role": "system", "content": CHAT_SYSTEM_PROMPT}, {"role": "user", "content": chat_question(question)}]


def chat_sample(question: str = QUESTION) -> Sample:
    return Sample(prompt=chat_messages(question), label=CHAT_LABEL, metadata={"tools": [copy.deepcopy(SEARCH_SCHEMA)]})


def xml_sample(tokenizer, question: str = QUESTION, **fields) -> Sample:
    return Sample(prompt=chat_prompt(tokenizer, question), label=label("Paris"), **fields)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids of a chat-mode prompt: the messages rendered with the search tool and the generation prompt."""
    text = tokenizer.apply_chat_template(messages, tools=[SEARCH_SCHEMA], tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def sample_for(mode: str, tokenizer, question: str = QUESTION) -> tuple[Sample, list[int]]:
    """A fresh sample of `mode` for `question`, and the prompt ids the engine's calls for it start with."""
    if mode == "chat":
        sample = chat_sample(question)
        return sample, chat_prompt_ids(tokenizer, sample.prompt)
    sample = xml_sample(tokenizer, question)
    return sample, tokenizer.encode(sample.prompt, add_special_tokens=False)


async def rollout(
    make_args, tokenizer, *, max_new_tokens=1024, evaluation=False, sample=None, question=QUESTION, **overrides
):
    """One XML-mode episode: slime args from make_args(**overrides), the question's chat-templated prompt (or
    `sample`). Returns (args, sample, the prompt's ids)."""
    args = make_args(**overrides)
    prompt = chat_prompt(tokenizer, question)
    sample = sample or Sample(prompt=prompt, label=label("Paris"))
    out = await generate(args, sample, slime_sampling_params(max_new_tokens), evaluation=evaluation)
    return args, out, tokenizer.encode(prompt, add_special_tokens=False)


async def run_chat(args, config, mode, *, tracking="manual", sample=None, evaluation=False, budget=1024):
    """One episode with LLM_API_MODE=`mode` and TOKEN_TRACKING_MODE=`tracking` (a chat sample unless given)."""
    config.update(llm_api_mode=mode, token_tracking_mode=tracking)
    sample = sample or chat_sample()
    return await generate(args, sample, slime_sampling_params(budget), evaluation=evaluation)


@dataclass
class Episode:
    args: object
    sample: Sample
    prompt_ids: list[int]


async def run_episode(
    mode, make_args, tokenizer, config, *, budget=1024, evaluation=False, question=QUESTION, **overrides
) -> Episode:
    """One episode of `mode` ("generate": XML, or "chat") over the manual driver; the policy's script is the test's."""
    sample, prompt_ids = sample_for(mode, tokenizer, question)
    args = make_args(**overrides)
    sample = await run_chat(args, config, mode, sample=sample, evaluation=evaluation, budget=budget)
    return Episode(args, sample, prompt_ids)
