"""run_qwen2.5_3B.sh: the command it assembles (DRY_RUN) and what it starts and stops (with a stand-in `ray`)."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from argparse import Namespace
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from slime_search_r1.settings import SETTINGS, ConfigError, resolve_config, search_r1_configs
from slime_search_r1.slime_flags import REWARD_POST_PROCESS_PATH, check_slime_args
from support.fake_ray import VersionHandler, wait_for_line
from support.slime_compat import slime_argument_parser, using_real_slime
from support.loopback import free_port
from support.slime_rollout import EVAL_ROLLOUT_LOG_FUNCTION, ROLLOUT_LOG_FUNCTION, load_function

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_qwen2.5_3B.sh"
FAKE_RAY = REPO / "tests" / "support" / "fake_ray.py"

# slime's own flags used by the script (slime/utils/arguments.py and sglang_utils/arguments.py, checked by hand
# against THUDM/slime main), so a typo here fails a test instead of a GPU job.
SLIME_FLAGS = {
    "--actor-num-nodes", "--actor-num-gpus-per-node", "--num-gpus-per-node", "--colocate", "--hf-checkpoint",
    "--ref-load", "--load", "--save", "--save-interval", "--prompt-data", "--input-key", "--label-key",
    "--apply-chat-template", "--tool-key", "--rollout-shuffle", "--num-rollout", "--rollout-batch-size",
    "--n-samples-per-prompt", "--rollout-max-response-len", "--rollout-temperature", "--global-batch-size",
    "--balance-data", "--eval-interval", "--eval-prompt-data", "--eval-input-key", "--eval-label-key",
    "--eval-tool-key", "--n-samples-per-eval-prompt", "--eval-max-response-len", "--eval-temperature",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "--advantage-estimator", "--use-kl-loss", "--kl-loss-coef",
    "--kl-loss-type", "--entropy-coef", "--eps-clip", "--eps-clip-high", "--use-tis", "--custom-config-path",
    "--custom-tis-function-path", "--custom-generate-function-path", "--custom-rm-path", "--use-wandb",
    "--wandb-project", "--wandb-group", "--rollout-num-gpus-per-engine", "--lr", "--metadata-key",
    "--custom-rollout-log-function-path", "--custom-eval-rollout-log-function-path",
    "--custom-reward-post-process-path",
    "--save-debug-rollout-data", "--save-debug-train-data",  # slime/utils/arguments.py add_debug_arguments
}  # fmt: skip
# slime's tools/convert_torch_dist_to_hf.py, checked by hand against THUDM/slime main (and read from a real
# checkout's file when the tests run with SLIME_SRC).
CONVERTER_FLAGS = {
    "--model-name", "--input-dir", "--output-dir", "--origin-hf-dir", "--force", "--add-missing-from-origin-hf",
    "--chunk-size", "--vocab-size",
}  # fmt: skip
SGLANG_FLAGS = {"--sglang-mem-fraction-static"}  # SGLang's --mem-fraction-static behind slime's --sglang- prefix
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size", "--sequence-parallel", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--optimizer", "--lr-decay-style",
    "--weight-decay", "--adam-beta1", "--adam-beta2", "--attention-dropout", "--hidden-dropout",
    "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32", "--attention-backend",
}  # fmt: skip


def clean_env(**overrides) -> dict:
    """The caller's environment without any setting the script reads, plus `overrides`."""
    script_vars = set(re.findall(r"\b([A-Z][A-Z0-9_]+)=\$\{\1:?-", SCRIPT.read_text()))
    plugin_vars = {setting.env for setting in SETTINGS.values() if setting.env}
    drop = script_vars | plugin_vars | {"WANDB_KEY", "WANDB_API_KEY", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(overrides)
    return env


class DryRun:
    def __init__(self, result: subprocess.CompletedProcess):
        self.result = result
        out = result.stdout
        self.runtime_env = json.loads(out.split("secrets shown as <hidden>):\n", 1)[1].split("\n# Ray head", 1)[0])
        self.head = None
        head_lines = out.split("# Ray head", 1)[1].split("# training job:", 1)[0].strip().splitlines()
        if len(head_lines) > 1:
            self.head = shlex.split(head_lines[1])
        job, _, after = out.split("# training job:\n", 1)[1].partition("\n# ")
        self.submit = shlex.split(job.strip())
        self.after = ("# " + after).splitlines() if after else []  # the viewer and checkpoint commands
        self.train_args = self.submit[self.submit.index("--") + 3 :]

    def has(self, flag: str) -> bool:
        return flag in self.train_args

    def value(self, flag: str) -> str:
        assert self.train_args.count(flag) == 1, f"{flag} appears {self.train_args.count(flag)} times"
        return self.train_args[self.train_args.index(flag) + 1]


def dry_run(*args, **env) -> DryRun:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args], env=clean_env(**env), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return DryRun(result)


