"""python -m slime_search_r1.launch on run_qwen2.5_3B.sh's own flag arrays, in this process: every value and where it
came from, the flags the values imply, the checks (one line naming the setting and what is accepted), the runtime
env, and the fully-asynchronous launch."""

import shlex
from argparse import Namespace

import pytest

from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.slime_flags import (
    DEFAULT_ROLLOUT,
    FULLY_ASYNC_ROLLOUT,
    REWARD_POST_PROCESS_PATH,
    check_slime_args,
)
from support.launch_runs import SCRIPT, dry_run_here, launch_here
from support.slime_rollout import EVAL_ROLLOUT_LOG_FUNCTION, ROLLOUT_LOG_FUNCTION, load_function


@pytest.fixture
def dry_run(monkeypatch, capsys):
    return lambda *args, **env: dry_run_here(monkeypatch, capsys, *args, **env)


@pytest.fixture
def refused(monkeypatch, capsys):
    """The launch's stderr, asserting that it stopped (exit code 1)."""

    def run(*args, **env) -> str:
        code, _, stderr = launch_here(monkeypatch, capsys, *args, **env)
        assert code == 1, stderr
        return stderr

    return run


def test_the_default_command_colocates_in_xml_mode(dry_run):
    run = dry_run()
    assert run.entry == ["python3", "/root/slime/train.py"]
    assert run.train_args[:7] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--num-gpus-per-node",
                                  "8", "--colocate"]  # fmt: skip
    assert run.has("--apply-chat-template") and not run.has("--tool-key")
    assert run.value("--advantage-estimator") == "grpo"
    assert run.value("--sglang-mem-fraction-static") == "0.7"
    for absent in ("--use-tis", "--custom-config-path", "--use-wandb", "--eval-prompt-data", "--eval-interval",
                   "--load", "--save", "--rollout-function-path", "--save-debug-rollout-data"):  # fmt: skip
        assert not run.has(absent)
    assert run.runtime_env == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "LLM_API_MODE": "generate",
        "PYTHONPATH": run.runtime_env["PYTHONPATH"],
        "PYTHONUNBUFFERED": "1",
    }


def test_the_dry_run_says_where_each_value_came_from(dry_run):
    run = dry_run(SEARCH_R1_MAX_TURNS="4", NUM_GPUS="4", GOOGLE_API_KEY="sk-hidden")
    assert run.sources["max_turns"] == ("4", "environment variable SEARCH_R1_MAX_TURNS")
    assert run.sources["topk"] == ("3", "default")
    assert run.sources["final_format_score"] == ("0.1", "default, derived from the others")
    assert run.sources["google.api_key"] == ("<hidden>", "environment variable GOOGLE_API_KEY")
    assert run.sources["NUM_GPUS"] == ("4", "environment variable NUM_GPUS")
    assert run.sources["ASYNC_MODE"] == ("'off'", "default")
    assert run.sources["ACTOR_GPUS"] == ("2", "default, derived from the others")
    assert "sk-hidden" not in run.stdout + run.stderr


def test_the_dry_run_says_where_each_of_the_scripts_paths_came_from(dry_run):
    run = dry_run()
    assert run.sources["HF_CHECKPOINT"] == (
        "'/root/Qwen2.5-3B'",
        "default in the script (export HF_CHECKPOINT to change it)",
    )
    assert run.sources["PROMPT_DATA"][0] == repr(run.value("--prompt-data"))
    run = dry_run("--ref-load", "/mine/ref", REF_LOAD="/exported/ref")
    assert run.sources["REF_LOAD"] == ("'/mine/ref'", "the script's command line")  # the command line wins
    assert run.sources["HF_CHECKPOINT"][1].startswith("default in the script")


def optional_lines(array: str) -> list[str]:
    """The script's commented flags in one of its arrays, as uncommented words (what a user turns on)."""
    text = SCRIPT.read_text()
    body = text[text.index(f"{array}=(") : text.index("\n)", text.index(f"{array}=("))]
    lines = [line.strip()[2:] for line in body.splitlines() if line.strip().startswith("# --")]
    return [word for line in lines for word in shlex.split(line.split("  #")[0])]


