"""What the launch refuses before any GPU is spent and what MODEL picks: a mistyped slime flag (slime's own parser
when slime is importable, the launch's flags when not), --sglang-skip-tokenizer-init where stop strings are sent,
each model family's slime file, checkpoints and chat-template kwargs; and the one line a bare python3 gets from the
data and evaluation scripts."""

import json
import subprocess
import sys
from argparse import Namespace

import pytest

from slime_search_r1.launch.presets import MODEL_PRESETS
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.slime_flags import check_slime_args, parse_slime_flags
from support.launch_runs import REPO, dry_run_here, dry_run_script, every_flag_run, launch_here, run_script
from support.slime_compat import slime_src, using_real_slime

needs_slime = pytest.mark.skipif(
    not using_real_slime(), reason="needs a slime checkout: SLIME_SRC=/path/to/slime (slime's own parser)"
)


@pytest.fixture
def dry_run(monkeypatch, capsys):
    return lambda *args, **env: dry_run_here(monkeypatch, capsys, *args, **env)


@pytest.fixture
def refused(monkeypatch, capsys):
    """The launch's stderr, asserting that it stopped (exit code 1) with one line."""

    def run(*args, **env) -> str:
        code, _, stderr = launch_here(monkeypatch, capsys, "--dry-run", *args, **env)
        assert code == 1, stderr
        assert len(stderr.splitlines()) == 1, stderr
        return stderr

    return run


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": error: " in line]


# ---- a mistyped flag --------------------------------------------------------------------------------------------


def test_a_mistyped_flag_stops_the_launch_without_slime():
    """No slime on the launch's path (the script's own PYTHONPATH): a flag a letter away from one of the command's
    stops the launch in one line; one that is far from every known flag is named as not checked."""
    result = run_script("--dry-run", "--num-rolout", "5", PYTHON_BIN=sys.executable)
    assert result.returncode == 1
    assert errors(result.stderr) == [result.stderr.strip()]
    assert result.stderr.startswith(
        "run_qwen2.5_3B.sh: error: train.py's flags: --num-rolout (did you mean --num-rollout?): not a flag the "
        "launch knows"
    )
    assert "slime is not importable from SLIME_DIR=/root/slime" in result.stderr
    passed = run_script("--dry-run", "--use-tensorboard", PYTHON_BIN=sys.executable)
    assert passed.returncode == 0, passed.stderr
    (unchecked,) = [line for line in passed.stderr.splitlines() if "train.py's flags" in line]
    assert "not checked: " in unchecked and "--use-tensorboard" in unchecked.split("not checked: ")[1]


@needs_slime
def test_a_mistyped_flag_stops_the_launch_with_slimes_own_parser():
    """slime's train.py ignores a flag it does not know (Megatron's parser runs with ignore_unknown_args=True); the
    launch reads the command with slime's own parser, from SLIME_DIR, and stops at one line."""
    env = {"SLIME_DIR": str(slime_src()), "PYTHON_BIN": sys.executable}
    typo = run_script("--dry-run", "--num-rolout", "5", **env)
    assert typo.returncode == 1
    assert errors(typo.stderr) == [typo.stderr.strip()]
    assert "--num-rolout (did you mean --num-rollout?): not a flag of slime" in typo.stderr
    assert f"slime's own parser, slime from {slime_src()}" in typo.stderr
    bad_value = run_script("--dry-run", "--num-rollout", "abc", **env)
    assert bad_value.returncode == 1
    assert bad_value.stderr.strip() == (
        "run_qwen2.5_3B.sh: error: train.py's flags: argument --num-rollout: invalid int value: 'abc'"
    )
    passed = run_script("--dry-run", "--use-tensorboard", **env)
    assert passed.returncode == 0, passed.stderr
    (unchecked,) = [line for line in passed.stderr.splitlines() if "train.py's flags" in line]
    listed = unchecked.split("not checked: ")[1]
    assert "--tensor-model-parallel-size" in listed  # Megatron's, not importable here
    assert "--num-rollout" not in listed and "--use-tensorboard" not in listed  # slime's own: checked