def fails(*args, **env) -> str:
    result = subprocess.run(["bash", str(SCRIPT), *args], env=clean_env(**env), capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr


def test_default_command_has_the_seed_argument_groups():
    run = dry_run()
    assert run.submit[:3] == ["ray", "job", "submit"]
    assert run.submit[run.submit.index("--") + 1 :][:2] == ["python3", "/root/slime/train.py"]
    assert run.value("--hf-checkpoint") == "/root/Qwen2.5-3B"
    assert run.value("--ref-load") == "/root/Qwen2.5-3B_torch_dist"
    assert run.value("--prompt-data") == "/root/Search-R1/data/nq_hotpotqa_train/train.parquet"
    assert run.value("--input-key") == "prompt"
    assert run.value("--label-key") == "reward_model"
    assert run.has("--apply-chat-template")
    assert not run.has("--tool-key")
    assert run.value("--rollout-max-response-len") == "2048"  # the whole multi-turn budget
    assert run.value("--advantage-estimator") == "grpo"
    assert run.has("--use-kl-loss")
    assert run.value("--kl-loss-coef") == "0.001"
    assert run.value("--kl-loss-type") == "low_var_kl"
    assert run.value("--custom-generate-function-path") == "generate_with_search.generate"
    assert run.value("--custom-rm-path") == "generate_with_search.reward_func"
    assert run.value("--sglang-mem-fraction-static") == "0.7"
    assert run.has("--colocate")
    for absent in ("--use-tis", "--custom-config-path", "--use-wandb", "--eval-prompt-data", "--load", "--save"):
        assert not run.has(absent)
    assert run.head[:4] == ["ray", "start", "--head", "--block"]
    assert run.runtime_env["env_vars"]["PYTHONPATH"].split(":")[:2] == ["/root/Megatron-LM", str(REPO)]
    assert "warning: slime checkout (SLIME_DIR) not found: /root/slime/train.py" in run.result.stderr


def every_flag_run(tmp_path) -> DryRun:
    """A launch command with every optional group switched on."""
    eval_data = tmp_path / "test.parquet"
    return dry_run(USE_TIS="1", USE_WANDB="1", EVAL_PROMPT_DATA=str(eval_data), SAVE_DIR="/ckpt", LOAD_DIR="/ckpt")


def test_every_flag_is_a_real_slime_megatron_or_sglang_flag(tmp_path):
    flags = {arg for arg in every_flag_run(tmp_path).train_args if arg.startswith("--")}
    assert flags - SLIME_FLAGS - MEGATRON_FLAGS - SGLANG_FLAGS == set()


@pytest.mark.skipif(
    not using_real_slime(),
    reason="needs slime's own parser, from a slime checkout: git clone https://github.com/THUDM/slime /tmp/slime, "
    "then SLIME_SRC=/tmp/slime make test (or SLIME_SRC=/tmp/slime .venv/bin/python -m pytest tests/launch)",
)
def test_slimes_own_parser_reads_every_slime_flag_of_the_command(tmp_path, monkeypatch):
    """With a slime checkout, its real parser reads the command: every flag that is not Megatron's or SGLang's is
    slime's, with a value of slime's type (argparse refuses "abc" for an int flag), and the typed list is slime's."""
    parser = slime_argument_parser(monkeypatch)
    slime_options = set(parser._option_string_actions)
    assert SLIME_FLAGS - slime_options == set()  # the list the stand-in run checks against is slime's own
    known, unknown = parser.parse_known_args(every_flag_run(tmp_path).train_args)
    assert {arg for arg in unknown if arg.startswith("--")} - MEGATRON_FLAGS - SGLANG_FLAGS == set()
    assert known.rollout_max_response_len == 2048
    assert known.custom_generate_function_path == "generate_with_search.generate"


def test_tis_is_switched_on_by_a_variable():
    run = dry_run(USE_TIS="1", SLIME_DIR="/opt/slime")
    assert run.has("--use-tis")
    assert run.value("--custom-config-path") == "/opt/slime/examples/train_infer_mismatch_helper/mis.yaml"
    assert run.value("--custom-tis-function-path") == (
        "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
    )
    assert "/opt/slime" in run.runtime_env["env_vars"]["PYTHONPATH"].split(":")  # the TIS module imports
    for value in ("0", "false", "off", ""):
        assert not dry_run(USE_TIS=value).has("--use-tis")


def test_search_metrics_are_logged_by_default_and_evaluation_reads_the_metadata_column():
    run = dry_run()
    # the functions the stand-in training (and so the wrapper test) logs through, and slime can import them
    assert run.value("--custom-rollout-log-function-path") == ROLLOUT_LOG_FUNCTION
    assert run.value("--custom-eval-rollout-log-function-path") == EVAL_ROLLOUT_LOG_FUNCTION
    assert callable(load_function(ROLLOUT_LOG_FUNCTION))
    assert callable(load_function(EVAL_ROLLOUT_LOG_FUNCTION))
    assert run.value("--metadata-key") == "metadata"
    assert dry_run(METADATA_KEY="extra").value("--metadata-key") == "extra"
    quiet = dry_run(ROLLOUT_LOG_FUNCTION_PATH="", EVAL_ROLLOUT_LOG_FUNCTION_PATH="")
    assert not quiet.has("--custom-rollout-log-function-path")
    assert not quiet.has("--custom-eval-rollout-log-function-path")
    mine = dry_run(ROLLOUT_LOG_FUNCTION_PATH="my_logs.log_rollout")
    assert mine.value("--custom-rollout-log-function-path") == "my_logs.log_rollout"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"USE_TIS": "1", "TRACK_LOG_PROBS": "false"}, "--use-tis needs the engine's log probs"),
        ({"USE_TIS": "1", "LOSS_MASK_MODE": "simple"}, "which --use-tis would treat as real"),
        ({"USE_TIS": "maybe"}, "USE_TIS=maybe is not a boolean"),
        ({"LLM_API_MODE": "xml"}, "LLM_API_MODE=xml is invalid; accepted: generate | chat"),
        ({"START_RAY": "yes"}, "START_RAY=yes is invalid"),
    ],
)
def test_bad_settings_stop_even_a_dry_run(env, message):
    assert message in fails("--dry-run", **env)


