"""run_qwen2.5_3B.sh end to end: the script's flag arrays through python -m slime_search_r1.launch, the dict a user
edits in generate_with_search.py, and what a real run starts and stops (with a stand-in `ray`). The resolver's
details are tested in this process by test_launch_command.py."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from slime_search_r1.launch.command import FLAG_SHAPING
from slime_search_r1.slime_flags import DEFAULT_ROLLOUT, FULLY_ASYNC_ROLLOUT
from support import process_tree
from support.fake_ray import VersionHandler
from support.interrupt import interruptible
from support.launch_runs import REPO, SCRIPT, clean_env, dry_run_script, every_flag_run, run_script
from support.launch_runs import edited_copy as edited_copy_of
from support.loopback import free_port
from support.slime_compat import slime_argument_parser, using_real_slime

FAKE_RAY = REPO / "tests" / "support" / "fake_ray.py"

# slime's own flags used by the script and the launcher (slime/utils/arguments.py and sglang_utils/arguments.py,
# checked by hand against THUDM/slime main; read from slime's own parser with SLIME_SRC), so a typo here fails a
# test instead of a GPU job.
SLIME_FLAGS = {
    "--actor-num-nodes", "--actor-num-gpus-per-node", "--num-gpus-per-node", "--colocate", "--rollout-num-gpus",
    "--hf-checkpoint", "--ref-load", "--load", "--save", "--save-interval", "--prompt-data", "--input-key",
    "--label-key", "--apply-chat-template", "--tool-key", "--rollout-shuffle", "--num-rollout", "--rollout-batch-size",
    "--n-samples-per-prompt", "--rollout-max-response-len", "--rollout-temperature", "--global-batch-size",
    "--balance-data", "--eval-interval", "--eval-prompt-data", "--eval-input-key", "--eval-label-key",
    "--eval-tool-key", "--n-samples-per-eval-prompt", "--eval-max-response-len", "--eval-temperature",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "--advantage-estimator", "--use-kl-loss", "--kl-loss-coef",
    "--kl-loss-type", "--entropy-coef", "--eps-clip", "--eps-clip-high", "--use-tis", "--custom-config-path",
    "--custom-tis-function-path", "--custom-generate-function-path", "--custom-rm-path", "--use-wandb",
    "--wandb-project", "--wandb-group", "--rollout-num-gpus-per-engine", "--lr", "--metadata-key",
    "--custom-rollout-log-function-path", "--custom-eval-rollout-log-function-path",
    "--custom-reward-post-process-path", "--rollout-function-path", "--eval-function-path",
    "--save-debug-rollout-data", "--save-debug-train-data",  # slime/utils/arguments.py add_debug_arguments
    "--partial-rollout", "--over-sampling-batch-size", "--mask-offpolicy-in-partial-rollout",
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
    "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32", "--attention-backend", "--num-layers",
    "--hidden-size", "--micro-batch-size",
}  # fmt: skip


def test_the_script_hands_its_arrays_to_the_launcher_which_prints_the_command():
    run = dry_run_script()
    assert run.submit[:3] == ["ray", "job", "submit"]
    assert run.entry == ["python3", "/root/slime/train.py"]
    assert run.value("--hf-checkpoint") == "/root/Qwen2.5-3B"
    assert run.value("--ref-load") == "/root/Qwen2.5-3B_torch_dist"
    assert run.value("--prompt-data") == "/root/Search-R1/data/nq_hotpotqa_train/train.parquet"
    assert run.value("--rollout-max-response-len") == "2048"  # the whole multi-turn budget
    assert run.value("--custom-generate-function-path") == "generate_with_search.generate"
    assert run.has("--colocate") and run.has("--apply-chat-template")
    assert run.head[:4] == ["ray", "start", "--head", "--block"]
    assert run.runtime_env["PYTHONPATH"].split(":")[:2] == ["/root/Megatron-LM", str(REPO)]
    assert "warning: slime's train.py (SLIME_DIR) not found: /root/slime/train.py" in run.stderr
    # the flags a user appends to the script come last, so they win
    appended = dry_run_script("--rollout-top-p", "0.99", "--num-rollout", "5")
    assert appended.train_args[-4:] == ["--rollout-top-p", "0.99", "--num-rollout", "5"]
    assert appended.value("--num-rollout") == "5"
    by_variable = dry_run_script(HF_CHECKPOINT="/models/qwen")
    assert by_variable.sources["HF_CHECKPOINT"] == ("'/models/qwen'", "environment variable HF_CHECKPOINT")
    assert by_variable.value("--hf-checkpoint") == "/models/qwen"
    assert by_variable.sources["REF_LOAD"][1] == "default in the script (export REF_LOAD to change it)"
    assert "--list" in run_script("--help").stdout
    listed = run_script("--list").stdout
    assert "\tASYNC_MODE\t'off'\toff | fully\tlaunch\t" in listed and "\tRETRIEVER_ARGS\t" in listed


# What each flag-shaping setting's values do to the command: (flags present, flags absent). A setting added to
# FLAG_SHAPING must be added here too.
FLAG_EFFECTS = {
    "llm_api_mode": {
        "chat": ({"--tool-key", "--eval-tool-key"}, {"--apply-chat-template"}),
        "generate": ({"--apply-chat-template"}, {"--tool-key", "--eval-tool-key"}),
    },
}


@pytest.fixture
def edited_copy(tmp_path):
    """edit(entries): the script of a copy of the plugin's folder whose dict holds `entries`."""
    return lambda entries: edited_copy_of(tmp_path / "search-r1", entries) / "run_qwen2.5_3B.sh"


