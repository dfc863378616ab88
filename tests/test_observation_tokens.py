"""Observation ids are what a served model meets: the canonical tokenization of the rendered text.

A model deployed behind /v1/chat/completions sees the server tokenize the whole rendered conversation, so
tool results are trained on in that tokenization, split only at the template's own tokens; retrieved text
that merely looks like a special token stays text. XML <information> blocks are tokenized whole the same way.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from slime_search_r1.protocols.chat_template import ChatRenderer
from slime_search_r1.data import CHAT_SYSTEM_PROMPT, chat_question
from slime_search_r1.protocols.tools import SEARCH_SCHEMA
from slime_search_r1.protocols.xml import information_ids
from slime_search_r1.search.results import format_documents
from support.fidelity import assert_canonical_observation
from slime_search_r1.protocols.xml import INFORMATION_CLOSE, INFORMATION_OPEN

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


def prompt_messages():
    return [{"role": "system", "content": CHAT_SYSTEM_PROMPT}, {"role": "user", "content": chat_question("Where?")}]


def followup_for(tokenizer, contents: list[str]):
    """(prompt + generated ids, follow-up ids, the whole conversation rendered) for one search turn."""
    renderer = ChatRenderer(tokenizer, [SEARCH_SCHEMA], {}, prompt_messages())
    prompt = renderer.render(prompt_messages(), add_generation_prompt=True)
    turn = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>'
    generated = tokenizer.encode(turn, add_special_tokens=False) + [renderer.end_of_turn_token]
    assistant = {"role": "assistant", "content": turn}
    tools = [
        {"role": "tool", "tool_call_id": f"call_{i}", "name": "search", "content": c} for i, c in enumerate(contents)
    ]
    followup = renderer.followup_ids(prompt_messages(), tools, generated)
    context = tokenizer.encode(prompt, add_special_tokens=False) + generated
    rendered = renderer.render([*prompt_messages(), assistant, *tools], add_generation_prompt=True)
    return context, followup, rendered


@PROPERTY
@given(contents=st.lists(content, min_size=1, max_size=3))
def test_tool_results_are_tokenized_as_the_rendered_conversation(tokenizer, contents):
    context, followup, rendered = followup_for(tokenizer, contents)
    # the trajectory's text is the template's render of the conversation, and nothing is re-tokenized before it
    assert tokenizer.decode(context + followup, skip_special_tokens=False) == rendered
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


docs = st.lists(content.map(lambda text: f'"Title"\n{text}'), min_size=1, max_size=4)


@PROPERTY
@given(contents=docs, max_tokens=st.integers(16, 120))
def test_information_blocks_are_tokenized_whole_even_when_cut(tokenizer, contents, max_tokens):
    ids, _ = information_ids(tokenizer, format_documents(contents).strip(), max_tokens)
    assert len(ids) <= max_tokens
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith(INFORMATION_OPEN) and text.endswith(INFORMATION_CLOSE)
    assert ids == tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