@needs_slime
@pytest.mark.parametrize(
    ("model", "mode"),
    [*((model, {}) for model in sorted(MODEL_PRESETS)), ("qwen3-4b", {"ASYNC_MODE": "fully", "LLM_API_MODE": "chat"})],
)
def test_slimes_parser_passes_every_flag_of_each_models_command(model, mode):
    """No flag of the shipped command (every optional one switched on) or of slime's model file is taken for a
    typo: slime's parser knows slime's, and the others are only listed as not checked."""
    run = every_flag_run(MODEL=model, SLIME_DIR=str(slime_src()), PYTHON_BIN=sys.executable, **mode)
    assert run.sources["MODEL_ARGS_FILE"][0].endswith(f"/scripts/models/{MODEL_PRESETS[model].model_args_file}'")
    assert "--num-layers" in run.train_args  # slime's model file was sourced
    (unchecked,) = [line for line in run.stderr.splitlines() if "train.py's flags" in line]
    assert "Megatron not built" in unchecked and "slime's own parser checked the rest" in unchecked


# Megatron-LM's megatron/training/arguments.py as slime's megatron_parse_args calls it: parse_args builds Megatron's
# parser, hands it to extra_args_provider (slime's flags), then parses sys.argv, ignoring unknown flags when told to.
# Its flags here: the Megatron flags of the script and of slime's qwen2.5-3B.sh.
MEGATRON_STAND_IN = """
import argparse

FLAGS = {flags!r}


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    for flag in FLAGS:
        parser.add_argument(flag, nargs="?")
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    return parser.parse_known_args()[0] if ignore_unknown_args else parser.parse_args()
"""


@needs_slime
def test_megatrons_flags_are_checked_when_megatron_is_importable(tmp_path):
    """Megatron's parse_args is given slime's provider, which stops it once slime's flags are added: a mistyped
    Megatron flag stops the launch, and only SGLang's flags (not installed here) are left unchecked."""
    from test_launch_scripts import MEGATRON_FLAGS

    model_flags = {"--swiglu", "--ffn-hidden-size", "--num-attention-heads", "--use-rotary-position-embeddings",
                   "--disable-bias-linear", "--add-qkv-bias", "--normalization", "--norm-epsilon", "--rotary-base",
                   "--group-query-attention", "--num-query-groups", "--vocab-size"}  # fmt: skip
    package = tmp_path / "megatron" / "training"
    package.mkdir(parents=True)
    (package / "arguments.py").write_text(MEGATRON_STAND_IN.format(flags=sorted(MEGATRON_FLAGS | model_flags)))
    env = {"SLIME_DIR": str(slime_src()), "MEGATRON_PATH": str(tmp_path), "PYTHON_BIN": sys.executable}
    run = dry_run_script(**env)
    (unchecked,) = [line for line in run.stderr.splitlines() if "train.py's flags" in line]
    assert "SGLang not built" in unchecked and "Megatron" not in unchecked
    assert unchecked.split("not checked: ")[1].startswith("--sglang-mem-fraction-static ")
    typo = run_script("--dry-run", "--tensor-model-paralel-size", "2", **env)
    assert typo.returncode == 1
    assert (
        "--tensor-model-paralel-size (did you mean --tensor-model-parallel-size?): not a flag of slime or "
        "Megatron" in typo.stderr
    )


# ---- --sglang-skip-tokenizer-init -------------------------------------------------------------------------------


def test_skip_tokenizer_init_is_refused_where_stop_strings_are_sent(refused, dry_run):
    stderr = refused("--sglang-skip-tokenizer-init")
    assert "--sglang-skip-tokenizer-init with LLM_API_MODE=generate" in stderr
    assert "srt/sampling/sampling_params.py" in stderr and "unavailable when skip_tokenizer_init=True" in stderr
    chat = dry_run("--sglang-skip-tokenizer-init", LLM_API_MODE="chat")  # chat mode sends stop token ids only
    assert chat.has("--sglang-skip-tokenizer-init")
    stderr = refused("--sglang-skip-tokenizer-init", "--rollout-stop", "Observation:", LLM_API_MODE="chat")
    assert "--sglang-skip-tokenizer-init with --rollout-stop" in stderr


def test_generate_refuses_skip_tokenizer_init_in_xml_mode_at_its_first_sample():
    config = resolve_config(search_r1_configs({}, {}))
    args = parse_slime_flags(["--sglang-skip-tokenizer-init"])
    with pytest.raises(ConfigError, match=r"sampling_params\.py"):
        check_slime_args(args, config)
    chat = resolve_config(search_r1_configs({"llm_api_mode": "chat"}, {}))
    check_slime_args(Namespace(**{**vars(args), "custom_reward_post_process_path": None}), chat)


# ---- model families ---------------------------------------------------------------------------------------------