def test_tis_wandb_dumps_and_evaluation_are_commented_flags_of_the_script(dry_run):
    """Each is the script's own commented line, as slime's examples write optional flags: uncommented (here,
    appended), it reaches train.py as it is, and its files are checked like every other path."""
    tis, wandb, evaluation = optional_lines("GRPO_ARGS"), optional_lines("WANDB_ARGS"), optional_lines("EVAL_ARGS")
    dumps = optional_lines("MISC_ARGS")
    run = dry_run(*tis, *wandb, *evaluation, *dumps, SLIME_DIR="/opt/slime")
    assert run.has("--use-tis")
    assert run.value("--custom-config-path") == "/root/slime/examples/train_infer_mismatch_helper/mis.yaml"
    assert (
        run.value("--custom-tis-function-path")
        == "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
    )
    assert "/opt/slime" in run.runtime_env["PYTHONPATH"].split(":")  # the TIS module imports from slime's tree
    assert run.has("--use-wandb") and run.value("--wandb-project") == "slime-search-r1"
    assert run.value("--save-debug-rollout-data") == "/root/dumps/rollout_data/{rollout_id}.pt"
    assert run.value("--save-debug-train-data") == "/root/dumps/train_data/{rollout_id}.pt"
    position = run.train_args.index("--eval-prompt-data")
    assert run.train_args[position + 1 : position + 3] == [
        "search_r1_test",
        "/root/Search-R1/data/nq_hotpotqa_train/test.parquet@[0:3000]",
    ]
    assert run.value("--eval-interval") == "25"
    assert run.value("--eval-temperature") == "0"
    # the path checks look at the file behind slime's @[start:end] slice, and at TIS's config
    assert "evaluation data (--eval-prompt-data) not found: /root/Search-R1/data/nq_hotpotqa_train/test.parquet\n" in (
        run.stderr
    )
    assert "TIS config (--custom-config-path) not found: /root/slime/examples/" in run.stderr
    assert run.after[0].startswith("# trajectory viewer") and " /root/dumps --rollouts=-1: " in run.after[1]
    plain = dry_run()
    assert not {"--use-tis", "--use-wandb", "--eval-interval", "--save-debug-rollout-data"} & set(plain.train_args)


def test_search_metrics_are_logged_and_failed_samples_kept_out_of_group_advantages(dry_run):
    run = dry_run()
    # the functions the stand-in training (and so the wrapper test) logs through, and slime can import them
    assert run.value("--custom-rollout-log-function-path") == ROLLOUT_LOG_FUNCTION
    assert run.value("--custom-eval-rollout-log-function-path") == EVAL_ROLLOUT_LOG_FUNCTION
    assert run.value("--custom-reward-post-process-path") == REWARD_POST_PROCESS_PATH
    for path in (ROLLOUT_LOG_FUNCTION, EVAL_ROLLOUT_LOG_FUNCTION, REWARD_POST_PROCESS_PATH):
        assert callable(load_function(path))
    assert "siblings' advantages" not in run.stderr  # no warning: the hook is the plugin's
    replaced = dry_run("--custom-reward-post-process-path", "mine.post_process")
    assert "siblings' advantages: pass --custom-reward-post-process-path" in replaced.stderr


def test_chat_mode_keeps_messages_and_reads_tools(dry_run, refused):
    run = dry_run(LLM_API_MODE="chat")
    assert not run.has("--apply-chat-template")
    assert (run.value("--tool-key"), run.value("--eval-tool-key")) == ("tools", "tools")
    assert run.runtime_env["LLM_API_MODE"] == "chat"
    assert "--apply-chat-template with LLM_API_MODE=chat" in refused("--dry-run", "--apply-chat-template",
                                                                     LLM_API_MODE="chat")  # fmt: skip


