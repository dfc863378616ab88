"""What the user set: SEARCH_R1_CONFIGS with its environment overrides, its typed view, and the slime flags it needs.

Users edit the dict in generate_with_search.py (as slime's docs say) or set environment variables
(the launch scripts do). Both paths are validated here and fail fast with a message that names the
variable or key, the bad value and what is accepted. This module imports nothing from slime, so the
launch script runs the same checks before any GPU is spent:

    python slime_search_r1/config.py check-launch [--plugin generate_with_search.py] -- <slime's train.py flags>
"""

import argparse
import ast
import copy
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LLM_API_MODES = ("generate", "chat")
TOKEN_TRACKING_MODES = ("manual", "router_radix", "router_handler")
LOSS_MASK_MODES = ("strict", "simple")
SEARCH_BACKENDS = ("local", "google")
ENGINE_TRANSPORTS = ("aiohttp", "slime")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says which one and what is accepted."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"accepted: one of {', '.join(_TRUE + _FALSE)}")


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("accepted: an integer") from None


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError("accepted: a number") from None


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"accepted: {' | '.join(choices)}")
        return value

    return parse


def _parse_text(text: str) -> str:
    if not text.strip():
        raise ValueError("accepted: a non-empty string")
    return text.strip()


# (environment variable, path in SEARCH_R1_CONFIGS, parser). The first seven are the seed's names.
ENV_OVERRIDES: list[tuple[str, tuple[str, ...], Callable[[str], Any]]] = [
    ("LLM_API_MODE", ("llm_api_mode",), _parse_choice(LLM_API_MODES)),
    ("SEARCH_BACKEND", ("search_backend",), _parse_choice(SEARCH_BACKENDS)),
    ("TOKEN_TRACKING_MODE", ("token_tracking_mode",), _parse_choice(TOKEN_TRACKING_MODES)),
    ("TRACK_LOG_PROBS", ("return_logprob",), _parse_bool),
    ("LOSS_MASK_MODE", ("loss_mask_mode",), _parse_choice(LOSS_MASK_MODES)),
    ("RETRIEVAL_SERVER_URL", ("local", "search_url"), _parse_text),
    ("GOOGLE_API_KEY", ("google", "api_key"), _parse_text),
    ("SEARCH_R1_MAX_TURNS", ("max_turns",), _parse_int),
    ("SEARCH_R1_TOPK", ("topk",), _parse_int),
    ("SEARCH_R1_SEARCH_CONCURRENCY", ("search_concurrency",), _parse_int),
    ("SEARCH_R1_FORMAT_SCORE", ("format_score",), _parse_float),
    ("SEARCH_R1_MAX_CONTEXT_LENGTH", ("max_context_length",), _parse_int),
    ("SEARCH_R1_MAX_OBS_TOKENS", ("max_obs_tokens",), _parse_int),
    ("SEARCH_R1_SEARCH_TIMEOUT", ("search_timeout",), _parse_float),
    ("SEARCH_R1_SEARCH_ATTEMPTS", ("search_attempts",), _parse_int),
    ("SEARCH_R1_DROP_FAILED_SAMPLES", ("drop_failed_samples",), _parse_bool),
    ("SEARCH_R1_ENGINE_TRANSPORT", ("engine_transport",), _parse_choice(ENGINE_TRANSPORTS)),
    ("SEARCH_R1_ENGINE_MODEL", ("engine_model",), _parse_text),
    ("GOOGLE_SEARCH_URL", ("google", "search_url"), _parse_text),
    ("GOOGLE_SNIPPET_ONLY", ("google", "snippet_only"), _parse_bool),
]


# Variables that were renamed: setting one is an error that names its new name, never silently ignored.
RENAMED_VARIABLES = {"SEARCH_R1_SEARCH_RETRIES": "SEARCH_R1_SEARCH_ATTEMPTS (it counts attempts, the first included)"}


