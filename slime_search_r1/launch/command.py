"""What run_qwen2.5_3B.sh launches, decided once: the values (the plugin's settings and the launch's, each with where
it came from), the flags they add to the script's slime flags, the checks, and the Ray runtime env.

The train.py command is, in this order: the cluster flags, MODEL_ARGS, the script's arrays, the flags the values
imply (below), then the script's own arguments; slime's parser keeps the last of a repeated flag, so what the user
appends wins.
"""

import argparse
import functools
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from slime_search_r1.launch import slime_parser
from slime_search_r1.launch.checks import check_plugin, configs_from_source
from slime_search_r1.launch.presets import MODEL_PRESETS
from slime_search_r1.launch.retriever_memory import Checked, check_node_retriever, declared_training
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import SearchR1Configs, read_environment, resolve_config, search_r1_configs
from slime_search_r1.settings.table import LAUNCH, PLUGIN, SETTINGS, read_by
from slime_search_r1.settings.view import SearchR1Config, Section
from slime_search_r1.slime_flags import DEFAULT_ROLLOUT, FULLY_ASYNC_ROLLOUT, plugin_flag_parser

# Plugin settings that change the command: the job gets the resolved value, so it trains the mode the flags are for.
FLAG_SHAPING = ("llm_api_mode",)
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
# run_qwen2.5_3B.sh's own variables (VARIABLE=${VARIABLE:-default}) and the flag each one's value goes into; a dry
# run prints each with where its flag's value came from.
SCRIPT_PATHS = {"HF_CHECKPOINT": "--hf-checkpoint", "REF_LOAD": "--ref-load", "PROMPT_DATA": "--prompt-data"}
# One node: the Ray head this launch starts (or finds) listens on the loopback address, as slime's examples do.
RAY_HEAD_ADDRESS = "127.0.0.1"
SCRIPT_DEFAULT = "default in the script"  # where a path came from when nobody changed it


@dataclass
class Launch:
    plugin: Path
    configs: SearchR1Configs  # SEARCH_R1_CONFIGS as resolved (with where each value came from)
    config: SearchR1Config
    knobs: Section  # the launch's settings
    knob_sources: dict[str, str]
    dry_run: bool
    model_args: list[str]
    train_args: list[str]  # every train.py flag
    entry: list[str]  # python and slime's train.py / train_async.py
    runtime_env: dict[str, str]
    secret_names: set[str]
    job_id: str
    warnings: list[str] = field(default_factory=list)
    memory: Checked | None = None  # the plan of a retrieval server sharing the node (NODE_RETRIEVER_LAYOUT)
    # the script's path variables (SCRIPT_PATHS): their flag's value and where it came from
    paths: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    @functools.cached_property
    def flags(self) -> argparse.Namespace:
        return read_flags(self.train_args)

    @property
    def dashboard_url(self) -> str:
        return f"http://{RAY_HEAD_ADDRESS}:{self.knobs.ray_dashboard_port}"


def read_flags(train_args: list[str]) -> argparse.Namespace:
    """The slime flags the launcher itself reads (the last of a repeated flag, as slime's parser keeps)."""
    try:
        return _launch_parser().parse_known_args(train_args)[0]
    except argparse.ArgumentError as exc:
        raise ConfigError(f"train.py's flags: {exc}") from None


