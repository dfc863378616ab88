"""The launch scripts' own knobs: each declared once, read from its environment variable only (the plugin's settings
live in settings.py and SEARCH_R1_CONFIGS), with the kinds and messages of settings.py.

TRAINING: run_qwen2.5_3B.sh (python -m slime_search_r1.launch); WRAPPER: run_qwen2.5_3B_with_retrieval.sh
(python -m slime_search_r1.launch.with_retrieval). `--help` of either prints its table with every default.
"""

import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_dense_retriever.retrieval.memory_plan import COLOCATED_TRAINER_GIB
from slime_search_r1.settings import Choice, Flag, Integer, Number, Refused, Setting, Text

REPO = Path(__file__).absolute().parents[2]  # the plugin's folder: the scripts, generate_with_search.py


@dataclass(frozen=True)
class IdList:
    """A list of CPU or GPU ids as taskset -c takes CPUs (0-7, 0,2,4-6)."""

    what: str = "a CPU list for taskset -c"

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", value.strip()):
            raise Refused(f"{self.what} like 0-7 or 0,2,4-6")
        return value.strip()

    def from_env(self, text: str) -> str:
        return self.check(text)


def expand_ids(text: str) -> list[int]:
    """0,2,4-6 -> [0, 2, 4, 5, 6] (an IdList's value)."""
    ids = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids += [i for i in range(int(low), int(high or low) + 1) if i not in ids]
    return ids


def _slime_dir(_: dict) -> str:
    """Inside slime's tree (examples/search-r1/) the checkout is two levels up; else slime's docker image's."""
    return str(REPO.parents[1]) if (REPO.parents[1] / "train.py").is_file() else "/root/slime"


def _knobs(*settings: Setting) -> dict[str, Setting]:
    return {setting.key: setting for setting in settings}


# Both scripts check the retriever's memory plan beside training (retriever_memory.py) with these two.
GPU_MEMORY = Setting("gpu_memory_gib", None, Number(0.1, optional=True), "GPU_MEMORY_GIB",
                     "memory of each GPU in GiB (default: nvidia-smi's smallest memory.total)")  # fmt: skip
TRAINER_RESIDUAL = Setting("trainer_residual_gib", COLOCATED_TRAINER_GIB, Number(0.0), "TRAINER_RESIDUAL_GIB",
                           "GiB the colocated trainer keeps on each GPU while SGLang generates (slime's release "
                           "notes measured 3-5 GB after offload)")  # fmt: skip

