"""The rows oai_format_data_preprocess.py writes, rendered by each model family's official template on its real
tokenizer (support/model_tokenizers.py), thinking on and off: every template shows the model the system prompt, the
question and each tool the row offers, and leaves the model's turn as the family's generation prompt says; a kept
Search-R1 prompt (XML mode) is read by the plugin and the format rule under every template."""

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_oai_format_data_preprocess import read_like_slime, search_r1_rows

from oai_format_data_preprocess import main
from qa_em_format import format_problem
from slime.utils.types import Sample
from slime_search_r1.data import chat_system_prompt
from slime_search_r1.protocols.chat import initial_messages, sample_tools
from slime_search_r1.protocols.chat_template import ChatRenderer
from slime_search_r1.protocols.xml_tags import TOOL_LINES_AFTER, prompt_text, prompt_thought
from slime_search_r1.registry import TOOLS
from support.family_cases import CASE_IDS, CASES, MODEL_THINKS, PROMPT_THINKS, THINKING_OFF
from support.model_tokenizers import load_checkpoint_tokenizer

OFFERED = ("search", "access")
# what the model's turn starts in, as prompt_thought reads the generation prompt
THOUGHT_STATE = {MODEL_THINKS: "none", PROMPT_THINKS: "open", THINKING_OFF: "closed"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The data script's chat rows (offering search and access) and its kept-prompt rows, read back as slime reads
    them."""
    folder = tmp_path_factory.mktemp("families_data")
    source = folder / "test.parquet"
    pq.write_table(pa.Table.from_pylist(search_r1_rows()), source)
    chat, xml = folder / "chat.parquet", folder / "xml.parquet"
    assert main(["--input", str(source), "--output", str(chat), "--tools", ",".join(OFFERED)]) == 0
    assert main(["--input", str(source), "--output", str(xml), "--keep-prompt"]) == 0
    return read_like_slime(chat)[0], read_like_slime(xml)[0]


@pytest.fixture(params=CASES, ids=CASE_IDS)
def case(request):
    return request.param


def shown_fields(schema: dict) -> list[str]:
    """What of a tool schema the model must see to call it: its name, description, and each parameter's name and
    description."""
    function = schema["function"]
    parameters = function["parameters"]["properties"]
    return [function["name"], function["description"], *parameters, *(p["description"] for p in parameters.values())]


def test_each_familys_template_shows_a_chat_row_s_system_prompt_question_and_tools(case, written):
    chat_row, _ = written
    tokenizer = load_checkpoint_tokenizer(case.checkpoint)
    # slime's --tool-key tools: the JSON string, loaded, in sample.metadata["tools"]; the plugin renders with it
    sample = Sample(prompt=chat_row["prompt"], metadata={"tools": json.loads(chat_row["tools"])})
    tools = sample_tools(sample, {name: TOOLS.get(name) for name in OFFERED})
    messages = initial_messages(sample.prompt)
    rendered = ChatRenderer(tokenizer, tools, case.template_kwargs, messages).render(messages, True)
    assert chat_system_prompt(OFFERED) in rendered
    assert "Question: what is the capital of france?" in rendered
    for schema in (TOOLS.get(name).schema for name in OFFERED):  # what the plugin offers, the row carries
        # a template writes a schema as JSON (json.dumps or Jinja's tojson, which escape alike) or field by field
        missing = [text for text in shown_fields(schema) if text not in rendered and json.dumps(text) not in rendered]
        assert not missing, f"{case.id}: the template does not show {missing}"
    assert prompt_thought(rendered) == THOUGHT_STATE[case.thought]


def test_each_familys_template_leaves_a_kept_search_r1_prompt_readable_in_xml_mode(case, written):
    """slime's --apply-chat-template renders the kept prompt; the plugin finds Search-R1's instruction in it (where
    another tool's sentence goes), the assistant turn and its prefill, and a well-formed response is valid."""
    _, xml_row = written
    tokenizer = load_checkpoint_tokenizer(case.checkpoint)
    rendered = tokenizer.apply_chat_template(
        xml_row["prompt"], tokenize=False, add_generation_prompt=True, **case.template_kwargs
    )
    tools = {name: TOOLS.get(name) for name in OFFERED}
    args = SimpleNamespace(apply_chat_template_kwargs=case.template_kwargs)
    extended = prompt_text(args, tokenizer, Sample(prompt=rendered), tools)
    assert TOOL_LINES_AFTER in rendered and tools["access"].prompt_line in extended
    assert prompt_thought(rendered) == THOUGHT_STATE[case.thought]
    opening = "" if case.thought == PROMPT_THINKS else "<think>"
    response = (
        f"{opening}I should look it up.</think>\n<search> capital of France </search>"
        "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
        "<think>The document says it.</think>\n<answer> Paris </answer>"
    )
    assert format_problem(rendered, response) is None