def _launch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag in ("--hf-checkpoint", "--ref-load", "--load", "--save", "--prompt-data", "--custom-config-path",
                 "--save-debug-rollout-data"):  # fmt: skip
        parser.add_argument(flag)
    parser.add_argument("--eval-prompt-data", nargs="+")
    for flag in ("--rollout-num-gpus-per-engine", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--context-parallel-size"):  # fmt: skip
        parser.add_argument(flag, type=int, default=1)
    parser.add_argument("--apply-chat-template", action="store_true")
    # what training holds on each GPU (retriever_memory.declared_training), with slime's defaults
    parser.add_argument("--colocate", action="store_true")
    for flag in ("--actor-num-gpus-per-node", "--num-gpus-per-node"):
        parser.add_argument(flag, type=int, default=8)
    parser.add_argument("--rollout-num-gpus", type=int)
    parser.add_argument("--sglang-mem-fraction-static", type=float)
    return parser


def check_flags(knobs: Section, train_args: list[str], user_args: list[str]) -> list[str]:
    """Every flag of train.py's command checked by slime's own parser (slime_parser.py), or without slime against
    the flags the launch knows. Returns warnings."""
    slime = slime_parser.build(knobs.slime_dir, knobs.megatron_path)
    known = {*_launch_parser()._option_string_actions, *plugin_flag_parser()._option_string_actions}
    return slime_parser.check_command(train_args, user_args, slime, known, knobs.slime_dir)


def path_sources(script_args: list[str], user_args: list[str], environ) -> dict[str, tuple]:
    """Each of the script's path variables (SCRIPT_PATHS): the value its flag ends with and where that came from, in
    the order they apply: the script's default, the variable (the script reads it), the script's command line (the
    last of a repeated flag wins, as in slime's parser)."""
    found = {}
    for variable, flag in SCRIPT_PATHS.items():
        dest = flag.lstrip("-").replace("-", "_")
        value, where = getattr(read_flags(user_args), dest), "the script's command line"
        if value is None:
            value, where = getattr(read_flags(script_args), dest), None
        if value is None:
            where = f"not set: the script's flags have no {flag}"
        elif where is None:
            exported = environ.get(variable) or None  # the script's ${VARIABLE:-default}: an empty one is unset
            if exported == value:
                where = f"environment variable {variable}"
            elif exported is None:
                where = f"{SCRIPT_DEFAULT} (export {variable} to change it)"
            else:
                where = f"the script's flags ({variable}={exported} in the environment is not what they hold)"
        found[variable] = (value, where)
    return found


def with_preset_paths(model: str, script_args: list[str], paths: dict[str, tuple]) -> list[str]:
    """The script's flags with MODEL's checkpoints in place of the script's default paths (a path the user
    exported or passed stays); `paths` (path_sources) is updated to say where each came from."""
    args = list(script_args)
    for variable, path in MODEL_PRESETS[model].paths().items():
        value, where = paths[variable]
        if value is None or not where.startswith(SCRIPT_DEFAULT):
            continue
        flag = SCRIPT_PATHS[variable]
        args[len(args) - args[::-1].index(flag)] = path  # the value of the last one, which slime keeps
        paths[variable] = (path, f"MODEL={model}'s checkpoint (export {variable} to change it)")
    return args


def read_model_args(path: str) -> list[str]:
    """MODEL_ARGS as the bash file sets it (slime's scripts/models/*.sh)."""
    script = 'source "$1" >&2 && printf "%s\\0" "${MODEL_ARGS[@]}"'
    result = subprocess.run(["bash", "-c", script, "bash", path], capture_output=True, text=True)
    if result.returncode != 0:
        raise ConfigError(f"MODEL_ARGS_FILE={path} failed in bash: {result.stderr.strip()[-500:]}")
    return result.stdout.split("\0")[:-1]


def cluster_flags(knobs: Section) -> list[str]:
    """Colocated on every GPU, or (ASYNC_MODE=fully) training on ACTOR_GPUS and rollout on the rest."""
    gpus = str(knobs.num_gpus)
    if knobs.async_mode == "fully":
        return ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(knobs.actor_gpus),
                "--rollout-num-gpus", str(knobs.num_gpus - knobs.actor_gpus), "--num-gpus-per-node", gpus]  # fmt: skip
    return ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", gpus, "--num-gpus-per-node", gpus, "--colocate"]