TRAINING = _knobs(
    # ---- what runs
    Setting("dry_run", False, Flag(), "DRY_RUN", "print each value's source and the commands instead (or --dry-run)"),
    Setting("async_mode", "off", Choice(("off", "fully")), "ASYNC_MODE",
            "off: train.py, training and rollout colocated; fully: train_async.py with slime's fully-async rollout "
            "on GPUs of its own"),
    Setting("num_gpus", 8, Integer(1), "NUM_GPUS", "GPUs of the node"),
    Setting("actor_gpus", lambda v: v["num_gpus"] // 2, Integer(1), "ACTOR_GPUS",
            "ASYNC_MODE=fully: GPUs that train (default: half)"),
    Setting("rollout_gpus", lambda v: v["num_gpus"] - v["actor_gpus"], Integer(1), "ROLLOUT_GPUS",
            "ASYNC_MODE=fully: GPUs that generate (default: the rest); ACTOR_GPUS + ROLLOUT_GPUS = NUM_GPUS"),
    # ---- where things are (the checkpoints and data are the script's own variables, in its slime flags)
    Setting("slime_dir", _slime_dir, Text(), "SLIME_DIR", "slime checkout (two levels up inside slime's tree)"),
    Setting("megatron_path", "/root/Megatron-LM", Text(), "MEGATRON_PATH", "Megatron-LM, on the job's PYTHONPATH"),
    Setting("model_args_file", lambda v: f"{v['slime_dir']}/scripts/models/qwen2.5-3B.sh", Text(),
            "MODEL_ARGS_FILE", "bash file that sets MODEL_ARGS, the model's architecture flags"),
    Setting("python_bin", "python3", Text(), "PYTHON_BIN", "the job's Python (and this launcher's)"),
    # ---- flags added for you
    Setting("eval_prompt_data", None, Text(optional=True), "EVAL_PROMPT_DATA",
            "evaluation inside training: adds --eval-interval 25 --eval-prompt-data search_r1_test PATH"),
    Setting("dump_dir", None, Text(optional=True), "DUMP_DIR",
            "slime's debug dumps for the viewer: --save-debug-rollout-data (and -train-data) under DUMP_DIR"),
    Setting("dump_train_data", True, Flag(), "DUMP_TRAIN_DATA", "with DUMP_DIR: the train side too"),
    Setting("use_tis", False, Flag(), "USE_TIS", "--use-tis with slime's MIS helper (TIS_CONFIG_PATH)"),
    Setting("tis_config_path", lambda v: f"{v['slime_dir']}/examples/train_infer_mismatch_helper/mis.yaml", Text(),
            "TIS_CONFIG_PATH", "USE_TIS: --custom-config-path"),
    Setting("tis_function_path", "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp", Text(),
            "TIS_FUNCTION_PATH", "USE_TIS: --custom-tis-function-path"),
    Setting("use_wandb", False, Flag(), "USE_WANDB",
            "--use-wandb (the key: WANDB_API_KEY or WANDB_KEY, passed in the job's environment only)"),
    Setting("extra_train_args", None, Text(optional=True), "EXTRA_TRAIN_ARGS",
            "more train.py flags, split as a shell would; the script's own arguments come after them"),
    Setting("reference", None, Text(optional=True), "REFERENCE",
            "the paper's row evaluate.py --reference shows (default: the GRPO row of a base or Instruct model)"),
    # ---- checks
    Setting("skip_plugin_check", False, Flag(), "SKIP_PLUGIN_CHECK",
            "skip the plugin's checks (generate() still makes them at its first sample)"),
    Setting("legacy_slime_router", False, Flag(), "LEGACY_SLIME_ROUTER",
            "your slime still runs the old router the TOKEN_TRACKING_MODE=router_* modes need"),
    # ---- a retrieval server sharing this node (the wrapper sets these; set them for a server started apart)
    Setting("node_retriever_layout", None, Text(optional=True), "NODE_RETRIEVER_LAYOUT",
            "its layout (torch-fp16, faiss-gpu-fp16, Flat, HNSW32,SQ8, ...: python -m local_dense_retriever."
            "memory_plan): its memory plan is printed and checked beside training"),
    Setting("node_retriever_gpus", None, IdList("GPU ids"), "NODE_RETRIEVER_GPUS",
            "the GPUs its GPU layout uses (default: the node's NUM_GPUS, as --torch_search all and --faiss_gpu)"),
    Setting("node_retriever_corpus_size", None, Integer(1), "NODE_RETRIEVER_CORPUS_SIZE",
            "its passages (wiki-18: 21015324); needed with NODE_RETRIEVER_LAYOUT"),
    Setting("node_retriever_dim", 768, Integer(1), "NODE_RETRIEVER_DIM", "its vector dimension (e5-base-v2: 768)"),
    Setting("node_retriever_mmap", False, Flag(), "NODE_RETRIEVER_MMAP", "its Flat index is memory-mapped"),
    GPU_MEMORY,
    TRAINER_RESIDUAL,
    # ---- Ray
    Setting("start_ray", "auto", Choice(("auto", "1", "0")), "START_RAY",
            "auto: start a Ray head only if none answers; 1: always (refused if one answers); 0: never"),
    Setting("master_addr", "127.0.0.1", Text(), "MASTER_ADDR", "the Ray head's address"),
    Setting("ray_dashboard_port", 8265, Integer(1, 65535), "RAY_DASHBOARD_PORT", "the Ray head's dashboard port"),
    Setting("ray_dashboard_url", lambda v: f"http://{v['master_addr']}:{v['ray_dashboard_port']}", Text(),
            "RAY_DASHBOARD_URL", "where the job goes"),
    Setting("ray_start_timeout", 120.0, Number(1.0), "RAY_START_TIMEOUT", "seconds for a started head to answer"),
    Setting("ray_bin", "ray", Text(), "RAY_BIN", "the ray command"),
    Setting("job_id", lambda v: f"search-r1-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", Text(), "JOB_ID",
            "the job's submission id"),
    Setting("extra_runtime_env_vars", None, Text(optional=True), "EXTRA_RUNTIME_ENV_VARS",
            "more variable names to pass to the job (space or comma separated)"),
)  # fmt: skip


