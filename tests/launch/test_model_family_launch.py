"""The model family at launch: read from the checkpoint's chat template (--hf-checkpoint) by SGLang's rules, refused
when no rule places it (naming SEARCH_R1_MODEL_FAMILY), and refused with router_handler when its template rewrites
earlier assistant turns."""

import json

import pytest

from support.launch_runs import launch_here
from support.model_tokenizers import checkpoint_dir


@pytest.fixture
def launch(monkeypatch, capsys):
    return lambda *args, **env: launch_here(monkeypatch, capsys, "--dry-run", *args, **env)


def test_a_template_no_rule_places_is_refused_at_launch_with_the_setting_that_overrides_it(launch, tmp_path):
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    code, _, stderr = launch("--hf-checkpoint", str(tmp_path), LLM_API_MODE="chat")
    assert code == 1
    assert f"SEARCH_R1_MODEL_FAMILY=auto cannot place the chat template of {tmp_path}" in stderr
    assert "SEARCH_R1_MODEL_FAMILY=qwen35 | qwen3_coder | qwen3 | qwen3_thinking | llama3 | qwen25" in stderr
    code, _, _ = launch("--hf-checkpoint", str(tmp_path), LLM_API_MODE="chat", SEARCH_R1_MODEL_FAMILY="qwen25")
    assert code == 0


def test_xml_mode_refuses_a_template_whose_assistant_turn_its_format_rule_cannot_find(launch, tmp_path):
    template = "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}### assistant:"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    code, _, stderr = launch("--hf-checkpoint", str(tmp_path), LLM_API_MODE="generate")
    assert code == 1
    assert f"the chat template of {tmp_path} writes none it knows" in stderr
    assert "'<|im_start|>assistant' or '<|start_header_id|>assistant<|end_header_id|>'" in stderr


@pytest.mark.parametrize("checkpoint", ["qwen2.5-3b", "llama-3.2-3b-instruct", "qwen3-4b", "qwen3.5-4b"])
def test_xml_mode_takes_every_familys_template(launch, checkpoint):
    code, _, stderr = launch("--hf-checkpoint", str(checkpoint_dir(checkpoint)), LLM_API_MODE="generate")
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("checkpoint", "refused"),
    [("qwen3-4b", True), ("qwen3-4b-thinking-2507", True), ("qwen3.5-4b", True), ("qwen3-4b-instruct-2507", False)],
)
def test_router_handler_is_refused_for_a_family_whose_template_rewrites_history(launch, checkpoint, refused):
    env = dict(LLM_API_MODE="chat", TOKEN_TRACKING_MODE="router_handler", LEGACY_SLIME_ROUTER="1")
    code, _, stderr = launch("--hf-checkpoint", str(checkpoint_dir(checkpoint)), **env)
    assert code == int(refused), stderr
    if refused:
        assert "TOKEN_TRACKING_MODE=router_handler re-renders the conversation" in stderr
        assert "accepted: TOKEN_TRACKING_MODE=manual or router_radix" in stderr


def test_a_family_the_registry_does_not_hold_is_refused_with_the_names_it_holds(launch):
    code, _, stderr = launch(SEARCH_R1_MODEL_FAMILY="gemma3")
    assert code == 1
    assert "SEARCH_R1_MODEL_FAMILY='gemma3' is invalid; accepted: auto | qwen35 | qwen3_coder | qwen3" in stderr