@pytest.mark.parametrize(("key", "value"), [(k, v) for k in FLAG_EFFECTS for v in FLAG_EFFECTS[k]])
def test_the_dict_a_user_edits_reaches_the_flags_and_the_job(edited_copy, key, value):
    """The dict a user edits decides the flags, not a default of the script's, and the job gets the same value."""
    assert set(FLAG_EFFECTS) == set(FLAG_SHAPING)
    script = edited_copy(f"        {key!r}: {value!r},\n")
    from slime_search_r1.settings.table import SETTINGS

    variable = SETTINGS[key].env
    run = dry_run_script(script=script)
    present, absent = FLAG_EFFECTS[key][value]
    assert present <= set(run.train_args) and not absent & set(run.train_args)
    assert run.runtime_env[variable] == value  # the job trains what the flags were built for
    assert run.runtime_env["PYTHONPATH"].split(":")[1] == str(script.parent)  # and imports that same dict
    assert run.sources[key] == (repr(value), f"SEARCH_R1_CONFIGS[{key!r}]")
    # an environment variable that is set still wins over the dict, and says so
    other = next(v for v in FLAG_EFFECTS[key] if v != value)
    overridden = dry_run_script(script=script, **{variable: other})
    present, absent = FLAG_EFFECTS[key][other]
    assert present <= set(overridden.train_args) and not absent & set(overridden.train_args)
    assert overridden.runtime_env[variable] == other
    assert overridden.sources[key] == (repr(other), f"environment variable {variable}")


def test_a_bad_value_in_the_edited_dict_stops_the_launch(edited_copy):
    result = run_script("--dry-run", script=edited_copy('        "max_turns": 0,\n'))
    assert result.returncode == 1
    assert "error: SEARCH_R1_CONFIGS['max_turns']=0 is out of range; accepted: 1 to 128" in result.stderr
    result = run_script("--dry-run", script=edited_copy('        "max_turns": compute_turns(),\n'))
    assert result.returncode == 1
    assert "is not search_r1_configs({...}) of a literal dict" in result.stderr
    skipped = run_script("--dry-run", script=edited_copy('        "max_turns": compute_turns(),\n'),
                         SKIP_PLUGIN_CHECK="1")  # fmt: skip
    assert skipped.returncode == 0, skipped.stderr
    assert "the flags follow the environment and the defaults" in skipped.stderr