# run_qwen2.5_3B.sh's own variables (VARIABLE=${VARIABLE:-default}) and the flag each one's value goes into; a dry
# run prints each with where its flag's value came from.
SCRIPT_PATHS = {"HF_CHECKPOINT": "--hf-checkpoint", "REF_LOAD": "--ref-load", "PROMPT_DATA": "--prompt-data"}

# Where the retriever's Python is looked for, first found first: an environment of its own, then the project's (what
# `make install` creates), then the PATH's.
RETRIEVER_PYTHONS = (REPO / "local_dense_retriever" / ".venv" / "bin" / "python", REPO / ".venv" / "bin" / "python")


def _retriever_python(_: dict) -> str:
    return next((str(path) for path in RETRIEVER_PYTHONS if path.is_file()), "python3")


WRAPPER = _knobs(
    Setting("tmux_session", "slime-search-r1", Text(), "TMUX_SESSION", "the tmux session (refused if it exists)"),
    Setting("tmux_socket", None, Text(optional=True), "TMUX_SOCKET", "a named tmux server (tmux -L)"),
    Setting("start_retriever", "auto", Choice(("auto", "0")), "START_RETRIEVER",
            "auto: start a server when RETRIEVAL_SERVER_URL is one local URL; 0: use the running one"),
    Setting("retriever_python", _retriever_python, Text(), "RETRIEVER_PYTHON",
            "the retriever environment's Python (local_dense_retriever/.venv, else the project's .venv, when it "
            "exists)"),
    Setting("retriever_preset", "none", Choice(("none", "embedded")), "RETRIEVER_PRESET",
            "embedded: the mini-Wikipedia + MiniLM index, built on first use (the paths below are then ignored)"),
    Setting("retriever_index_path", "/root/Index/e5_Flat.index", Text(), "RETRIEVER_INDEX_PATH", "--index_path"),
    Setting("retriever_corpus_path", "/root/Index/wiki-18.jsonl", Text(), "RETRIEVER_CORPUS_PATH", "--corpus_path"),
    Setting("retriever_name", "e5", Text(), "RETRIEVER_NAME", "--retriever_name"),
    Setting("retriever_model", "intfloat/e5-base-v2", Text(), "RETRIEVER_MODEL", "--retriever_model"),
    Setting("retriever_topk", 3, Integer(1), "RETRIEVER_TOPK", "--topk"),
    Setting("retriever_faiss_gpu", "auto", Choice(("auto", "1", "0")), "RETRIEVER_FAISS_GPU",
            "auto: --faiss_gpu when nvidia-smi lists a GPU"),
    Setting("retriever_host", "127.0.0.1", Text(), "RETRIEVER_HOST", "--host"),
    Setting("retriever_num_threads", None, Integer(1), "RETRIEVER_NUM_THREADS",
            "--num_threads (default: the CPUs the server may use)"),
    Setting("retriever_cpus", None, IdList(), "RETRIEVER_CPUS", "run the server under taskset -c on these CPUs"),
    Setting("retriever_extra_args", None, Text(optional=True), "RETRIEVER_EXTRA_ARGS", "more server flags"),
    Setting("retriever_ram_gib", None, Number(0.1, optional=True), "RETRIEVER_RAM_GIB",
            "RAM in GiB the server may take (default: what is available when it starts)"),
    GPU_MEMORY,
    TRAINER_RESIDUAL,
    Setting("retriever_startup_timeout", 120.0, Number(1.0), "RETRIEVER_STARTUP_TIMEOUT",
            "seconds for the server's /health to answer 200"),
    Setting("shutdown_timeout", 60.0, Number(0.0), "SHUTDOWN_TIMEOUT",
            "seconds training gets to stop after Ctrl-C, before SIGTERM"),
    Setting("log_dir", str(REPO / "logs"), Text(), "LOG_DIR", "the two logs, retrieval_server_<time>.log and "
            "training_<time>.log"),
    Setting("train_cmd", f"bash {shlex.quote(str(REPO / 'run_qwen2.5_3B.sh'))}", Text(), "TRAIN_CMD",
            "the training command (a bash line)"),
)  # fmt: skip


def help_table(knobs: dict[str, Setting]) -> str:
    rows = []
    for setting in knobs.values():
        default = "derived" if callable(setting.default) else repr(setting.default)
        rows.append(f"  {setting.env:<26} {default:<28} {setting.doc}")
    return "\n".join(rows)
