"""Every named setting, declared once in one list: the plugin's (a key of SEARCH_R1_CONFIGS in generate_with_search.py,
overridden by its environment variable; the job reads them) and the launch scripts' (an environment variable only:
run_qwen2.5_3B.sh's and run_qwen2.5_3B_with_retrieval.sh's). `python -m slime_search_r1.launch --list` prints them.

A slime flag is not a setting: the launch script's arrays hold slime's flags, commented where optional, as slime's
examples do. A value nobody changes is a constant where it is used; a default derived from other settings is a
callable of them (computed from the settings above it in this list).
"""

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_search_r1.registry import MODEL_FAMILIES, PROTOCOLS, SEARCH_BACKENDS, TOKEN_DRIVERS, TOOLS, reward_names
from slime_search_r1.settings.kinds import Choice, Flag, IdList, Integer, Names, Number, ShellWords, Text, Urls

Kind = Choice | Flag | Integer | Number | Text | Urls | Names | IdList | ShellWords

# Who reads a setting: the plugin (SEARCH_R1_CONFIGS, then the environment), or one of the two launch scripts (the
# environment only).
PLUGIN, LAUNCH, WRAPPER = "plugin", "launch", "wrapper"
REPO = Path(__file__).absolute().parents[2]  # the plugin's folder: the scripts, generate_with_search.py
# Every SEARCH_R1_* environment variable is a setting's, but this one: the tmux wrapper asks the launch, through
# it, to describe the training it would start (launch/retriever_memory.py).
DESCRIBE_VARIABLE = "SEARCH_R1_DESCRIBE_TRAINING"


@dataclass(frozen=True)
class Setting:
    key: str  # "max_turns", or "section.key" for one inside a section of SEARCH_R1_CONFIGS ("local.search_url")
    default: Any  # or a callable of the settings above it (a default derived from them)
    kind: Kind
    env: str | None = None  # the environment variable that sets it (over SEARCH_R1_CONFIGS for the plugin's)
    doc: str = ""
    secret: bool = False  # never shown: not in messages, not in the view's repr
    read_by: tuple[str, ...] = (PLUGIN,)

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


SETTINGS: dict[str, Setting] = {}


def register_setting(setting: Setting) -> None:
    """A new setting (an extension's own, e.g. "bing.api_key"): one call, and it is read, checked and overridable."""
    if setting.key in SETTINGS:
        raise ValueError(f"the setting {setting.key!r} is declared already")
    if setting.env and any(other.env == setting.env for other in SETTINGS.values()):
        raise ValueError(f"the environment variable {setting.env} already overrides another setting")
    if len(setting.path) > 2:
        raise ValueError(f"a setting key is 'name' or 'section.name', got {setting.key!r}")
    SETTINGS[setting.key] = setting


def read_by(reader: str) -> list[Setting]:
    """The settings `reader` (PLUGIN, LAUNCH or WRAPPER) reads, in the order of the list."""
    return [setting for setting in SETTINGS.values() if reader in setting.read_by]


def listing() -> str:
    """Every setting, one tab-separated row each: what `python -m slime_search_r1.launch --list` prints."""
    rows = ["key\tvariable\tdefault\taccepted\tread by\twhat it sets"]
    for s in SETTINGS.values():
        default = "derived" if callable(s.default) else repr(s.default)
        key = s.key if PLUGIN in s.read_by else "-"  # the others are not keys of SEARCH_R1_CONFIGS
        rows.append(f"{key}\t{s.env or '-'}\t{default}\t{s.kind.accepted()}\t{', '.join(s.read_by)}\t{s.doc}")
    return "\n".join(rows)


def _slime_dir(_: dict) -> str:
    """Inside slime's tree (examples/search-r1/) the checkout is two levels up; else slime's docker image's."""
    return str(REPO.parents[1]) if (REPO.parents[1] / "train.py").is_file() else "/root/slime"


# Where the retriever's Python is looked for, first found first: an environment of its own, then the project's (what
# `make install` creates), then the PATH's.
RETRIEVER_PYTHONS = (REPO / "local_dense_retriever" / ".venv" / "bin" / "python", REPO / ".venv" / "bin" / "python")


def _retriever_python(_: dict) -> str:
    return next((str(path) for path in RETRIEVER_PYTHONS if path.is_file()), "python3")


# Search-R1's index of wiki-18 (e5-base-v2, the server's default encoder), where its download script puts it.
DEFAULT_RETRIEVER_ARGS = "--index_path /root/Index/e5_Flat.index --corpus_path /root/Index/wiki-18.jsonl"