def test_paths_and_knobs_come_from_the_environment(dry_run):
    run = dry_run(SLIME_DIR="/opt/slime", MEGATRON_PATH="/opt/Megatron-LM",
                  PYTHON_BIN="/usr/bin/python3.11", NUM_GPUS="4", RAY_DASHBOARD_PORT="8300")  # fmt: skip
    assert run.entry == ["/usr/bin/python3.11", "/opt/slime/train.py"]
    assert run.value("--actor-num-gpus-per-node") == "4"
    assert run.head[run.head.index("--num-gpus") + 1] == "4"
    assert run.head[run.head.index("--dashboard-port") + 1] == "8300"
    assert run.submit[run.submit.index("--submission-id") + 1].startswith("search-r1-")
    assert run.submit[run.submit.index("--address") + 1] == "http://127.0.0.1:8300"
    assert run.runtime_env["PYTHONPATH"].split(":")[0] == "/opt/Megatron-LM"
    assert "model architecture flags (MODEL_ARGS_FILE) not found: /opt/slime/scripts/models/qwen2.5-3B.sh" in (
        run.stderr
    )


def test_plugin_variables_are_forwarded_and_secrets_never_shown(dry_run):
    values = {"SEARCH_R1_TOOLS": "search", "SEARCH_R1_EXTENSIONS": "json", "GOOGLE_SNIPPET_ONLY": "1",
              "RETRIEVAL_SERVER_URL": "http://10.0.0.5:8000", "SEARCH_R1_MAX_TURNS": "4"}  # fmt: skip
    run = dry_run(**values, SEARCH_BACKEND="google", GOOGLE_API_KEY="sk-very-secret", WANDB_KEY="wandb-very-secret",
                  MY_TOKEN="tok-very-secret", EXTRA_RUNTIME_ENV_VARS="MY_TOKEN,UNSET_ONE")  # fmt: skip
    assert {name: run.runtime_env[name] for name in values} == values
    assert run.runtime_env["GOOGLE_API_KEY"] == "<hidden>"
    assert run.runtime_env["WANDB_API_KEY"] == "<hidden>"  # WANDB_KEY, under wandb's own name
    assert run.runtime_env["MY_TOKEN"] == "<hidden>"
    assert "UNSET_ONE" not in run.runtime_env
    assert "very-secret" not in run.stdout + run.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SKIP_PLUGIN_CHECK": "maybe"},
            "environment variable SKIP_PLUGIN_CHECK='maybe' is invalid; accepted: one of 1",
        ),
        ({"LLM_API_MODE": "xml"}, "environment variable LLM_API_MODE='xml' is invalid; accepted: generate | chat"),
        ({"RAY_DASHBOARD_PORT": "0"}, "environment variable RAY_DASHBOARD_PORT='0' is out of range; accepted: 1 to"),
        ({"ASYNC_MODE": "partly"}, "environment variable ASYNC_MODE='partly' is invalid; accepted: off | fully"),
        ({"NUM_GPUS": "0"}, "environment variable NUM_GPUS='0' is out of range; accepted: >= 1"),
        ({"SEARCH_R1_MAX_TURNS": "two"}, "SEARCH_R1_MAX_TURNS='two' is invalid; accepted: an integer, 1 to 128"),
    ],
)
def test_bad_values_stop_even_a_dry_run(refused, env, message):
    stderr = refused("--dry-run", **env)
    assert stderr.startswith("run_qwen2.5_3B.sh: error: ") and message in stderr


def generate_refusal(flags: Namespace, env: dict) -> str:
    """The message generate() raises at its first sample for these slime flags and plugin variables."""
    with pytest.raises(ConfigError) as refusal:
        check_slime_args(flags, resolve_config(search_r1_configs({}, env)))
    return str(refusal.value)


