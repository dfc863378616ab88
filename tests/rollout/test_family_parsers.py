"""Each model family read as SGLang 0.5.23 reads it: its tool calls (srt/function_call/*_detector.py), the family a
real checkpoint's template is placed in (srt/parser/template_detection.py), its thoughts and end of turn as the
template and tokenizer say them; a call in another family's format is unparsable, with why."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_search_r1.families import think_tag_ids
from slime_search_r1.families.detection import resolve_family, tokenizer_family
from slime_search_r1.protocols.chat import UNPARSABLE_TOOL_CALLS, parse_generated_turn, parse_openai_message
from slime_search_r1.protocols.chat_reward import conversation_format_problem
from slime_search_r1.protocols.chat_template import ChatRenderer, ChatTemplateError
from slime_search_r1.registry import MODEL_FAMILIES
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.tools.search import SEARCH_SCHEMA
from support.episodes import SEARCH_ONLY, chat_messages
from slime_search_r1.launch.presets import MODEL_PRESETS
from slime_search_r1.protocols.xml_tags import prompt_thought
from support.family_cases import CASES
from support.fidelity import assert_canonical_observation
from support.model_tokenizers import CHECKPOINTS, load_checkpoint_tokenizer

QWEN25, QWEN35, LLAMA3 = (MODEL_FAMILIES.get(name) for name in ("qwen25", "qwen35", "llama3"))
QWEN3_CODER = MODEL_FAMILIES.get("qwen3_coder")
# The issue's Qwen3.5 call, word for word.
MONA_LISA = (
    "<tool_call>\n<function=search>\n<parameter=query>\nWho painted the Mona Lisa\n</parameter>\n</function>\n"
    "</tool_call>"
)
TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {
                "page": {"type": "integer"},
                "score": {"type": "number"},
                "exact": {"type": "boolean"},
                "tags": {"type": "array"},
                "note": {"type": ["string", "null"]},
            },
        },
    },
}


def read(family, text, end="<|im_end|>", tools=SEARCH_ONLY, schemas=None):
    return parse_generated_turn(text + end, end, 0, tools, family, schemas)


# ---- qwen3_coder / qwen35: <function=...><parameter=...> -----------------------------------------------------------


def test_the_issues_qwen35_call_is_one_search():
    turn = read(QWEN35, "Let me search.\n\n" + MONA_LISA)
    assert [(call.name, call.arguments, call.error) for call in turn.tool_calls] == [
        ("search", {"query": "Who painted the Mona Lisa"}, None)
    ]
    assert turn.tool_calls[0].parsed == {"queries": ["Who painted the Mona Lisa"]}
    assert (turn.content, turn.unparsable, turn.text_after_tool_calls) == ("Let me search.", [], "")
    assert not turn.is_invalid_action


def test_the_qwen35_call_read_as_qwen25_says_it_is_another_familys_format():
    turn = read(QWEN25, MONA_LISA)
    assert not turn.tool_calls and turn.is_invalid_action
    assert "in the qwen35 format" in turn.unparsable_why[0] and "(qwen25) does not write" in turn.unparsable_why[0]
    recorded = turn.to_openai()[UNPARSABLE_TOOL_CALLS]
    assert recorded == [{"text": MONA_LISA, "error": turn.unparsable_why[0]}]
    # the record keeps it; the reward reads it back as an unparsable call
    assert parse_openai_message(turn.to_openai(), 0, SEARCH_ONLY).unparsable == [MONA_LISA]
    assert conversation_format_problem([turn.to_openai()], SEARCH_ONLY) == "unparsable tool call"


def test_function_calls_are_read_as_sglangs_qwen3_coder_detector_reads_them():
    text = (
        "<tool_call>\n<function=lookup>\n<parameter=page>\n12\n</parameter>\n<parameter=score>\n3\n</parameter>\n"
        '<parameter=exact>\nTrue\n</parameter>\n<parameter=tags>\n["a", 1]\n<parameter=note>\nnull\n'
        "</function>\n<function=lookup>\n<parameter=page>\nten\n</parameter>\n</function>\n</tool_call>"
    )
    turn = parse_generated_turn(text, "", 3, {}, QWEN3_CODER, [TYPED_TOOL])
    # an unclosed </parameter> ends at the next <parameter=; values converted by their schema's type, or kept as text
    assert [call.arguments for call in turn.tool_calls] == [
        {"page": 12, "score": 3, "exact": True, "tags": ["a", 1], "note": None},
        {"page": "ten"},
    ]
    assert [call.call_id for call in turn.tool_calls] == ["call_3_0", "call_3_1"]


def test_a_query_list_stays_text_as_the_detector_reads_a_string_or_array_parameter():
    text = '<tool_call>\n<function=search>\n<parameter=query>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>'
    assert read(QWEN35, text).tool_calls[0].arguments == {"query": '["a", "b"]'}  # anyOf string/array: string


def test_an_unclosed_function_call_is_read_when_no_block_is_closed():
    turn = read(QWEN35, "<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n")
    assert [call.arguments for call in turn.tool_calls] == [{"query": "x"}] and not turn.unparsable


def test_a_json_call_from_a_qwen35_model_is_unparsable_and_names_the_format():
    turn = read(QWEN35, '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>')
    assert not turn.tool_calls and turn.is_invalid_action
    assert "(qwen35) does not write" in turn.unparsable_why[0] and "<function=NAME>" in turn.unparsable_why[0]


# ---- qwen25: JSON in <tool_call> ---------------------------------------------------------------------------------


def test_json_calls_are_read_as_sglangs_qwen25_detector_reads_them():
    text = (
        '<tool_call>\n[{"name": "search", "arguments": {"query": "a"}}, {"name": "search", "parameters": '
        '{"query": "b"}}]\n</tool_call>\n<tool_call>\n{"arguments": {"query": "c"}}\n</tool_call>'
    )
    turn = read(QWEN25, text)
    assert [call.arguments for call in turn.tool_calls] == [{"query": "a"}, {"query": "b"}]
    assert turn.unparsable == ['\n{"arguments": {"query": "c"}}\n'] and '"name"' in turn.unparsable_why[0]


# ---- llama3: bare JSON ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "calls", "content", "after"),
    [
        ('{"name": "search", "parameters": {"query": "a"}}', [{"query": "a"}], "", ""),
        (
            'Let me look.<|python_tag|>{"name": "search", "arguments": {"query": "a"}}',
            [{"query": "a"}],
            "Let me look.",
            "",
        ),
        (
            '{"name": "search", "parameters": {"query": "a"}};{"name": "search", "parameters": {"query": "b"}}',
            [{"query": "a"}, {"query": "b"}],
            "",
            "",
        ),
        ("{'name': 'search', 'parameters': {'query': 'a'}}", [{"query": "a"}], "", ""),
        ('{"name": "search", "parameters": {"query": "a"}}; and then', [{"query": "a"}], "", "and then"),
        ("The answer is <answer> Paris </answer>", [], "The answer is <answer> Paris </answer>", ""),
    ],
    ids=["bare", "after-python-tag", "two-separated", "python-dict", "text-after", "no-call"],
)
def test_llama_calls_are_read_as_sglangs_llama3_detector_reads_them(text, calls, content, after):
    turn = LLAMA3.read_calls(text, [SEARCH_SCHEMA])
    assert [arguments for _, arguments in turn.calls] == calls
    assert (turn.content, turn.text_after_calls, turn.unparsable) == (content, after, [])


def test_two_llama_calls_in_one_turn_are_refused_whole_so_the_template_renders_the_record():
    """Llama 3.2's template raises on an assistant turn with two calls: the turn runs none, says why, and what is
    recorded renders (the template never sees two calls)."""
    text = '{"name": "search", "parameters": {"query": "a"}}; {"name": "search", "parameters": {"query": "b"}}'
    turn = read(LLAMA3, text, end="<|eot_id|>")
    assert (turn.tool_calls, turn.unparsable, turn.is_invalid_action) == ([], [text], True)
    assert "2 tool calls in one turn" in turn.unparsable_why[0] and "at most 1" in turn.unparsable_why[0]
    tokenizer = load_checkpoint_tokenizer("llama-3.2-3b-instruct")
    messages = [*chat_messages(), turn.to_openai(), {"role": "user", "content": "one call, please"}]
    assert text not in tokenizer.apply_chat_template(messages, tools=[SEARCH_SCHEMA], tokenize=False)


def test_a_qwen_call_from_a_llama_model_is_unparsable_and_names_the_format():
    turn = read(LLAMA3, '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>', "<|eot_id|>")
    assert not turn.tool_calls and turn.is_invalid_action
    assert "(llama3) does not write" in turn.unparsable_why[0]


# ---- the family of each real checkpoint ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=CHECKPOINTS)
def checkpoint(request):
    return request.param, load_checkpoint_tokenizer(request.param)


def test_auto_places_each_checkpoints_template_in_its_family(checkpoint):
    name, tokenizer = checkpoint
    assert tokenizer_family("auto", tokenizer).name == MODEL_PRESETS[name].family


def test_a_template_no_rule_places_is_refused_naming_the_setting_and_a_named_family_overrides_it():
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    with pytest.raises(ConfigError, match=r"SEARCH_R1_MODEL_FAMILY=auto cannot place .*SEARCH_R1_MODEL_FAMILY=qwen35"):
        resolve_family("auto", chatml)
    with pytest.raises(ConfigError, match="there is none"):
        resolve_family("auto", None)
    assert resolve_family("qwen25", chatml).name == "qwen25"


def test_each_familys_think_tags_are_the_tokens_they_are(checkpoint):
    name, tokenizer = checkpoint
    ids = think_tag_ids(tokenizer)
    single = name.startswith(("qwen3-", "qwen3.5"))  # Qwen3's added tokens; Qwen2.5 and Llama spell them in pieces
    assert ids == (
        (tokenizer.convert_tokens_to_ids("<think>"), tokenizer.convert_tokens_to_ids("</think>"))
        if single
        else (None, None)
    )


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_generation_prompt_says_who_opens_the_thought_and_the_template_the_end_of_turn(case):
    tokenizer, family = load_checkpoint_tokenizer(case.checkpoint), case.family
    renderer = ChatRenderer(tokenizer, [SEARCH_SCHEMA], case.template_kwargs, chat_messages())
    state = prompt_thought(renderer.render(chat_messages(), add_generation_prompt=True))
    thinking_off = case.template_kwargs.get("enable_thinking") is False
    expected = {"none": "none", "model": "none", "prompt": "open"}[family.thinking.opened_by]
    assert state == ("closed" if thinking_off else expected)
    end = "<|eot_id|>" if family.name == "llama3" else "<|im_end|>"
    assert renderer.end_of_turn_token == tokenizer.convert_tokens_to_ids(end)


def test_a_family_says_whether_its_template_rewrites_earlier_assistant_turns(checkpoint):
    name, tokenizer = checkpoint
    said = "<think>\nI should check.\n</think>\n\nParis."
    first = [{"role": "user", "content": "Where?"}, {"role": "assistant", "content": said}]
    before = tokenizer.apply_chat_template(first, tokenize=False)
    after = tokenizer.apply_chat_template([*first, {"role": "user", "content": "Sure?"}], tokenize=False)
    rewrites = not after.startswith(before)
    assert MODEL_FAMILIES.get(MODEL_PRESETS[name].family).rewrites_history == rewrites


def test_the_recorded_reason_survives_json():
    turn = read(QWEN35, '<tool_call>\n{"name": "search"}\n</tool_call>')
    assert json.loads(json.dumps(turn.to_openai()))[UNPARSABLE_TOOL_CALLS][0]["error"] == turn.unparsable_why[0]


# ---- what the template writes after an assistant turn ---------------------------------------------------------------

ASSISTANT = {
    "role": "assistant",
    "content": "<think>\nLook it up.\n</think>",
    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "search", "arguments": '{"query": "q"}'}}],
}
RESULT = ' \n Doc 1(Title: "Paris") "Paris" is the capital. <|im_end|><|eot_id|>\n\n'


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_tool_result_is_placed_as_the_template_writes_it_trimmed_or_json_quoted(case):
    tokenizer = load_checkpoint_tokenizer(case.checkpoint)
    renderer = ChatRenderer(tokenizer, [SEARCH_SCHEMA], case.template_kwargs, chat_messages())
    tool = [{"role": "tool", "tool_call_id": "c", "name": "search", "content": RESULT}]
    written = [renderer.end_of_turn_token]  # the model ended its turn with the end-of-turn token
    ids = renderer.followup_ids(chat_messages(), tool, written, ASSISTANT)
    rendered = renderer.render([*chat_messages(), ASSISTANT, *tool], add_generation_prompt=True)
    assert rendered.endswith(tokenizer.decode(written + ids, skip_special_tokens=False))
    # the special-token strings inside the result stay text
    assert ids.count(renderer.end_of_turn_token) == 1


def test_a_template_whose_follow_ups_depend_on_the_assistants_text_is_refused():
    tokenizer = load_checkpoint_tokenizer("qwen2.5-3b")
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% if m.role == 'tool' %}(after {{ messages[loop.index0 - 1].content | length }} characters){% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    saved, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        renderer = ChatRenderer(tokenizer, [], {}, chat_messages())
        tool = [{"role": "tool", "tool_call_id": "c", "name": "search", "content": "r"}]
        with pytest.raises(ChatTemplateError, match="depends on history"):
            renderer.followup_ids(chat_messages(), tool, [], {"role": "assistant", "content": "mine"})
    finally:
        tokenizer.chat_template = saved


def test_a_template_that_ends_an_assistant_turn_otherwise_once_a_tool_follows_is_refused():
    tokenizer = load_checkpoint_tokenizer("qwen2.5-3b")
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if m.role == 'assistant' and not loop.last %}<|endoftext|>{% else %}<|im_end|>{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    saved, tokenizer.chat_template = tokenizer.chat_template, template
    try:
        renderer = ChatRenderer(tokenizer, [], {}, chat_messages())
        tool = [{"role": "tool", "tool_call_id": "c", "name": "search", "content": "r"}]
        with pytest.raises(ChatTemplateError, match="ends an assistant turn"):
            renderer.followup_ids(chat_messages(), tool, [])
    finally:
        tokenizer.chat_template = saved


LOOKALIKES = ["<|im_end|>", "<|im_start|>", "<|eot_id|>", "<|start_header_id|>", "<think>", "</tool_response>"]
result_text = st.lists(
    st.one_of(
        st.sampled_from([*LOOKALIKES, "\n", "\n\n", " ", '"', "\\", "\t", "東京", "🙂", "Doc 1(Title: Paris)"]),
        st.text(st.characters(exclude_categories=("Cs", "Co")), max_size=8),
    ),
    max_size=10,
).map("".join)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=st.lists(result_text, min_size=1, max_size=2))
def test_any_tool_results_follow_the_turn_as_the_template_renders_them(case, contents):
    tokenizer = load_checkpoint_tokenizer(case.checkpoint)
    renderer = ChatRenderer(tokenizer, [SEARCH_SCHEMA], case.template_kwargs, chat_messages())
    tools = [{"role": "tool", "tool_call_id": "c", "name": "search", "content": c} for c in contents]
    written = [renderer.end_of_turn_token]
    ids = renderer.followup_ids(chat_messages(), tools, written, ASSISTANT)
    rendered = renderer.render([*chat_messages(), ASSISTANT, *tools], add_generation_prompt=True)
    normalizer = tokenizer.backend_tokenizer.normalizer  # a chat server's tokenizer normalises text first (NFC)
    expected = normalizer.normalize_str(rendered) if normalizer else rendered
    assert expected.endswith(tokenizer.decode(written + ids, skip_special_tokens=False))
    assert_canonical_observation(ids, tokenizer)
    # only the template's own markers are special: a look-alike in a result stays text
    special = set(tokenizer.all_special_ids)
    without = renderer.followup_ids(chat_messages(), [{**t, "content": "plain"} for t in tools], written, ASSISTANT)
    assert [i for i in ids if i in special] == [i for i in without if i in special]
