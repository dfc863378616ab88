"""What a dry run prints (stdout; comment lines start with #): every value with where it came from, the memory plan
of a retrieval server sharing the node (NODE_RETRIEVER_LAYOUT), the Ray runtime env with secrets as <hidden>, the Ray
head and job commands, then the viewer command for DUMP_DIR and the commands from the latest checkpoint under --save
to evaluate.py."""

import json
import shlex

from slime_search_r1.launch.command import Launch, config_value
from slime_search_r1.launch.knobs import SCRIPT_PATHS, TRAINING
from slime_search_r1.settings import SETTINGS, value_source

DEFAULT_EVAL_DATA = "/root/Search-R1/data/nq_hotpotqa_train/test.parquet"


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = min(56, max(len(left) for left, _ in rows))
    return [f"#   {left:<{width}}  <- {right}" for left, right in rows]


def sources(launch: Launch) -> list[str]:
    rows = []
    for setting in SETTINGS.values():
        value = config_value(launch.config, setting.key)
        shown = "<hidden>" if setting.secret and value else repr(value)
        rows.append((f"{setting.key} = {shown}", value_source(launch.configs, setting)))
    knob_rows = [(f"{s.env}={getattr(launch.knobs, key)!r}", launch.knob_sources[key]) for key, s in TRAINING.items()]
    path_rows = [(f"{variable}={value!r}", where) for variable, (value, where) in launch.paths.items()]
    return [
        f"# the plugin's settings (default < SEARCH_R1_CONFIGS in {launch.plugin} < environment variable):",
        *_aligned(rows),
        "# the launch's knobs (default < environment variable; python -m slime_search_r1.launch --help):",
        *_aligned(knob_rows),
        f"# the script's paths, as {', '.join(SCRIPT_PATHS.values())} (default in the script < environment "
        "variable < EXTRA_TRAIN_ARGS < the script's command line):",
        *_aligned(path_rows),
    ]


def runtime_env_json(launch: Launch, hide_secrets: bool) -> str:
    env = {k: "<hidden>" if hide_secrets and k in launch.secret_names else v for k, v in launch.runtime_env.items()}
    return json.dumps({"env_vars": env}, indent=2, sort_keys=True) + "\n"


def head_command(launch: Launch) -> list[str]:
    knobs = launch.knobs
    return [knobs.ray_bin, "start", "--head", "--block", "--node-ip-address", knobs.master_addr,
            "--num-gpus", str(knobs.num_gpus), "--disable-usage-stats",
            "--dashboard-port", str(knobs.ray_dashboard_port)]  # fmt: skip


def submit_command(launch: Launch, runtime_env_file: str) -> list[str]:
    knobs = launch.knobs
    return [knobs.ray_bin, "job", "submit", "--address", knobs.ray_dashboard_url, "--submission-id", knobs.job_id,
            "--runtime-env", runtime_env_file, "--", *launch.entry, *launch.train_args]  # fmt: skip


def viewer_command(launch: Launch) -> str:
    """The latest rollout's dumps under DUMP_DIR, as one offline page."""
    dump_dir, knobs = launch.knobs.dump_dir, launch.knobs
    words = [knobs.python_bin, "-m", "slime_search_r1.viewer", dump_dir, "--rollouts=-1:", "--tokenizer",
             launch.flags.hf_checkpoint, "--output", f"{dump_dir}/viewer"]  # fmt: skip
    return f"PYTHONPATH={shlex.quote(str(launch.plugin.parent))} {shlex.join(words)}"


def checkpoint_commands(launch: Launch) -> list[str]:
    """From the latest checkpoint under --save (Megatron torch_dist, iter_<7 digits>/, its number in
    latest_checkpointed_iteration.txt) to a Hugging Face folder with slime's converter, served, then evaluate.py."""
    flags, knobs, q = launch.flags, launch.knobs, shlex.quote
    if not flags.save:
        return ["# no --save: no checkpoint is saved (add --save DIR --save-interval 20 to CKPT_ARGS or the command "
                "line to get the commands from a checkpoint to evaluate.py)"]  # fmt: skip
    save, hf = flags.save.rstrip("/"), flags.hf_checkpoint
    vocab = (
        launch.model_args[launch.model_args.index("--vocab-size") + 1] if "--vocab-size" in launch.model_args else None
    )
    reference = knobs.reference or ("search-r1-instruct-grpo" if "instruct" in hf.lower() else "search-r1-base-grpo")
    eval_data = (flags.eval_prompt_data or [None, DEFAULT_EVAL_DATA])[1].rsplit("@[", 1)[0]
    python, it = q(knobs.python_bin), '"$ITER"'
    lines = ["# after training: the latest checkpoint under --save to Hugging Face (slime's converter), served, "
             "evaluated:"]  # fmt: skip
    if vocab is None:
        lines.append("# (no --vocab-size in MODEL_ARGS_FILE: add the model's own if Megatron padded the embedding)")
    lines += [
        f'ITER=$(printf iter_%07d "$(cat {q(save + "/latest_checkpointed_iteration.txt")})")',
        # Megatron pads the embedding; --vocab-size (the model's, from MODEL_ARGS_FILE) removes the padding again
        f"PYTHONPATH={q(knobs.megatron_path)} {python} {q(knobs.slime_dir + '/tools/convert_torch_dist_to_hf.py')} "
        f"--input-dir {q(save)}/{it} --output-dir {q(save + '/hf')}/{it} --origin-hf-dir {q(hf)}"
        + (f" --vocab-size {q(vocab)}" if vocab else ""),
        f"{python} -m sglang.launch_server --model-path {q(save + '/hf')}/{it} --port 30000 &",
        f"{python} {q(str(launch.plugin.parent / 'evaluate.py'))} --data {q(eval_data)} --hf-checkpoint "
        f"{q(save + '/hf')}/{it} --sglang-url http://127.0.0.1:30000 --output-dir {q(save + '/eval')}/{it} "
        f"--llm-api-mode {launch.config.llm_api_mode} --reference {q(reference)} --viewer",
    ]
    return lines


def dry_run(launch: Launch) -> str:
    knobs = launch.knobs
    lines = sources(launch)
    if launch.memory:
        lines += ["# the retrieval server sharing this node (NODE_RETRIEVER_*), checked beside training:"]
        lines += [f"# {line}" for line in launch.memory.lines]
    lines.append("# Ray runtime env (written to a private file at run time; secrets shown as <hidden>):")
    lines.append(runtime_env_json(launch, hide_secrets=True).rstrip("\n"))
    url = knobs.ray_dashboard_url
    if knobs.start_ray == "0":
        lines.append(f"# Ray head: not started (START_RAY=0); the job goes to {url}")
    else:
        when = "started only if nothing answers at " + url if knobs.start_ray == "auto" else "always started"
        lines += [f"# Ray head, {when} (START_RAY={knobs.start_ray}):", shlex.join(head_command(launch))]
    lines += ["# training job:", shlex.join(submit_command(launch, "<runtime-env-file>"))]
    if knobs.dump_dir:
        lines += ["# trajectory viewer, while or after training (--rollouts=-1: the latest rollout; ::50 every 50th; "
                  "10,20 those):", viewer_command(launch)]  # fmt: skip
    lines += checkpoint_commands(launch)
    return "\n".join(lines) + "\n"