@pytest.fixture
def models_tree(tmp_path):
    """A slime checkout's scripts/models with each file MODEL names, each setting MODEL_ARGS to its own name."""
    models = tmp_path / "slime" / "scripts" / "models"
    models.mkdir(parents=True)
    for preset in MODEL_PRESETS.values():
        (models / preset.model_args_file).write_text(f"MODEL_ARGS=(--model-file {preset.model_args_file})\n")
    return tmp_path / "slime"


@pytest.mark.parametrize("model", sorted(MODEL_PRESETS))
def test_each_model_picks_slimes_model_file_its_checkpoints_and_its_template_kwargs(dry_run, models_tree, model):
    preset = MODEL_PRESETS[model]
    run = dry_run(MODEL=model, SLIME_DIR=str(models_tree))
    assert run.value("--model-file") == preset.model_args_file  # sourced from slime's checkout
    assert run.sources["MODEL_ARGS_FILE"][0] == repr(f"{models_tree}/scripts/models/{preset.model_args_file}")
    if preset.checkpoint:
        assert run.value("--hf-checkpoint") == f"/root/{preset.checkpoint}"
        assert run.value("--ref-load") == f"/root/{preset.checkpoint}_torch_dist"
        assert run.sources["HF_CHECKPOINT"][1] == f"MODEL={model}'s checkpoint (export HF_CHECKPOINT to change it)"
    thinking_switch = model in ("qwen3-4b", "qwen3.5-4b")
    if thinking_switch:
        assert json.loads(run.value("--apply-chat-template-kwargs")) == {"enable_thinking": False}
    else:
        assert not run.has("--apply-chat-template-kwargs")
    appended = dry_run("--apply-chat-template-kwargs", "{}", MODEL=model, SLIME_DIR=str(models_tree))
    assert appended.value("--apply-chat-template-kwargs") == "{}"  # the user's flag comes last and wins


def test_an_exported_checkpoint_wins_over_the_models():
    run = dry_run_script(MODEL="qwen3-4b", HF_CHECKPOINT="/mine/hf", PYTHON_BIN=sys.executable)
    assert run.value("--hf-checkpoint") == "/mine/hf"
    assert run.sources["HF_CHECKPOINT"] == ("'/mine/hf'", "environment variable HF_CHECKPOINT")
    assert run.value("--ref-load") == "/root/Qwen3-4B_torch_dist"


def test_the_default_model_is_qwen2_5_3b_and_its_command_is_the_scripts(dry_run):
    plain, named = dry_run(), dry_run(MODEL="qwen2.5-3b")
    assert plain.train_args == named.train_args
    assert plain.value("--hf-checkpoint") == "/root/Qwen2.5-3B"
    assert plain.sources["MODEL"] == ("'qwen2.5-3b'", "default")
    assert not plain.has("--apply-chat-template-kwargs")


@needs_slime
def test_each_model_gets_the_architecture_slimes_file_declares(dry_run):
    """slime's own scripts/models files, sourced from the checkout."""
    expected = {
        "qwen2.5-3b": ("--vocab-size", "151936"),
        "llama-3.2-3b-instruct": ("--vocab-size", "128256"),
        "qwen3-4b": ("--rotary-base", "1000000"),
        "qwen3-4b-instruct-2507": ("--rotary-base", "5000000"),
        "qwen3-4b-thinking-2507": ("--rotary-base", "5000000"),
        "qwen3.5-4b": ("--vocab-size", "248320"),
    }
    for model, (flag, value) in expected.items():
        assert dry_run(MODEL=model, SLIME_DIR=str(slime_src())).value(flag) == value, model


def test_an_unknown_model_is_refused_with_the_known_ones(refused):
    stderr = refused(MODEL="qwen3-8b")
    assert stderr == (
        "run_qwen2.5_3B.sh: error: environment variable MODEL='qwen3-8b' is invalid; accepted: "
        + " | ".join(MODEL_PRESETS)
        + "\n"
    )


# ---- the data and evaluation scripts in a bare Python -----------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "package"), [("oai_format_data_preprocess.py", "pyarrow"), ("evaluate.py", "aiohttp")]
)
def test_a_bare_python_gets_one_line_naming_the_install_step(script, package):
    """python -S: the standard library only (no site-packages), the script's folder on the path."""
    result = subprocess.run([sys.executable, "-S", script, "--help"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr == (
        f"{script}: error: the {package} package is not installed for {sys.executable} (No module named "
        f"'{package}'); install what {script} needs with: {sys.executable} -m pip install -e '{REPO}[data]'\n"
    )