def implied_flags(knobs: Section, config: SearchR1Config) -> list[str]:
    """The flags the values imply."""
    flags = []
    kwargs = MODEL_PRESETS[knobs.model].chat_template_kwargs
    if kwargs:  # slime's template (XML mode) and the chat renderer (chat mode) both read them
        flags += ["--apply-chat-template-kwargs", json.dumps(kwargs)]
    if knobs.async_mode == "fully":
        # slime evaluates with the rollout function unless told otherwise, and the fully-async one cannot
        flags += ["--rollout-function-path", FULLY_ASYNC_ROLLOUT, "--eval-function-path", DEFAULT_ROLLOUT]
    if config.llm_api_mode == "chat":
        flags += ["--tool-key", "tools", "--eval-tool-key", "tools"]  # prompts stay message lists
    else:
        flags += ["--apply-chat-template"]  # XML tags on the templated prompt, as Search-R1
    return flags


def check_gpu_split(knobs: Section, flags: argparse.Namespace, sources: dict[str, str]) -> list[str]:
    """ASYNC_MODE=fully: the split must leave GPUs to both and suit the engines and Megatron; returns warnings."""
    if knobs.async_mode != "fully":
        if sources["actor_gpus"].startswith("environment"):
            return ["ACTOR_GPUS applies with ASYNC_MODE=fully only; ASYNC_MODE=off colocates training and rollout on "
                    "all NUM_GPUS"]  # fmt: skip
        return []
    actor, rollout = knobs.actor_gpus, knobs.num_gpus - knobs.actor_gpus
    if knobs.num_gpus < 2:
        raise ConfigError(
            f"ASYNC_MODE=fully trains and generates on GPUs of their own, but NUM_GPUS={knobs.num_gpus}; accepted: "
            "NUM_GPUS of 2 or more, or ASYNC_MODE=off"
        )
    if not 1 <= actor < knobs.num_gpus:
        raise ConfigError(
            f"ACTOR_GPUS={actor} leaves {rollout} of NUM_GPUS={knobs.num_gpus} to generate; accepted: ACTOR_GPUS from "
            f"1 to {knobs.num_gpus - 1} (training and rollout each on GPUs of their own)"
        )
    per_engine = flags.rollout_num_gpus_per_engine
    if rollout % per_engine:
        raise ConfigError(
            f"NUM_GPUS - ACTOR_GPUS = {rollout} rollout GPUs is not a multiple of --rollout-num-gpus-per-engine "
            f"{per_engine}; accepted: ACTOR_GPUS that leaves a multiple of {per_engine}"
        )
    model_parallel = flags.tensor_model_parallel_size * flags.pipeline_model_parallel_size
    model_parallel *= flags.context_parallel_size
    if actor % model_parallel:
        raise ConfigError(
            f"ACTOR_GPUS={actor} is not a multiple of Megatron's tensor x pipeline x context parallel size "
            f"{model_parallel}; accepted: a multiple of {model_parallel}"
        )
    return []


def missing_paths(launch: Launch) -> list[str]:
    """What a real run would miss: one line each (a dry run only warns)."""
    flags, knobs = launch.flags, launch.knobs
    wanted = [("slime's " + Path(launch.entry[1]).name + " (SLIME_DIR)", launch.entry[1]),
              ("model architecture flags (MODEL_ARGS_FILE)", knobs.model_args_file),
              ("Hugging Face checkpoint (--hf-checkpoint)", flags.hf_checkpoint),
              ("Megatron reference checkpoint (--ref-load)", flags.ref_load),
              ("checkpoint to resume (--load)", flags.load),
              ("training data (--prompt-data)", flags.prompt_data),
              ("TIS config (--custom-config-path)", flags.custom_config_path)]  # fmt: skip
    eval_data = flags.eval_prompt_data or []
    wanted += [("evaluation data (--eval-prompt-data)", path) for path in eval_data[1::2]]
    # slime's path@[start:end] reads a slice of the file
    found = [(what, re.sub(r"@\[[^]]*\]$", "", path)) for what, path in wanted if path]
    return [f"{what} not found: {path}" for what, path in found if not os.path.exists(path)]