@pytest.mark.parametrize(
    ("args", "env", "flags"),
    [
        (["--use-tis"], {"LOSS_MASK_MODE": "simple"}, {"use_tis": True}),
        (["--use-rollout-logprobs"], {"LOSS_MASK_MODE": "simple"}, {"use_rollout_logprobs": True}),
        (["--get-mismatch-metrics"], {"TRACK_LOG_PROBS": "0"}, {"get_mismatch_metrics": True}),
        (["--rollout-top-p", "0.9"], {"TRACK_LOG_PROBS": "0"}, {"rollout_top_p": 0.9}),
        (["--use-rollout-routing-replay"], {}, {"use_rollout_routing_replay": True}),
        (["--partial-rollout"], {"TOKEN_TRACKING_MODE": "router_radix"}, {"partial_rollout": True}),
    ],
    ids=["tis-simple", "rollout-logprobs-simple", "mismatch-no-logprobs", "top-p", "r3", "partial"],
)
def test_flags_generate_refuses_are_refused_at_launch_with_its_message(refused, args, env, flags):
    message = generate_refusal(Namespace(**flags), env)
    assert f"run_qwen2.5_3B.sh: error: {message}" in refused("--dry-run", *args, **env, LEGACY_SLIME_ROUTER="1")


def test_the_router_modes_need_the_old_router_stated(dry_run, refused):
    for mode in ("router_radix", "router_handler"):
        chat = {"LLM_API_MODE": "chat"} if mode == "router_handler" else {}
        stderr = refused("--dry-run", TOKEN_TRACKING_MODE=mode, **chat)
        assert f"TOKEN_TRACKING_MODE={mode} needs the old slime router" in stderr
        assert dry_run(TOKEN_TRACKING_MODE=mode, LEGACY_SLIME_ROUTER="1", **chat).has("--custom-rm-path")
    assert "LEGACY_SLIME_ROUTER='sure' is invalid" in refused("--dry-run", LEGACY_SLIME_ROUTER="sure")


def test_the_check_can_be_skipped_and_partial_rollout_passes(dry_run):
    run = dry_run("--use-rollout-routing-replay", SKIP_PLUGIN_CHECK="1")
    assert run.has("--use-rollout-routing-replay")
    assert "SKIP_PLUGIN_CHECK is set" in run.stderr
    partial = dry_run("--partial-rollout", "--mask-offpolicy-in-partial-rollout", "--over-sampling-batch-size", "64")
    assert partial.has("--partial-rollout")
    shown = [line for line in partial.stderr.splitlines() if "not found" not in line and "not checked" not in line]
    assert shown == []  # no warning but the missing paths and the flags no slime parser could check


def test_a_missing_path_warns_in_a_dry_run_and_stops_a_real_run(dry_run, refused):
    assert (
        "warning: Hugging Face checkpoint (--hf-checkpoint) not found: /nowhere"
        in dry_run("--hf-checkpoint", "/nowhere").stderr
    )
    error = refused()  # every missing path of the real run, at once, before ray is looked for
    assert "error: 5 paths are missing" in error
    assert "\n  - slime's train.py (SLIME_DIR) not found: /root/slime/train.py\n" in error


# ---- fully asynchronous ---------------------------------------------------------------------------------------


def test_fully_async_uses_train_async_on_split_gpus_with_slimes_rollout_function(dry_run):
    run = dry_run("--partial-rollout", "--eval-interval", "25", ASYNC_MODE="fully")
    assert run.entry == ["python3", "/root/slime/train_async.py"]
    assert not run.has("--colocate")
    assert (run.value("--actor-num-gpus-per-node"), run.value("--rollout-num-gpus")) == ("4", "4")  # 8 GPUs, halved
    assert run.value("--num-gpus-per-node") == "8"
    assert run.value("--rollout-function-path") == FULLY_ASYNC_ROLLOUT
    assert run.value("--eval-function-path") == DEFAULT_ROLLOUT  # slime's default one evaluates; the async one raises
    assert run.head[run.head.index("--num-gpus") + 1] == "8"
    assert "--partial-rollout" not in run.stderr  # no warning with it
    split = dry_run("--partial-rollout", ASYNC_MODE="fully", ACTOR_GPUS="2")
    assert (split.value("--actor-num-gpus-per-node"), split.value("--rollout-num-gpus")) == ("2", "6")
    assert dry_run(ASYNC_MODE="fully", NUM_GPUS="4").value("--rollout-num-gpus") == "2"