def test_failed_samples_are_kept_out_of_group_advantages_by_default():
    run = dry_run()
    assert run.value("--custom-reward-post-process-path") == REWARD_POST_PROCESS_PATH
    assert callable(load_function(REWARD_POST_PROCESS_PATH))
    assert "siblings' advantages" not in run.result.stderr  # no warning: the hook is the plugin's


def generate_refusal(flags: Namespace, env: dict) -> str:
    """The message generate() raises at its first sample for these slime flags and plugin variables."""
    with pytest.raises(ConfigError) as refused:
        check_slime_args(flags, resolve_config(search_r1_configs({}, env)))
    return str(refused.value)


@pytest.mark.parametrize(
    ("args", "env", "flags"),
    [
        (["--use-tis"], {"LOSS_MASK_MODE": "simple"}, {"use_tis": True}),
        (["--use-rollout-logprobs"], {"LOSS_MASK_MODE": "simple"}, {"use_rollout_logprobs": True}),
        (["--get-mismatch-metrics"], {"TRACK_LOG_PROBS": "0"}, {"get_mismatch_metrics": True}),
        (["--use-tis"], {"TRACK_LOG_PROBS": "false"}, {"use_tis": True}),
        (["--rollout-top-p", "0.9"], {"TRACK_LOG_PROBS": "0"}, {"rollout_top_p": 0.9}),
        (["--use-rollout-routing-replay"], {}, {"use_rollout_routing_replay": True}),
        (
            ["--partial-rollout"],
            {"TOKEN_TRACKING_MODE": "router_radix", "LEGACY_SLIME_ROUTER": "1"},
            {"partial_rollout": True},
        ),
    ],
    ids=["tis-simple", "rollout-logprobs-simple", "mismatch-no-logprobs", "tis-no-logprobs", "top-p", "r3", "partial"],
)
def test_flags_generate_refuses_are_refused_at_launch_with_its_message(args, env, flags, slime_tree):
    message = generate_refusal(Namespace(**flags), env)
    assert f"run_qwen2.5_3B.sh: error: {message}" in fails("--dry-run", *args, **env)
    assert f"run_qwen2.5_3B.sh: error: {message}" in fails(*args, **env, **slime_tree)
    assert ray_calls(slime_tree) == []  # refused before a Ray head or a job was started


