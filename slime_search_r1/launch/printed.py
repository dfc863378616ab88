"""What a dry run prints (stdout; comment lines start with #): every value with where it came from, the memory plan
of a retrieval server sharing the node (NODE_RETRIEVER_LAYOUT), the Ray runtime env with secrets as <hidden>, the Ray
head and job commands, then the viewer command for slime's dumps (--save-debug-rollout-data) and the commands from
the latest checkpoint under --save to evaluate.py."""

import json
import shlex
from pathlib import Path

from slime_search_r1.launch.command import RAY_HEAD_ADDRESS, SCRIPT_PATHS, Launch, config_value
from slime_search_r1.settings.sources import value_source
from slime_search_r1.settings.table import LAUNCH, PLUGIN, read_by

DEFAULT_EVAL_DATA = "/root/Search-R1/data/nq_hotpotqa_train/test.parquet"
RAY = "ray"  # the ray command of slime's environment


def _aligned(rows: list[tuple[str, str]]) -> list[str]:
    width = min(56, max(len(left) for left, _ in rows))
    return [f"#   {left:<{width}}  <- {right}" for left, right in rows]


def sources(launch: Launch) -> list[str]:
    rows = []
    for setting in read_by(PLUGIN):
        value = config_value(launch.config, setting.key)
        shown = "<hidden>" if setting.secret and value else repr(value)
        rows.append((f"{setting.key} = {shown}", value_source(launch.configs, setting)))
    knob_rows = [(f"{s.env}={getattr(launch.knobs, s.key)!r}", launch.knob_sources[s.key]) for s in read_by(LAUNCH)]
    path_rows = [(f"{variable}={value!r}", where) for variable, (value, where) in launch.paths.items()]
    return [
        f"# the plugin's settings (default < SEARCH_R1_CONFIGS in {launch.plugin} < environment variable):",
        *_aligned(rows),
        "# the launch's settings (default < environment variable; python -m slime_search_r1.launch --list):",
        *_aligned(knob_rows),
        f"# the script's paths, as {', '.join(SCRIPT_PATHS.values())} (default in the script < environment "
        "variable < the script's command line):",
        *_aligned(path_rows),
    ]


def runtime_env_json(launch: Launch, hide_secrets: bool) -> str:
    env = {k: "<hidden>" if hide_secrets and k in launch.secret_names else v for k, v in launch.runtime_env.items()}
    return json.dumps({"env_vars": env}, indent=2, sort_keys=True) + "\n"


def head_command(launch: Launch) -> list[str]:
    return [RAY, "start", "--head", "--block", "--node-ip-address", RAY_HEAD_ADDRESS,
            "--num-gpus", str(launch.knobs.num_gpus), "--disable-usage-stats",
            "--dashboard-port", str(launch.knobs.ray_dashboard_port)]  # fmt: skip


def submit_command(launch: Launch, runtime_env_file: str) -> list[str]:
    return [RAY, "job", "submit", "--address", launch.dashboard_url, "--submission-id", launch.job_id,
            "--runtime-env", runtime_env_file, "--", *launch.entry, *launch.train_args]  # fmt: skip


def dump_folder(launch: Launch) -> str | None:
    """The folder of slime's dumps (--save-debug-rollout-data DIR/rollout_data/{rollout_id}.pt, as --dump-details
    lays them out: the viewer reads rollout_data/ and train_data/ under DIR), or None without dumps."""
    template = launch.flags.save_debug_rollout_data
    if not template:
        return None
    folder = Path(template).parent
    return str(folder.parent if folder.name == "rollout_data" else folder)


def viewer_command(launch: Launch) -> str:
    """The latest rollout's dumps, as one offline page."""
    dumps = dump_folder(launch)
    words = [launch.knobs.python_bin, "-m", "slime_search_r1.viewer", dumps, "--rollouts=-1:", "--tokenizer",
             launch.flags.hf_checkpoint, "--output", f"{dumps}/viewer"]  # fmt: skip
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
    # the paper's GRPO row of the same model kind; the printed command is the place to name another
    reference = "search-r1-instruct-grpo" if "instruct" in hf.lower() else "search-r1-base-grpo"
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
    lines = sources(launch)
    if launch.memory:
        lines += ["# the retrieval server sharing this node (NODE_RETRIEVER_*), checked beside training:"]
        lines += [f"# {line}" for line in launch.memory.lines]
    lines.append("# Ray runtime env (written to a private file at run time; secrets shown as <hidden>):")
    lines.append(runtime_env_json(launch, hide_secrets=True).rstrip("\n"))
    lines += [
        f"# Ray head, started only if nothing answers at {launch.dashboard_url}:",
        shlex.join(head_command(launch)),
    ]
    lines += ["# training job:", shlex.join(submit_command(launch, "<runtime-env-file>"))]
    if dump_folder(launch):
        lines += ["# trajectory viewer, while or after training (--rollouts=-1: the latest rollout; ::50 every 50th; "
                  "10,20 those):", viewer_command(launch)]  # fmt: skip
    lines += checkpoint_commands(launch)
    return "\n".join(lines) + "\n"