def apply_env_overrides(defaults: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A deep copy of `defaults` with every set environment variable of ENV_OVERRIDES applied."""
    environ = os.environ if environ is None else environ
    for old, new in RENAMED_VARIABLES.items():
        if environ.get(old):
            raise ConfigError(f"environment variable {old} was renamed; set {new}")
    config = copy.deepcopy(dict(defaults))
    for name, path, parse in ENV_OVERRIDES:
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            value = parse(raw)
        except ValueError as exc:
            shown = "<hidden>" if "KEY" in name else repr(raw)
            raise ConfigError(f"environment variable {name}={shown} is invalid; {exc}") from None
        target = config
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return config


def normalize_retrieval_urls(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated (or listed) server URLs; a bare http://host:port gets the /retrieve path."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    urls = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        split = urlsplit(part)
        if split.scheme not in ("http", "https") or not split.netloc:
            raise ValueError(f"{part!r} is not an http(s) URL such as http://127.0.0.1:8000/retrieve")
        urls.append(part.rstrip("/") + "/retrieve" if split.path in ("", "/") else part)
    if not urls:
        raise ValueError("no URL given; accepted: http://host:port[/retrieve], several separated by commas")
    return tuple(urls)


@dataclass(frozen=True)
class LocalSearchConfig:
    urls: tuple[str, ...]
    proxy: str | None


@dataclass(frozen=True)
class GoogleSearchConfig:
    api_key: str | None
    snippet_only: bool
    proxy: str | None
    search_url: str
    fetch_concurrency: int

    def __repr__(self) -> str:  # never print the key
        return f"GoogleSearchConfig(snippet_only={self.snippet_only}, search_url={self.search_url!r})"


@dataclass(frozen=True)
class SearchR1Config:
    llm_api_mode: str
    token_tracking_mode: str
    loss_mask_mode: str
    return_logprob: bool
    engine_transport: str
    engine_model: str
    max_turns: int
    topk: int
    search_concurrency: int
    search_backend: str
    search_timeout: float
    search_attempts: int
    local: LocalSearchConfig
    google: GoogleSearchConfig
    format_score: float
    final_format_score: float
    retrieval_score: float
    max_context_length: int
    max_obs_tokens: int
    drop_failed_samples: bool

    @property
    def train_observations(self) -> bool:
        return self.loss_mask_mode == "simple"


def _get(config: Mapping[str, Any], path: str) -> Any:
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            raise ConfigError(f"SEARCH_R1_CONFIGS is missing {path!r}")
        node = node[key]
    return node


def _choice(config, path, choices):
    value = _get(config, path)
    if value not in choices:
        raise ConfigError(f"SEARCH_R1_CONFIGS[{path!r}]={value!r} is invalid; accepted: {' | '.join(choices)}")
    return value


def _number(config, path, kind, low, high=None):
    value = _get(config, path)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ConfigError(f"SEARCH_R1_CONFIGS[{path!r}]={value!r} is invalid; accepted: {kind.__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"SEARCH_R1_CONFIGS[{path!r}]={value!r} is out of range; accepted: {bound}")
    return kind(value)


def _flag(config, path):
    value = _get(config, path)
    if not isinstance(value, bool):
        raise ConfigError(f"SEARCH_R1_CONFIGS[{path!r}]={value!r} is invalid; accepted: True or False")
    return value


def _text(config, path):
    value = _get(config, path)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"SEARCH_R1_CONFIGS[{path!r}]={value!r} is invalid; accepted: a non-empty string")
    return value.strip()


def _optional_text(config, path):
    value = _get(config, path)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"SEARCH_R1_CONFIGS[{path!r}] must be a string or None")
    return value or None


# Every key SEARCH_R1_CONFIGS holds ("section.key" inside local and google); keys that were renamed.
KNOWN_KEYS = (
    "llm_api_mode token_tracking_mode loss_mask_mode return_logprob engine_transport engine_model max_turns "
    "max_context_length max_obs_tokens topk search_concurrency search_backend search_timeout search_attempts "
    "drop_failed_samples local google format_score final_format_score retrieval_score local.search_url local.proxy "
    "google.api_key google.snippet_only google.proxy google.search_url google.fetch_concurrency"
).split()
RENAMED_KEYS = {"search_max_retries": "search_attempts"}


def _check_keys(config: Mapping[str, Any]) -> None:
    """A key this plugin does not read is a typo or an old name: say so rather than ignore it."""
    keys = list(config) + [
        f"{section}.{key}"
        for section in ("local", "google")
        if isinstance(config.get(section), Mapping)
        for key in config[section]
    ]
    for key in keys:
        if key in RENAMED_KEYS:
            raise ConfigError(f"SEARCH_R1_CONFIGS[{key!r}] was renamed {RENAMED_KEYS[key]!r}")
        if key not in KNOWN_KEYS:
            raise ConfigError(f"SEARCH_R1_CONFIGS has an unknown key {key!r}; accepted: {', '.join(KNOWN_KEYS)}")


def resolve_config(config: Mapping[str, Any]) -> SearchR1Config:
    """Validate SEARCH_R1_CONFIGS and return its typed view; raises ConfigError on the first bad value."""
    _check_keys(config)
    try:
        urls = normalize_retrieval_urls(_get(config, "local.search_url"))
    except ValueError as exc:
        raise ConfigError(f"SEARCH_R1_CONFIGS['local.search_url'] (env RETRIEVAL_SERVER_URL): {exc}") from None

    format_score = _number(config, "format_score", float, 0.0, 1.0)
    final_format_score = config.get("final_format_score")
    if final_format_score is None:
        # Search-R1 v0.3 pairs structure 0.2 with final 0.1; tie it to format_score so 0 means pure EM.
        final_format_score = format_score / 2
    else:
        final_format_score = _number(config, "final_format_score", float, 0.0, 1.0)

    resolved = SearchR1Config(
        llm_api_mode=_choice(config, "llm_api_mode", LLM_API_MODES),
        token_tracking_mode=_choice(config, "token_tracking_mode", TOKEN_TRACKING_MODES),
        loss_mask_mode=_choice(config, "loss_mask_mode", LOSS_MASK_MODES),
        return_logprob=_flag(config, "return_logprob"),
        engine_transport=_choice(config, "engine_transport", ENGINE_TRANSPORTS),
        engine_model=_text(config, "engine_model"),
        max_turns=_number(config, "max_turns", int, 1, 64),
        topk=_number(config, "topk", int, 1, 100),
        search_concurrency=_number(config, "search_concurrency", int, 1),
        search_backend=_choice(config, "search_backend", SEARCH_BACKENDS),
        search_timeout=_number(config, "search_timeout", float, 0.1),
        search_attempts=_number(config, "search_attempts", int, 1, 20),
        local=LocalSearchConfig(urls=urls, proxy=_optional_text(config, "local.proxy")),
        google=GoogleSearchConfig(
            api_key=_optional_text(config, "google.api_key"),
            snippet_only=_flag(config, "google.snippet_only"),
            proxy=_optional_text(config, "google.proxy"),
            search_url=_get(config, "google.search_url"),
            fetch_concurrency=_number(config, "google.fetch_concurrency", int, 1),
        ),
        format_score=format_score,
        final_format_score=final_format_score,
        retrieval_score=_number(config, "retrieval_score", float, 0.0, 1.0),
        max_context_length=_number(config, "max_context_length", int, 1),
        max_obs_tokens=_number(config, "max_obs_tokens", int, 16),
        drop_failed_samples=_flag(config, "drop_failed_samples"),
    )
    if resolved.llm_api_mode == "generate" and resolved.token_tracking_mode == "router_handler":
        raise ConfigError(
            "Invalid configuration: token_tracking_mode='router_handler' is NOT compatible with "
            "llm_api_mode='generate' (it needs chat messages); use TOKEN_TRACKING_MODE=manual or router_radix, "
            "or LLM_API_MODE=chat"
        )
    if resolved.search_backend == "google" and not resolved.google.api_key:
        raise ConfigError(
            "search_backend='google' needs a serper.dev key: set GOOGLE_API_KEY (or SEARCH_R1_CONFIGS['google']"
            "['api_key']), or use SEARCH_BACKEND=local"
        )
    if resolved.final_format_score > resolved.format_score:
        raise ConfigError("final_format_score must not exceed format_score (a wrong answer cannot beat valid format)")
    return resolved


# The reward post-process that keeps removed samples out of their group's advantages (training/advantages.py).
REWARD_POST_PROCESS_PATH = "generate_with_search.post_process_rewards"
_GROUP_NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")


def _flag_names(args, names: tuple[str, ...]) -> list[str]:
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name, False)]


def check_slime_args(args, config: SearchR1Config) -> list[str]:
    """slime flags that cannot work with this configuration raise ConfigError; returns warnings for the rest.

    Runs in generate() on every sample and, through `check-launch`, in run_qwen2.5_3B.sh before the job starts.
    """
    uses_rollout_log_probs = _flag_names(args, ("use_tis", "use_rollout_logprobs", "get_mismatch_metrics"))
    flags = " and ".join(uses_rollout_log_probs)
    if uses_rollout_log_probs and config.train_observations:
        raise ConfigError(
            f"LOSS_MASK_MODE=simple trains observation tokens whose rollout log probs are 0.0 placeholders (the "
            f"engine never sampled them), which {flags} would treat as real; use LOSS_MASK_MODE=strict"
        )
    if uses_rollout_log_probs and not config.return_logprob:
        raise ConfigError(f"{flags} needs the engine's log probs: set TRACK_LOG_PROBS=true")
    if float(getattr(args, "rollout_top_p", 1.0) or 1.0) != 1.0 and (
        config.train_observations or not config.return_logprob or config.token_tracking_mode != "manual"
    ):
        raise ConfigError(
            "--rollout-top-p != 1 replays the engine's nucleus per sampled token; it needs TRACK_LOG_PROBS=true, "
            "LOSS_MASK_MODE=strict and TOKEN_TRACKING_MODE=manual"
        )
    if getattr(args, "use_rollout_routing_replay", False):
        raise ConfigError(
            "--use-rollout-routing-replay (MoE routed-expert replay) is not supported by this plugin: drop the "
            "flag (Qwen2.5 is a dense model)"
        )
    if getattr(args, "partial_rollout", False):
        raise ConfigError(
            "--partial-rollout is not supported: slime would hand an aborted multi-turn sample back to generate() "
            "to resume from its kept tokens, but an episode's turns, searches and conversation cannot be resumed "
            "from tokens, so it would restart and train on stale metadata; drop --partial-rollout (slime's own "
            "multi-turn examples refuse it too)"
        )
    warnings = []
    normalized = getattr(args, "advantage_estimator", "grpo") in _GROUP_NORMALIZED_ESTIMATORS and getattr(
        args, "rewards_normalization", True
    )
    if config.drop_failed_samples and normalized:
        if getattr(args, "custom_convert_samples_to_train_data_path", None):
            warnings.append(
                "--custom-convert-samples-to-train-data-path replaces slime's reward post-processing, so "
                f"{REWARD_POST_PROCESS_PATH} does not run: make sure your converter keeps removed (FAILED) samples "
                "out of their group's advantages"
            )
        elif getattr(args, "custom_reward_post_process_path", None) != REWARD_POST_PROCESS_PATH:
            warnings.append(
                "FAILED samples (search down after its retries) get remove_sample, but slime's reward "
                "post-processing still counts their reward in their group's mean and std, which shifts their "
                f"siblings' advantages: pass --custom-reward-post-process-path {REWARD_POST_PROCESS_PATH} "
                "(run_qwen2.5_3B.sh does)"
            )
    return warnings


LEGACY_ROUTER_VARIABLE = "LEGACY_SLIME_ROUTER"


def check_router_mode(config: SearchR1Config, environ: Mapping[str, str]) -> None:
    """The router modes need the slime router slime removed in March 2026 (THUDM/slime#1735)."""
    if config.token_tracking_mode == "manual":
        return
    try:
        stated = _parse_bool(environ.get(LEGACY_ROUTER_VARIABLE, "0"))
    except ValueError as exc:
        raise ConfigError(f"environment variable {LEGACY_ROUTER_VARIABLE} is invalid; {exc}") from None
    if not stated:
        raise ConfigError(
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} needs the old slime router with its radix-tree "
            "cache (/retrieve_from_text, /retrieve_from_messages_template), which current slime no longer has "
            "(removed in THUDM/slime#1735). Use TOKEN_TRACKING_MODE=manual (token-exact with any SGLang engine or "
            f"router), or set {LEGACY_ROUTER_VARIABLE}=1 if your slime still launches that router"
        )


def configs_from_source(path: Path) -> dict[str, Any]:
    """SEARCH_R1_CONFIGS as written in generate_with_search.py, read without importing it (that imports slime)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SEARCH_R1_CONFIGS" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "apply_env_overrides":
                value = value.args[0] if value.args else value
            try:
                configs = ast.literal_eval(value)
            except ValueError:
                configs = None
            if not isinstance(configs, dict):
                raise ConfigError(
                    f"SEARCH_R1_CONFIGS in {path} is not a literal dict, so it cannot be checked before launch; "
                    "keep it a literal (set values through environment variables) or skip the check with "
                    "SKIP_PLUGIN_CHECK=1"
                )
            return configs
    raise ConfigError(f"{path} defines no SEARCH_R1_CONFIGS")


def parse_slime_flags(train_args: list[str]) -> argparse.Namespace:
    """The slime flags check_slime_args reads, parsed from train.py's command line with slime's defaults."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in (
        "--use-tis",
        "--use-rollout-logprobs",
        "--get-mismatch-metrics",
        "--use-rollout-routing-replay",
        "--partial-rollout",
    ):
        parser.add_argument(flag, action="store_true", default=False)
    parser.add_argument("--rollout-top-p", type=float, default=1.0)
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--disable-rewards-normalization", action="store_false", dest="rewards_normalization")
    parser.add_argument("--custom-reward-post-process-path", default=None)
    parser.add_argument("--custom-convert-samples-to-train-data-path", default=None)
    known, _ = parser.parse_known_args(train_args)
    return known


def check_launch(plugin: Path, train_args: list[str], environ: Mapping[str, str]) -> list[str]:
    """Everything generate() would refuse at its first sample, checked from the launch command; returns warnings."""
    config = resolve_config(apply_env_overrides(configs_from_source(plugin), environ))
    check_router_mode(config, environ)
    return check_slime_args(parse_slime_flags(train_args), config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check SEARCH_R1_CONFIGS and slime's flags before launching.")
    commands = parser.add_subparsers(dest="command", required=True)
    launch = commands.add_parser("check-launch", help="the checks generate() runs, on the launch command")
    launch.add_argument("--plugin", type=Path, default=Path(__file__).resolve().parents[1] / "generate_with_search.py")
    launch.add_argument("--prog", default="slime_search_r1/config.py", help="the name messages start with")
    launch.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train.py's flags")
    options = parser.parse_args(argv)
    train_args = options.train_args[1:] if options.train_args[:1] == ["--"] else options.train_args
    try:
        warnings = check_launch(options.plugin, train_args, os.environ)
    except (ConfigError, OSError, SyntaxError) as exc:
        print(f"{options.prog}: error: {exc}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"{options.prog}: warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