def test_an_extensions_setting_reaches_the_job_too(tmp_path):
    """A setting registered by an extension module is forwarded like the built-in ones (no list to edit)."""
    (tmp_path / "my_extension.py").write_text(
        "from slime_search_r1.settings.kinds import Integer\n"
        "from slime_search_r1.settings.table import Setting, register_setting\n"
        "register_setting(Setting('my_extension.retries', 2, Integer(0, 9), 'MY_EXTENSION_RETRIES'))\n"
    )
    env = {"SEARCH_R1_EXTENSIONS": "my_extension", "PYTHONPATH": str(tmp_path)}
    run = dry_run_script(MY_EXTENSION_RETRIES="5", **env)
    assert run.runtime_env["MY_EXTENSION_RETRIES"] == "5"
    assert run.sources["my_extension.retries"] == ("5", "environment variable MY_EXTENSION_RETRIES")
    assert str(tmp_path) in run.runtime_env["PYTHONPATH"].split(":")  # the job imports it too
    result = run_script("--dry-run", MY_EXTENSION_RETRIES="50", **env)
    assert result.returncode == 1
    assert "environment variable MY_EXTENSION_RETRIES='50' is out of range; accepted: 0 to 9" in result.stderr


def test_every_flag_is_a_real_slime_megatron_or_sglang_flag():
    for run in (every_flag_run(), every_flag_run(ASYNC_MODE="fully", LLM_API_MODE="chat")):
        flags = {arg for arg in run.train_args if arg.startswith("--")}
        assert flags - SLIME_FLAGS - MEGATRON_FLAGS - SGLANG_FLAGS == set()


@pytest.mark.skipif(
    not using_real_slime(),
    reason="needs slime's own parser, from a slime checkout: git clone https://github.com/THUDM/slime /tmp/slime, "
    "then SLIME_SRC=/tmp/slime make test (or SLIME_SRC=/tmp/slime .venv/bin/python -m pytest tests/launch)",
)
@pytest.mark.parametrize("async_mode", ["off", "fully"])
def test_slimes_own_parser_reads_every_slime_flag_of_the_command(tmp_path, monkeypatch, async_mode):
    """With a slime checkout, its real parser reads the command: every flag that is not Megatron's or SGLang's is
    slime's, with a value of slime's type (argparse refuses "abc" for an int flag), and the typed list is slime's."""
    parser = slime_argument_parser(monkeypatch)
    assert SLIME_FLAGS - set(parser._option_string_actions) == set()  # the list the stand-in run checks is slime's
    run = every_flag_run(ASYNC_MODE=async_mode)
    known, unknown = parser.parse_known_args(run.train_args)
    assert {arg for arg in unknown if arg.startswith("--")} - MEGATRON_FLAGS - SGLANG_FLAGS == set()
    assert known.rollout_max_response_len == 2048
    assert known.custom_generate_function_path == "generate_with_search.generate"
    if async_mode == "fully":
        assert (known.colocate, known.actor_num_gpus_per_node, known.rollout_num_gpus) == (False, 4, 4)
        assert (known.rollout_function_path, known.eval_function_path) == (FULLY_ASYNC_ROLLOUT, DEFAULT_ROLLOUT)
        assert run.entry[1].endswith("/train_async.py")
    else:
        assert (known.colocate, known.actor_num_gpus_per_node, known.rollout_num_gpus) == (True, 8, None)
        assert known.rollout_function_path == DEFAULT_ROLLOUT


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed: apt-get install -y shellcheck (CI's .ci/run installs it)",
)
def test_scripts_are_shellcheck_clean():
    scripts = [str(SCRIPT), str(REPO / "run_qwen2.5_3B_with_retrieval.sh")]
    result = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_no_setting_is_resolved_in_the_scripts():
    """The scripts hold paths and slime flags; every other value is Python's (settings/table.py)."""
    for script in (SCRIPT, REPO / "run_qwen2.5_3B_with_retrieval.sh"):
        code = re.sub(r"#.*", "", script.read_text())
        defaults = set(re.findall(r"\$\{(\w+):-", code))
        assert defaults <= {"HF_CHECKPOINT", "REF_LOAD", "PROMPT_DATA", "PYTHON_BIN"}, defaults
        assert not re.search(r"\bcase\b|\bif\b|\[\[", code)  # no mode names, booleans or checks
    assert len(SCRIPT.read_text().splitlines()) <= 200


# ---- what a real run starts and stops, with a stand-in `ray` -------------------------------------------------