def test_a_bad_plugin_setting_is_refused_at_launch_with_the_import_message():
    env = {"SEARCH_R1_MAX_TURNS": "two"}
    with pytest.raises(ConfigError) as refused:
        search_r1_configs({}, env)
    assert f"run_qwen2.5_3B.sh: error: {refused.value}" in fails("--dry-run", **env)


def test_the_router_modes_need_the_old_router_stated(tmp_path):
    for mode in ("router_radix", "router_handler"):
        chat = {"LLM_API_MODE": "chat"} if mode == "router_handler" else {}
        stderr = fails("--dry-run", TOKEN_TRACKING_MODE=mode, **chat)
        assert f"TOKEN_TRACKING_MODE={mode} needs the old slime router" in stderr
        assert "Use TOKEN_TRACKING_MODE=manual" in stderr
        assert dry_run(TOKEN_TRACKING_MODE=mode, LEGACY_SLIME_ROUTER="1", **chat).has("--custom-rm-path")


def test_the_check_reads_the_dict_as_edited_in_generate_with_search(tmp_path):
    edited = tmp_path / "generate_with_search.py"
    source = (REPO / "generate_with_search.py").read_text()
    opening = "SEARCH_R1_CONFIGS = search_r1_configs(\n    {\n"
    assert opening in source
    edited.write_text(source.replace(opening, opening + '        "max_turns": 0,\n'))
    check = [sys.executable, "-m", "slime_search_r1.launch_check", "--plugin", str(edited), "--"]
    env = clean_env(PYTHONPATH=str(REPO))
    result = subprocess.run(check, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert "SEARCH_R1_CONFIGS['max_turns']=0 is out of range; accepted: 1 to 64" in result.stderr
    edited.write_text(source.replace(opening, opening + '        "max_turns": compute_turns(),\n'))
    result = subprocess.run(check, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert "is not search_r1_configs({...}) of a literal dict" in result.stderr


def test_the_check_can_be_skipped():
    run = dry_run("--use-rollout-routing-replay", SKIP_PLUGIN_CHECK="1")
    assert run.has("--use-rollout-routing-replay")
    assert "SKIP_PLUGIN_CHECK is set" in run.result.stderr


def test_partial_rollout_passes_the_launch_check_in_manual_mode():
    run = dry_run("--partial-rollout", "--mask-offpolicy-in-partial-rollout", "--over-sampling-batch-size", "64")
    assert run.has("--partial-rollout")
    assert run.has("--mask-offpolicy-in-partial-rollout")
    assert run.value("--over-sampling-batch-size") == "64"
    assert "error" not in run.result.stderr


def test_a_replaced_reward_post_process_is_warned_about():
    run = dry_run("--custom-reward-post-process-path", "mine.post_process")
    assert "siblings' advantages: pass --custom-reward-post-process-path" in run.result.stderr


def test_chat_mode_keeps_messages_and_reads_tools(tmp_path):
    run = dry_run(LLM_API_MODE="chat", EVAL_PROMPT_DATA=str(tmp_path / "test.parquet"))
    assert not run.has("--apply-chat-template")
    assert run.value("--tool-key") == "tools"
    assert run.value("--eval-tool-key") == "tools"
    assert run.runtime_env["env_vars"]["LLM_API_MODE"] == "chat"
    assert dry_run().runtime_env["env_vars"]["LLM_API_MODE"] == "generate"


def test_paths_and_settings_come_from_the_environment(tmp_path):
    run = dry_run(
        "--num-rollout",
        "5",
        SLIME_DIR="/opt/slime",
        MEGATRON_PATH="/opt/Megatron-LM",
        HF_CHECKPOINT="/models/qwen",
        REF_LOAD="/models/qwen_dist",
        LOAD_DIR="/ckpt/run1",
        SAVE_DIR="/ckpt/run1",
        PROMPT_DATA="/data/train.parquet",
        EVAL_PROMPT_DATA="/data/test.parquet@[0:3000]",
        ROLLOUT_MAX_RESPONSE_LEN="1536",
        NUM_GPUS="4",
        PYTHON_BIN="/usr/bin/python3.11",
        EXTRA_TRAIN_ARGS="--rollout-top-p 0.99",
    )
    assert run.submit[run.submit.index("--") + 1 :][:2] == ["/usr/bin/python3.11", "/opt/slime/train.py"]
    assert run.value("--hf-checkpoint") == "/models/qwen"
    assert run.value("--ref-load") == "/models/qwen_dist"
    assert run.value("--load") == "/ckpt/run1"
    assert run.value("--save") == "/ckpt/run1"
    assert run.value("--save-interval") == "20"
    assert run.value("--prompt-data") == "/data/train.parquet"
    eval_data = run.train_args[
        run.train_args.index("--eval-prompt-data") + 1 : run.train_args.index("--eval-prompt-data") + 3
    ]
    assert eval_data == ["search_r1_test", "/data/test.parquet@[0:3000]"]
    assert run.value("--eval-temperature") == "0"
    assert run.value("--eval-max-response-len") == "1536"
    assert run.value("--rollout-max-response-len") == "1536"
    assert run.value("--actor-num-gpus-per-node") == "4"
    assert run.head[run.head.index("--num-gpus") + 1] == "4"
    assert run.train_args[-4:] == ["--rollout-top-p", "0.99", "--num-rollout", "5"]  # extra flags come last
    assert run.runtime_env["env_vars"]["PYTHONPATH"].split(":")[0] == "/opt/Megatron-LM"
    # the path checks look at the file behind slime's @[start:end] slice
    assert "evaluation data (EVAL_PROMPT_DATA) not found: /data/test.parquet\n" in run.result.stderr


def test_plugin_variables_are_forwarded_and_secrets_never_shown():
    run = dry_run(
        RETRIEVAL_SERVER_URL="http://10.0.0.5:8000",
        SEARCH_R1_MAX_TURNS="4",
        SEARCH_BACKEND="google",
        GOOGLE_API_KEY="sk-very-secret",
        WANDB_KEY="wandb-very-secret",
        USE_WANDB="1",
    )
    env_vars = run.runtime_env["env_vars"]
    assert env_vars["RETRIEVAL_SERVER_URL"] == "http://10.0.0.5:8000"
    assert env_vars["SEARCH_R1_MAX_TURNS"] == "4"
    assert env_vars["GOOGLE_API_KEY"] == "<hidden>"
    assert env_vars["WANDB_API_KEY"] == "<hidden>"
    assert "very-secret" not in run.result.stdout + run.result.stderr
    assert not any("secret" in arg for arg in run.submit)  # the key is not on any command line
    assert run.value("--wandb-project") == "slime-search-r1"


def test_every_settings_variable_that_is_set_reaches_the_job():
    values = {"SEARCH_R1_TOOLS": "search", "SEARCH_R1_EXTENSIONS": "json", "GOOGLE_SNIPPET_ONLY": "1"}
    env_vars = dry_run(**values).runtime_env["env_vars"]
    assert {name: env_vars[name] for name in values} == values


def test_an_extensions_setting_reaches_the_job_too(tmp_path):
    """A setting registered by an extension module is forwarded like the built-in ones (no list to edit)."""
    (tmp_path / "my_extension.py").write_text(
        "from slime_search_r1.settings import Integer, Setting, register_setting\n"
        "register_setting(Setting('my_extension.retries', 2, Integer(0, 9), 'MY_EXTENSION_RETRIES'))\n"
    )
    run = dry_run(SEARCH_R1_EXTENSIONS="my_extension", MY_EXTENSION_RETRIES="5", PYTHONPATH=str(tmp_path))
    assert run.runtime_env["env_vars"]["MY_EXTENSION_RETRIES"] == "5"
    stderr = fails(
        "--dry-run", SEARCH_R1_EXTENSIONS="my_extension", MY_EXTENSION_RETRIES="50", PYTHONPATH=str(tmp_path)
    )
    assert "environment variable MY_EXTENSION_RETRIES='50' is out of range; accepted: 0 to 9" in stderr


def test_a_real_run_stops_at_the_first_missing_path():
    stderr = fails(RAY_BIN="/nonexistent/ray")
    assert "error: slime checkout (SLIME_DIR) not found: /root/slime/train.py" in stderr


# ---- what a real run starts and stops, with a stand-in `ray` -------------------------------------------------


@pytest.fixture
def slime_tree(tmp_path):
    """A slime checkout whose train.py records what it got, plus checkpoints and data that exist."""
    slime = tmp_path / "slime"
    (slime / "scripts" / "models").mkdir(parents=True)
    (slime / "scripts" / "models" / "qwen2.5-3B.sh").write_text("MODEL_ARGS=(--num-layers 36 --hidden-size 2048)\n")
    (slime / "train.py").write_text(
        "import json, os, sys, time\n"
        "out = os.environ['TRAIN_RECORD']\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(out, 'w'))\n"
        "time.sleep(float(os.environ.get('TRAIN_SLEEP', '0')))\n"
        "sys.exit(int(os.environ.get('TRAIN_EXIT', '0')))\n"
    )
    for folder in ("hf", "ref"):
        (tmp_path / folder).mkdir()
    (tmp_path / "train.parquet").write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_RAY} "$@"\n')
    (bin_dir / "ray").chmod(0o755)
    return {
        "SLIME_DIR": str(slime),
        "HF_CHECKPOINT": str(tmp_path / "hf"),
        "REF_LOAD": str(tmp_path / "ref"),
        "PROMPT_DATA": str(tmp_path / "train.parquet"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON_BIN": sys.executable,
        "RAY_DASHBOARD_PORT": str(free_port()),
        "FAKE_RAY_LOG": str(tmp_path / "ray_calls.jsonl"),
        "TRAIN_RECORD": str(tmp_path / "train_record.json"),
        "EXTRA_RUNTIME_ENV_VARS": "TRAIN_RECORD,TRAIN_SLEEP TRAIN_EXIT",
        "TMPDIR": str(tmp_path),
    }


def ray_calls(env) -> list[dict]:
    path = Path(env["FAKE_RAY_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_starts_a_head_runs_the_job_and_stops_only_that_head(slime_tree, tmp_path):
    env = clean_env(**slime_tree, RETRIEVAL_SERVER_URL="http://127.0.0.1:8123", GOOGLE_API_KEY="sk-secret")
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr

    events = [call["event"] for call in ray_calls(env)]
    assert events == ["head-started", "job-submitted", "job-finished", "head-stopped"]  # no `ray stop`, no kill
    record = json.loads(Path(env["TRAIN_RECORD"]).read_text())
    assert record["argv"][:4] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8"]
    assert "--num-layers" in record["argv"]  # the model flags of scripts/models/qwen2.5-3B.sh
    assert record["env"]["RETRIEVAL_SERVER_URL"] == "http://127.0.0.1:8123"
    assert record["env"]["GOOGLE_API_KEY"] == "sk-secret"  # the real value reaches the job, through a file
    assert str(REPO) in record["env"]["PYTHONPATH"].split(":")
    assert "sk-secret" not in result.stderr + result.stdout
    assert not list(tmp_path.glob("search-r1-run.*"))  # the private runtime-env folder is removed


def test_a_failed_job_fails_the_script(slime_tree):
    env = clean_env(**slime_tree, TRAIN_EXIT="3")
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1  # what `ray job submit` reports for any failed job
    assert [call["event"] for call in ray_calls(env)][-1] == "head-stopped"


def test_sigterm_stops_the_job_it_submitted_and_the_head_it_started(slime_tree, tmp_path):
    os.mkfifo(tmp_path / "submitted")
    env = clean_env(**slime_tree, TRAIN_SLEEP="120", FAKE_RAY_SUBMITTED=str(tmp_path / "submitted"))
    process = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_for_line(tmp_path / "submitted"), "the script never submitted its job"
    submitted = next(c for c in ray_calls(env) if c["event"] == "job-submitted")
    head = next(c for c in ray_calls(env) if c["event"] == "head-started")

    process.send_signal(signal.SIGTERM)  # to the script alone, not its process group
    process.communicate(timeout=60)
    assert process.returncode == 143
    stops = [c for c in ray_calls(env) if c["event"] == "job-stop"]
    assert [c["job_id"] for c in stops] == [submitted["job_id"]]
    assert any(c["event"] == "head-stopped" for c in ray_calls(env))
    assert not alive(submitted["job_pid"])
    assert not alive(head["pid"])


def test_a_running_cluster_is_used_and_left_running(slime_tree):
    port = int(slime_tree["RAY_DASHBOARD_PORT"])
    dashboard = ThreadingHTTPServer(("127.0.0.1", port), VersionHandler)
    thread = threading.Thread(target=dashboard.serve_forever, daemon=True)
    thread.start()
    try:
        env = clean_env(**slime_tree)
        result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "it is left running" in result.stderr
        assert [c["event"] for c in ray_calls(env)] == ["job-submitted", "job-finished"]
        assert "START_RAY=1 but a Ray cluster already answers" in fails(**slime_tree, START_RAY="1")
    finally:
        dashboard.shutdown()
        dashboard.server_close()
    assert "START_RAY=0 but no Ray cluster answers" in fails(**slime_tree, START_RAY="0")


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed: apt-get install -y shellcheck (CI's .ci/run installs it)",
)
def test_scripts_are_shellcheck_clean():
    scripts = [str(SCRIPT), str(REPO / "run_qwen2.5_3B_with_retrieval.sh")]
    result = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_dumps_for_the_viewer_go_to_a_chosen_folder_and_the_viewer_command_is_printed(viewer_dumps, tmp_path):
    """slime writes the dumps at every rollout (it has no interval); the printed command runs on them as it is."""
    assert not dry_run().has("--save-debug-rollout-data")
    run = dry_run(DUMP_DIR=str(viewer_dumps.folder), HF_CHECKPOINT=str(viewer_dumps.folder / "tokenizer"))
    assert run.value("--save-debug-rollout-data") == f"{viewer_dumps.folder}/rollout_data/{{rollout_id}}.pt"
    assert run.value("--save-debug-train-data") == f"{viewer_dumps.folder}/train_data/{{rollout_id}}.pt"
    assert not dry_run(DUMP_DIR="/dumps", DUMP_TRAIN_DATA="0").has("--save-debug-train-data")
    comment, command = run.after[:2]
    assert comment.startswith("# trajectory viewer")
    env = {**clean_env(), "PYTHON_BIN": sys.executable}
    result = subprocess.run(["bash", "-c", command.replace("python3", sys.executable, 1)], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    page = (viewer_dumps.folder / "viewer" / "index.html").read_text(encoding="utf-8")
    assert '"name":"rollout 3"' in page and '"name":"eval 3"' in page  # --rollouts=-1: the latest rollout
    assert "DUMP_TRAIN_DATA=maybe is not a boolean" in fails("--dry-run", DUMP_TRAIN_DATA="maybe")


def test_a_dry_run_prints_the_way_from_its_checkpoints_to_evaluate_py(slime_tree, tmp_path):
    import evaluate

    (Path(slime_tree["SLIME_DIR"]) / "scripts" / "models" / "qwen2.5-3B.sh").write_text(
        "MODEL_ARGS=(--num-layers 36 --vocab-size 151936)\n"
    )
    save = tmp_path / "ckpt"
    (save / "iter_0000019").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("19")  # Megatron's tracker: slime saves rollout_id 19
    run = dry_run(**slime_tree, SAVE_DIR=str(save))
    lines = [line for line in run.after if not line.startswith("#")]
    assert len(lines) == 4
    # run the lines with a python that echoes its arguments: what each program would be called with, expanded
    echo = tmp_path / "echo_python"
    echo.write_text('#!/bin/sh\nprintf "%s\\n" "$*"\n')
    echo.chmod(0o755)
    script = "\n".join(line.replace(slime_tree["PYTHON_BIN"], str(echo)) for line in lines) + "\nwait\n"
    result = subprocess.run(["bash", "-c", script], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    called = {line.split()[0].rsplit("/", 1)[-1]: line.split() for line in result.stdout.splitlines()}
    convert, serve, evaluation = called["convert_torch_dist_to_hf.py"], called["-m"], called["evaluate.py"]
    assert convert[0] == f"{slime_tree['SLIME_DIR']}/tools/convert_torch_dist_to_hf.py"
    flags = dict(zip(convert[1::2], convert[2::2], strict=True))
    assert flags == {
        "--input-dir": f"{save}/iter_0000019",
        "--output-dir": f"{save}/hf/iter_0000019",
        "--origin-hf-dir": slime_tree["HF_CHECKPOINT"],
        "--vocab-size": "151936",  # Megatron's padded embedding cut back to the model's vocabulary
    }
    assert set(flags) <= converter_flags()
    assert serve[:4] == ["-m", "sglang.launch_server", "--model-path", f"{save}/hf/iter_0000019"]
    assert evaluation[0] == str(REPO / "evaluate.py")
    cli = evaluate.parse_args(evaluation[1:])  # evaluate.py takes every flag as printed
    assert (cli.hf_checkpoint, cli.output_dir, cli.reference, cli.viewer) == (
        f"{save}/hf/iter_0000019",
        save / "eval" / "iter_0000019",
        "search-r1-base-grpo",
        True,
    )
    assert str(cli.data) == "/root/Search-R1/data/nq_hotpotqa_train/test.parquet"
    instruct = dry_run(**{**slime_tree, "HF_CHECKPOINT": "/models/Qwen2.5-3B-Instruct"}, SAVE_DIR=str(save))
    assert "--reference search-r1-instruct-grpo" in instruct.after[-1]
    assert dry_run().after == [
        "# no SAVE_DIR: no checkpoint is saved (set SAVE_DIR to get the commands from a checkpoint to evaluate.py)"
    ]


def converter_flags() -> set[str]:
    """The converter's flags: read from a real slime checkout's file, else the hand-checked list."""
    from support.slime_compat import slime_src

    source = slime_src()
    if source is None:
        return CONVERTER_FLAGS
    text = (source / "tools" / "convert_torch_dist_to_hf.py").read_text()
    return set(re.findall(r'add_argument\(\s*(?:"-\w",\s*)?"(--[\w-]+)"', text))