def _retriever_args(values: dict) -> str | None:
    return None if values["retriever_preset"] == "embedded" else DEFAULT_RETRIEVER_ARGS


def _launch(*readers: str) -> Callable[..., Setting]:
    return lambda *args, **kwargs: Setting(*args, **kwargs, read_by=readers)


_launch_knob, _wrapper_knob, _both = _launch(LAUNCH), _launch(WRAPPER), _launch(LAUNCH, WRAPPER)

for _setting in (
    # ---- the plugin: how the model talks and where its tokens come from
    Setting("llm_api_mode", "generate", Choice(PROTOCOLS.names), "LLM_API_MODE",
            "generate: Search-R1's XML tags over /generate; chat: OpenAI tool calls"),
    Setting("token_tracking_mode", "manual", Choice(TOKEN_DRIVERS.names), "TOKEN_TRACKING_MODE",
            "where the trajectory's tokens come from: manual (token in, token out), or the old slime router's cache"),
    Setting("model_family", "auto", Choice(lambda: ("auto", *MODEL_FAMILIES.names())), "SEARCH_R1_MODEL_FAMILY",
            "how the model writes tool calls and thoughts (slime_search_r1/families/); auto: read from the "
            "checkpoint's chat template by SGLang's rules"),
    Setting("loss_mask_mode", "strict", Choice(("strict", "simple")), "LOSS_MASK_MODE",
            "strict: observations masked out of the loss; simple: trained too (placeholder log probs 0.0)"),
    Setting("return_logprob", True, Flag(), "TRACK_LOG_PROBS",
            "engine log probs in rollout_log_probs (TIS needs them)"),
    Setting("engine_transport", "aiohttp", Choice(("aiohttp", "slime")), "SEARCH_R1_ENGINE_TRANSPORT",
            "engine calls over aiohttp, or slime's post() (used anyway with --use-distributed-post)"),
    # ---- the episode
    Setting("max_turns", 3, Integer(1, 128), "SEARCH_R1_MAX_TURNS",
            "model turns per sample; a tool call on the last turn is not run"),
    Setting("force_answer", "off", Choice(("off", "final_turn", "inject")), "SEARCH_R1_FORCE_ANSWER",
            "off; final_turn: one more turn after max_turns, its tool calls not run (Search-R1); inject: an "
            "instruction to answer now before the last turn (or below force_answer_reserve), outside the loss"),
    Setting("force_answer_reserve", 0, Integer(0), "SEARCH_R1_FORCE_ANSWER_RESERVE",
            "inject: also when fewer response tokens than this are left after a reply (0: before the last turn only)"),
    Setting("split_trajectories", False, Flag(), "SEARCH_R1_SPLIT_TRAJECTORIES",
            "an episode whose context stops being a prefix of what was trained becomes several samples (one "
            "rollout_id, the episode's reward on each); needed by page chunks"),
    Setting("max_context_length", 16384, Integer(1), "SEARCH_R1_MAX_CONTEXT_LENGTH",
            "prompt + response tokens (slime's --rollout-max-context-len caps it too)"),
    Setting("max_obs_tokens", 500, Integer(16), "SEARCH_R1_MAX_OBS_TOKENS",
            "tokens of one search result (Search-R1's max_obs_length)"),
    Setting("max_version_lag", None, Integer(0, optional=True), "SEARCH_R1_MAX_VERSION_LAG",
            "loss mask 0 on generated tokens more than this many weight versions behind the episode's last; "
            "None: off"),
    # ---- tools and search
    Setting("tools", ["search"], Names(TOOLS.names, at_least=1), "SEARCH_R1_TOOLS",
            "the tools the model may call: search, and access to read a page of the results"),
    Setting("max_page_tokens", 1024, Integer(16), "SEARCH_R1_MAX_PAGE_TOKENS",
            "tokens of one page the access tool shows (the response budget must hold them)"),
    Setting("page_chunk_tokens", 0, Integer(0), "SEARCH_R1_PAGE_CHUNK_TOKENS",
            "0: off; else access shows a page in chunks of this many tokens, the next one each time the model "
            "accesses it again, and a chunk read is cut to its short form in later contexts (ASearcher)"),
    Setting("page_short_tokens", 32, Integer(0), "SEARCH_R1_PAGE_SHORT_TOKENS",
            "tokens of a chunk's text its short form keeps, in the contexts after the turn that read it"),
    Setting("topk", 3, Integer(1, 100), "SEARCH_R1_TOPK", "passages per search"),
    Setting("search_backend", "local", Choice(SEARCH_BACKENDS.names), "SEARCH_BACKEND",
            "local retrieval server, or Google through serper.dev"),
    Setting("search_timeout", 30.0, Number(0.1), "SEARCH_R1_SEARCH_TIMEOUT", "seconds per attempt"),
    Setting("search_attempts", 3, Integer(1, 20), "SEARCH_R1_SEARCH_ATTEMPTS",
            "tries per call, the first included, on connection errors, timeouts, 5xx and 429 (Retry-After obeyed)"),
    Setting("local.search_url", ("http://127.0.0.1:8000/retrieve",), Urls("/retrieve"), "RETRIEVAL_SERVER_URL",
            "local retrieval server(s); load is spread over all"),
    Setting("google.api_key", None, Text(optional=True), "GOOGLE_API_KEY", "serper.dev key", secret=True),
    Setting("google.snippet_only", True, Flag(), "GOOGLE_SNIPPET_ONLY",
            "snippets, or the result pages fetched and cut to the snippet's paragraphs"),
    Setting("google.proxy", None, Text(optional=True), None, "HTTP proxy for serper.dev and the pages"),
    # ---- the reward
    Setting("format_score", 0.2, Number(0.0, 1.0), "SEARCH_R1_FORMAT_SCORE",
            "Search-R1's structure bonus; 0 gives pure exact match"),
    Setting("final_format_score", lambda values: values["format_score"] / 2, Number(0.0, 1.0, optional=True), None,
            "a wrong answer in a bad format; None: half of format_score (Search-R1 v0.3 pairs 0.2 with 0.1)"),
    Setting("retrieval_score", 0.0, Number(0.0, 1.0), None, "bonus when a gold answer appears in a retrieved block"),
    Setting("reward", "em", Choice(reward_names), "SEARCH_R1_REWARD",
            "the answer score the reward is built on: em, f1, cover_em, or judge (an LLM judge, judge.* settings)"),
    Setting("judge.url", None, Text(optional=True), "SEARCH_R1_JUDGE_URL",
            "the judge's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1 (SEARCH_R1_REWARD=judge)"),
    Setting("judge.model", None, Text(optional=True), "SEARCH_R1_JUDGE_MODEL", "the model name the judge serves"),
    Setting("judge.api_key", None, Text(optional=True), "JUDGE_API_KEY",
            "sent as a bearer token when set; never logged", secret=True),
    Setting("judge.prompt", None, Text(optional=True), "SEARCH_R1_JUDGE_PROMPT",
            "a judge prompt file with {question}, {gold_answers} and {prediction}; None: scoring/judge_prompt.txt"),
    Setting("judge.max_tokens", 1024, Integer(1), None,
            "max_tokens of the judge's reply; one cut off there is marked invalid (a reasoning judge needs room)"),
    # ---- extending
    Setting("extensions", [], Names(None), "SEARCH_R1_EXTENSIONS",
            "modules imported first: they register tools, search backends, token-tracking modes or settings"),
    # ---- run_qwen2.5_3B.sh: the node and where things are (its slime flags are the script's arrays)
    _launch_knob("async_mode", "off", Choice(("off", "fully")), "ASYNC_MODE",
                 "off: train.py, training and rollout colocated; fully: train_async.py with slime's fully-async "
                 "rollout on GPUs of its own"),
    _launch_knob("num_gpus", 8, Integer(1), "NUM_GPUS", "GPUs of the node"),
    _launch_knob("actor_gpus", lambda v: v["num_gpus"] // 2, Integer(1), "ACTOR_GPUS",
                 "ASYNC_MODE=fully: GPUs that train (default: half); the rest generate"),
    _launch_knob("slime_dir", _slime_dir, Text(), "SLIME_DIR", "slime checkout (two levels up inside slime's tree)"),
    _launch_knob("megatron_path", "/root/Megatron-LM", Text(), "MEGATRON_PATH",
                 "Megatron-LM, on the job's PYTHONPATH"),
    _launch_knob("model_args_file", lambda v: f"{v['slime_dir']}/scripts/models/qwen2.5-3B.sh", Text(),
                 "MODEL_ARGS_FILE", "bash file that sets MODEL_ARGS, the model's architecture flags"),
    _launch_knob("python_bin", "python3", Text(), "PYTHON_BIN", "the job's Python (and this launcher's)"),
    _launch_knob("skip_plugin_check", False, Flag(), "SKIP_PLUGIN_CHECK",
                 "skip the plugin's checks (generate() still makes them at its first sample)"),
    _launch_knob("legacy_slime_router", False, Flag(), "LEGACY_SLIME_ROUTER",
                 "your slime still runs the old router the TOKEN_TRACKING_MODE=router_* modes need"),
    _launch_knob("ray_dashboard_port", 8265, Integer(1, 65535), "RAY_DASHBOARD_PORT",
                 "the Ray head's dashboard port, where the job goes"),
    _launch_knob("extra_runtime_env_vars", None, Text(optional=True), "EXTRA_RUNTIME_ENV_VARS",
                 "more variable names to pass to the job (space or comma separated)"),
    # ---- a retrieval server on GPUs of this node (the wrapper sets these; set them for a server started apart)
    _launch_knob("node_retriever_layout", None, Text(optional=True), "NODE_RETRIEVER_LAYOUT",
                 "its layout (torch-fp16, faiss-gpu-fp16, Flat, HNSW32,SQ8, ...: python -m local_dense_retriever."
                 "memory_plan): its memory plan is printed and checked beside training"),
    _launch_knob("node_retriever_gpus", None, IdList("GPU ids"), "NODE_RETRIEVER_GPUS",
                 "the GPUs its GPU layout uses (default: the node's NUM_GPUS, as --torch_search all and --faiss_gpu)"),
    _launch_knob("node_retriever_corpus_size", None, Integer(1), "NODE_RETRIEVER_CORPUS_SIZE",
                 "its passages (wiki-18: 21015324); needed with NODE_RETRIEVER_LAYOUT"),
    _launch_knob("node_retriever_dim", 768, Integer(1), "NODE_RETRIEVER_DIM",
                 "its vector dimension (e5-base-v2: 768)"),
    _both("gpu_memory_gib", None, Number(0.1, optional=True), "GPU_MEMORY_GIB",
          "memory of each GPU in GiB for the retriever's memory plan (default: nvidia-smi's smallest memory.total)"),
    # ---- run_qwen2.5_3B_with_retrieval.sh: the retrieval server it starts, and training beside it
    _wrapper_knob("start_retriever", "auto", Choice(("auto", "0")), "START_RETRIEVER",
                  "auto: start a server when RETRIEVAL_SERVER_URL is one local URL; 0: use the running one"),
    _wrapper_knob("retriever_python", _retriever_python, Text(), "RETRIEVER_PYTHON",
                  "the retriever environment's Python (local_dense_retriever/.venv, else the project's .venv, when "
                  "it exists)"),
    _wrapper_knob("retriever_preset", "none", Choice(("none", "embedded")), "RETRIEVER_PRESET",
                  "embedded: the mini-Wikipedia + MiniLM index, built on first use"),
    _wrapper_knob("retriever_args", _retriever_args, ShellWords(), "RETRIEVER_ARGS",
                  f"the server's flags (retrieval_server.py --help; default: {DEFAULT_RETRIEVER_ARGS}, none with "
                  "RETRIEVER_PRESET=embedded, whose flags come first)"),
    _wrapper_knob("retriever_faiss_gpu", "auto", Choice(("auto", "1", "0")), "RETRIEVER_FAISS_GPU",
                  "auto: --faiss_gpu when nvidia-smi lists a GPU and RETRIEVER_ARGS does not say where the search "
                  "runs (--torch_search, --faiss_gpu, another --backend)"),
    _wrapper_knob("retriever_cpus", None, IdList(), "RETRIEVER_CPUS", "run the server under taskset -c on these CPUs"),
    _wrapper_knob("retriever_ram_gib", None, Number(0.1, optional=True), "RETRIEVER_RAM_GIB",
                  "RAM in GiB the server may take (default: what is available when it starts)"),
    _wrapper_knob("retriever_startup_timeout", 120.0, Number(1.0), "RETRIEVER_STARTUP_TIMEOUT",
                  "seconds for the server's /health to answer 200 (a large index loads for minutes)"),
    _wrapper_knob("log_dir", str(REPO / "logs"), Text(), "LOG_DIR",
                  "the two logs, retrieval_server_<time>.log and training_<time>.log"),
    _wrapper_knob("train_cmd", f"bash {shlex.quote(str(REPO / 'run_qwen2.5_3B.sh'))}", Text(), "TRAIN_CMD",
                  "the training command (a bash line; flags after the script's name are appended to train.py's)"),
):  # fmt: skip
    register_setting(_setting)