@pytest.fixture
def slime_tree(tmp_path):
    """A slime checkout whose train.py records what it got (and says so on a FIFO), checkpoints and data that
    exist, and a stand-in `ray` on the PATH."""
    slime = tmp_path / "slime"
    (slime / "scripts" / "models").mkdir(parents=True)
    (slime / "scripts" / "models" / "qwen2.5-3B.sh").write_text("MODEL_ARGS=(--num-layers 36 --hidden-size 2048)\n")
    started = tmp_path / "train_started"
    os.mkfifo(started)
    (slime / "train.py").write_text(
        "import json, os, sys, time\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(os.environ['TRAIN_RECORD'], 'w'))\n"
        "if os.environ.get('TRAIN_HOLD'):\n"
        "    with open(os.environ['TRAIN_STARTED'], 'w') as fifo:  # the test reads it: the job is running\n"
        "        fifo.write('started')\n"
        "    time.sleep(300)\n"
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
        "TRAIN_STARTED": str(started),
        "EXTRA_RUNTIME_ENV_VARS": "TRAIN_RECORD,TRAIN_HOLD TRAIN_EXIT TRAIN_STARTED",
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
    submitted = next(call for call in ray_calls(env) if call["event"] == "job-submitted")
    assert not any("sk-secret" in arg for arg in submitted["argv"])  # never on a command line
    assert (submitted["runtime_env_mode"], submitted["folder_mode"]) == (0o600, 0o700)  # a private file
    assert not list(tmp_path.glob("search-r1-run.*"))  # the private runtime-env folder is removed


def test_a_failed_job_fails_the_script(slime_tree):
    env = clean_env(**slime_tree, TRAIN_EXIT="3")
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1  # what `ray job submit` reports for any failed job
    assert [call["event"] for call in ray_calls(env)][-1] == "head-stopped"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_stops_the_job_it_submitted_and_the_head_it_started(slime_tree, signum, code):
    env = clean_env(**slime_tree, TRAIN_HOLD="1")
    # SIGINT's default action restored: a suite started without job control hands its children SIGINT ignored
    process = subprocess.Popen(
        interruptible(["bash", str(SCRIPT)]), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    with open(env["TRAIN_STARTED"]) as fifo:  # returns once train.py runs: an event, not a polling window
        assert fifo.read() == "started"
    submitted = next(c for c in ray_calls(env) if c["event"] == "job-submitted")
    head = next(c for c in ray_calls(env) if c["event"] == "head-started")
    started = process_tree.tree(process.pid)

    try:
        process.send_signal(signum)  # to the script alone, not its process group
        process.communicate(timeout=60)
        assert process_tree.survivors(started) == []  # every process it had started, found by PID
        assert process.returncode == code
        stops = [c for c in ray_calls(env) if c["event"] == "job-stop"]
        assert [c["job_id"] for c in stops] == [submitted["job_id"]]
        assert any(c["event"] == "head-stopped" for c in ray_calls(env))
        assert not alive(submitted["job_pid"])
        assert not alive(head["pid"])
    finally:  # if the script failed to, stop what this test started (by PID)
        for pid in (submitted["job_pid"], submitted["pid"], head["pid"], process.pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_the_head_starts_stops_the_head(slime_tree, tmp_path, signum):
    """A head that has not answered yet is already the run's own: a signal then stops it too."""
    starting = tmp_path / "head_starting"
    os.mkfifo(starting)
    slow = tmp_path / "slow_bin"
    slow.mkdir()
    (slow / "ray").write_text(  # `ray start` that never answers on its dashboard (a head still loading)
        f'#!/bin/sh\nif [ "$1" = start ]; then echo starting > {starting}; exec sleep 300; fi\n'
        f'exec {sys.executable} {FAKE_RAY} "$@"\n'
    )
    (slow / "ray").chmod(0o755)
    env = clean_env(**{**slime_tree, "PATH": f"{slow}{os.pathsep}{slime_tree['PATH']}"})
    process = subprocess.Popen(interruptible(["bash", str(SCRIPT)]), env=env, stderr=subprocess.PIPE, text=True)
    started = []
    try:
        with open(starting) as fifo:  # returns once the head runs: an event, not a polling window
            assert fifo.read() == "starting\n"
        started = process_tree.tree(process.pid)
        assert len(started) == 2, started  # the launch (bash and its python, one PID) and the head
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)  # the head gets 60 s after SIGTERM; only against a hang
        assert process_tree.survivors(started) == []
        assert process.returncode == 128 + signum, err
        assert "stopping the Ray head this run started" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        process_tree.kill(started)


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
    finally:
        dashboard.shutdown()
        dashboard.server_close()


def test_a_real_run_stops_at_a_missing_path_before_ray(slime_tree):
    result = run_script(**{**slime_tree, "PROMPT_DATA": "/nonexistent/train.parquet"})
    assert result.returncode == 1
    assert "error: training data (--prompt-data) not found: /nonexistent/train.parquet" in result.stderr
    assert ray_calls(slime_tree) == []


def test_a_real_run_names_every_missing_path_at_once(slime_tree):
    missing = {"PROMPT_DATA": "/nonexistent/train.parquet", "HF_CHECKPOINT": "/nonexistent/Qwen2.5-3B",
               "REF_LOAD": "/nonexistent/Qwen2.5-3B_torch_dist"}  # fmt: skip
    result = run_script(**{**slime_tree, **missing})
    assert result.returncode == 1
    assert "error: 3 paths are missing" in result.stderr
    for variable, path in missing.items():
        assert f"not found: {path}" in result.stderr, variable
    assert ray_calls(slime_tree) == []


def test_dumps_for_the_viewer_and_the_printed_viewer_command_runs(viewer_dumps):
    """slime writes the dumps at every rollout (it has no interval); the printed command runs on them as it is."""
    dumps = f"{viewer_dumps.folder}/rollout_data/{{rollout_id}}.pt"
    run = dry_run_script("--save-debug-rollout-data", dumps, HF_CHECKPOINT=str(viewer_dumps.folder / "tokenizer"))
    comment, command = run.after[:2]
    assert comment.startswith("# trajectory viewer")
    result = subprocess.run(["bash", "-c", command.replace("python3", sys.executable, 1)], env=clean_env(),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    page = (viewer_dumps.folder / "viewer" / "index.html").read_text(encoding="utf-8")
    assert '"name":"rollout 3"' in page and '"name":"eval 3"' in page  # --rollouts=-1: the latest rollout


def test_a_dry_run_prints_the_way_from_its_checkpoints_to_evaluate_py(slime_tree, tmp_path):
    import evaluate

    (Path(slime_tree["SLIME_DIR"]) / "scripts" / "models" / "qwen2.5-3B.sh").write_text(
        "MODEL_ARGS=(--num-layers 36 --vocab-size 151936)\n"
    )
    save = tmp_path / "ckpt"
    (save / "iter_0000019").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("19")  # Megatron's tracker: slime saves rollout_id 19
    run = dry_run_script("--save", str(save), "--save-interval", "20", **slime_tree)
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
    assert (cli.hf_checkpoint, cli.output_dir, cli.reference, cli.viewer, cli.llm_api_mode) == (
        f"{save}/hf/iter_0000019",
        save / "eval" / "iter_0000019",
        "search-r1-base-grpo",
        True,
        "generate",
    )
    assert str(cli.data) == "/root/Search-R1/data/nq_hotpotqa_train/test.parquet"
    instruct = dry_run_script("--save", str(save), **{**slime_tree, "HF_CHECKPOINT": "/models/Qwen2.5-3B-Instruct"})
    assert "--reference search-r1-instruct-grpo" in instruct.after[-1]
    assert dry_run_script().after[-1].startswith("# no --save: no checkpoint is saved")


def converter_flags() -> set[str]:
    """The converter's flags: read from a real slime checkout's file, else the hand-checked list."""
    from support.slime_compat import slime_src

    source = slime_src()
    if source is None:
        return CONVERTER_FLAGS
    text = (source / "tools" / "convert_torch_dist_to_hf.py").read_text()
    return set(re.findall(r'add_argument\(\s*(?:"-\w",\s*)?"(--[\w-]+)"', text))
