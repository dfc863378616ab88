"""evaluate.py --viewer over chat episodes of two families whose thoughts and calls look least like Qwen2.5's: Qwen3.5
(qwen3_coder `<function=...>` calls, a thought its generation prompt opens, so the response holds only its end) and
Llama 3.2 (bare JSON calls, after `<|python_tag|>` when text comes first). The trajectory lines and the viewer page
(its data is JSON in the HTML) show each turn's thought as the model wrote it and each call read as a search."""

import base64
import json
import re

import numpy as np
import pytest
from test_evaluate import cli, trajectories

import evaluate
import oai_format_data_preprocess
from slime_search_r1.tools.search import SEARCH_SCHEMA
from slime_search_r1.tokens.engine_rules import model_eos_ids
from support.episodes import QUESTION, chat_messages
from support.family_cases import FamilyCase
from support.family_chat import two_searches_then_answer
from support.fake_sglang import FakeSGLangEngine
from support.loopback import serve_in_thread
from support.model_tokenizers import checkpoint_dir, load_checkpoint_tokenizer
from support.search_r1_data import write_search_r1_parquet

CASES = [FamilyCase("qwen3.5-4b", {"enable_thinking": True}), FamilyCase("llama-3.2-3b-instruct")]
QUERIES = [{"query": "capital of France"}, {"query": "Paris France capital city"}]
THOUGHTS = ("Look it up.", "Check once more.", "The documents agree: Paris.")


@pytest.fixture(params=CASES, ids=[case.id for case in CASES])
def case(request):
    return request.param


@pytest.fixture
def served(case, policy):
    """The checkpoint's tokenizer folder and the test engine serving it, its EOS set read from the checkpoint; the
    model writes the family's two searches and answer."""
    folder, tokenizer = checkpoint_dir(case.checkpoint), load_checkpoint_tokenizer(case.checkpoint)
    prompt = tokenizer.apply_chat_template(
        chat_messages(), tools=[SEARCH_SCHEMA], tokenize=False, add_generation_prompt=True, **case.template_kwargs
    )
    policy.scripts[QUESTION + "?"] = two_searches_then_answer(case.family, prompt)
    engine = FakeSGLangEngine(tokenizer, policy, eos_ids=tuple(model_eos_ids(str(folder), tokenizer)))
    with serve_in_thread(engine.app) as url:
        engine.url = url
        yield str(folder), engine


def page_samples(page: str) -> tuple[dict, list[dict]]:
    """The page's data and each sample's detail, as the page's script reads them."""
    data = json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0])
    details = re.findall(r'<script type="application/json" id="d-\d+-\d+">(.*?)</script>', page, re.DOTALL)
    return data, [json.loads(detail) for detail in details]


def model_steps(data: dict, detail: dict) -> list[str]:
    """The text of each run of tokens the model wrote, spelled from the page's vocabulary."""
    ids = np.frombuffer(base64.b64decode(detail["response_ids"]), dtype="<i4").tolist()
    vocabulary = data["vocab"]

    def spell(token: int) -> bytes:
        text = vocabulary["t"].get(str(token))
        return text.encode() if text is not None else base64.b64decode(vocabulary["b"][str(token)])

    return [
        b"".join(spell(token) for token in ids[start:end]).decode()
        for kind, start, end in detail["steps"]
        if kind == "model"
    ]


def test_evaluate_and_its_viewer_page_show_each_familys_thoughts_and_calls(
    case, served, retriever, search_config, tmp_path
):
    tokenizer_dir, engine = served
    data_file = write_search_r1_parquet(tmp_path / "test.parquet", [("nq", QUESTION, ["Paris"])])
    chat_file = tmp_path / "test_chat.parquet"
    assert oai_format_data_preprocess.main(["--input", str(data_file), "--output", str(chat_file)]) == 0
    kwargs = ["--apply-chat-template-kwargs", json.dumps(case.template_kwargs)] if case.template_kwargs else []
    out = tmp_path / "out"
    argv = cli(chat_file, engine, tokenizer_dir, out, "--llm-api-mode", "chat", "--viewer", *kwargs)
    assert evaluate.main(argv) == 0

    [line] = trajectories(out)
    assert (line["status"], line["searches"], line["em"]) == ("completed", 2, 1.0)
    llama = case.family.name == "llama3"
    thoughts = THOUGHTS[1:] if llama else THOUGHTS  # Llama's first call is the whole turn: no thought before it
    assert all(thought in line["response"] for thought in thoughts)
    calls = [m for m in line["episode"]["conversation"] if m["role"] == "assistant" and m.get("tool_calls")]
    read = [json.loads(c["function"]["arguments"]) for m in calls for c in m["tool_calls"]]
    assert [c["function"]["name"] for m in calls for c in m["tool_calls"]] == ["search", "search"]
    assert read == QUERIES

    data, [detail] = page_samples((out / "viewer" / "index.html").read_text(encoding="utf-8"))
    assert [(call["name"], call["arguments"]) for call in detail["tool_calls"]] == [("search", q) for q in QUERIES]
    assert all(call["result"] for call in detail["tool_calls"])  # each with the documents it brought
    turns = model_steps(data, detail)
    assert len(turns) == 3
    if llama:
        assert turns[0].startswith('{"name": "search"') and "<|python_tag|>" in turns[1]
    else:  # the prompt opened the thought: the first turn holds only its end
        assert "<think>" not in turns[0] and "<function=search>" in turns[0]
    for turn, thought in zip(turns[-len(thoughts) :], thoughts, strict=True):
        assert thought in turn and "</think>" in turn  # the thought as the model wrote it, its end included