def test_fully_async_without_partial_rollout_is_warned_about_with_the_reason(dry_run):
    stderr = dry_run(ASYNC_MODE="fully").stderr
    assert "without --partial-rollout: every weight update aborts the episodes in flight" in stderr
    assert "an episode longer than one training step may never finish" in stderr


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {"ACTOR_GPUS": "8"}, "ACTOR_GPUS=8 leaves 0 of NUM_GPUS=8 to generate; accepted: ACTOR_GPUS from 1 to 7"),
        ([], {"NUM_GPUS": "1"}, "but NUM_GPUS=1; accepted: NUM_GPUS of 2 or more, or ASYNC_MODE=off"),
        (
            [],
            {"ACTOR_GPUS": "5"},
            "NUM_GPUS - ACTOR_GPUS = 3 rollout GPUs is not a multiple of --rollout-num-gpus-per-engine 2",
        ),
        (
            ["--rollout-num-gpus-per-engine", "1"],
            {"ACTOR_GPUS": "3"},
            "ACTOR_GPUS=3 is not a multiple of Megatron's tensor x pipeline x context parallel size 2",
        ),
        (["--colocate"], {}, f"--colocate with --rollout-function-path {FULLY_ASYNC_ROLLOUT}"),
        (
            ["--eval-function-path", FULLY_ASYNC_ROLLOUT, "--eval-interval", "25"],
            {},
            f"accepted: --eval-function-path {DEFAULT_ROLLOUT}",
        ),
        (["--disable-rollout-global-dataset"], {}, "--disable-rollout-global-dataset with"),
    ],
    ids=["all-train", "one-gpu", "engines", "megatron", "colocate", "evaluation", "global-dataset"],
)
def test_fully_async_refusals_name_the_setting_and_what_is_accepted(refused, args, env, message):
    stderr = refused("--dry-run", "--partial-rollout", *args, ASYNC_MODE="fully", **env)
    assert stderr.startswith("run_qwen2.5_3B.sh: error: ") and message in stderr
    assert stderr.count("\n") == 1  # one line, before any warning


def test_the_fully_async_rollout_function_with_colocate_or_its_evaluation_is_refused_in_any_mode(refused):
    """Not only through ASYNC_MODE: slime's fully-async function named in the flags gets the same checks."""
    stderr = refused("--dry-run", "--rollout-function-path", FULLY_ASYNC_ROLLOUT)  # ASYNC_MODE=off: --colocate
    assert "--colocate with --rollout-function-path" in stderr


def test_the_gpu_split_is_warned_about_without_fully_async(dry_run):
    assert "ACTOR_GPUS applies with ASYNC_MODE=fully only" in dry_run(ACTOR_GPUS="2").stderr


def test_at_a_sample_the_fully_async_refusals_are_warnings():
    """generate() inside slime's fully-async worker: a raise would be logged and the group dropped (a stall)."""
    args = Namespace(rollout_function_path=FULLY_ASYNC_ROLLOUT, eval_function_path=FULLY_ASYNC_ROLLOUT,
                     eval_interval=25, colocate=False, partial_rollout=True,
                     custom_reward_post_process_path=REWARD_POST_PROCESS_PATH)  # fmt: skip
    config = resolve_config(search_r1_configs({}, {}))
    warnings = check_slime_args(args, config)
    assert any("raises 'fully-async rollout doesn't support evaluation mode'" in w for w in warnings)
    with pytest.raises(ConfigError, match="--eval-function-path"):
        check_slime_args(args, config, at_launch=True)
    args.eval_function_path = DEFAULT_ROLLOUT
    assert check_slime_args(args, config) == []