def runtime_env(knobs: Section, config: SearchR1Config, plugin_dir: Path, environ) -> tuple[dict[str, str], set]:
    """The job's environment: the paths slime and the plugin import from (slime's examples too: TIS's helper), every
    plugin variable that is set, the flag-shaping settings as resolved, the wandb key, and EXTRA_RUNTIME_ENV_VARS.
    Returns it and its secrets."""
    paths = [knobs.megatron_path, str(plugin_dir), knobs.slime_dir, *environ.get("PYTHONPATH", "").split(":")]
    env = {"PYTHONPATH": ":".join(dict.fromkeys(p for p in paths if p)), "CUDA_DEVICE_MAX_CONNECTIONS": "1",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    secrets = set()
    for setting in read_by(PLUGIN):
        if setting.env and environ.get(setting.env):
            env[setting.env] = environ[setting.env]
        if setting.secret and setting.env:
            secrets.add(setting.env)
    for key in FLAG_SHAPING:
        env[SETTINGS[key].env] = str(config_value(config, key))
    wandb_key = environ.get("WANDB_API_KEY") or environ.get("WANDB_KEY")
    if wandb_key:  # for --use-wandb (WANDB_ARGS); only ever in the private runtime-env file
        env["WANDB_API_KEY"] = wandb_key
    for name in (knobs.extra_runtime_env_vars or "").replace(",", " ").split():
        if environ.get(name):
            env[name] = environ[name]
    secrets |= {name for name in env if SECRET_NAME.search(name)}
    return env, secrets


def config_value(config: SearchR1Config, key: str):
    section, _, name = key.rpartition(".")
    return getattr(getattr(config, section) if section else config, name)


def resolve_launch(plugin: Path, script_args: list[str], user_args: list[str], environ, dry_run: bool) -> Launch:
    """Every value, flag and check of one launch; raises ConfigError on the first thing that cannot work."""
    knobs, knob_sources = read_environment(read_by(LAUNCH), environ)
    warnings = []
    try:
        user_dict = configs_from_source(plugin)
    except ConfigError as exc:
        if not knobs.skip_plugin_check:
            raise
        warnings.append(f"{exc}; SKIP_PLUGIN_CHECK is set, so the flags follow the environment and the defaults")
        user_dict = {}
    configs = search_r1_configs(user_dict, environ)
    config = resolve_config(configs)
    model_args = read_model_args(knobs.model_args_file) if os.path.isfile(knobs.model_args_file) else []
    paths = path_sources(script_args, user_args, environ)
    script_args = with_preset_paths(knobs.model, script_args, paths)
    train_args = [*cluster_flags(knobs), *model_args, *script_args, *implied_flags(knobs, config), *user_args]
    entry = [knobs.python_bin, f"{knobs.slime_dir}/{'train_async.py' if knobs.async_mode == 'fully' else 'train.py'}"]
    env, secrets = runtime_env(knobs, config, plugin.parent, environ)
    job_id = f"search-r1-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    launch = Launch(
        plugin, configs, config, knobs, knob_sources, dry_run, model_args, train_args, entry, env, secrets, job_id,
        warnings, paths=paths,
    )  # fmt: skip
    warnings += check_flags(knobs, train_args, user_args)
    flags = launch.flags
    if config.llm_api_mode == "chat" and flags.apply_chat_template:
        raise ConfigError(
            "--apply-chat-template with LLM_API_MODE=chat: chat mode keeps each prompt a message list (it adds "
            "--tool-key tools); accepted: without --apply-chat-template"
        )
    warnings += check_gpu_split(knobs, flags, knob_sources)
    launch.memory = check_node_retriever(knobs, declared_training(flags))
    if launch.memory:
        warnings += launch.memory.warnings
    if knobs.skip_plugin_check:
        warnings.append("SKIP_PLUGIN_CHECK is set: the slime flags are checked against the settings only at the "
                        "first sample")  # fmt: skip
    else:
        warnings += check_plugin(config, train_args, knobs.legacy_slime_router)
    return launch
