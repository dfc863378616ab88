"""The slime flags the settings must agree with: refused when they cannot work, warned about when they would
quietly train on the wrong numbers.

generate() runs check_slime_args at every sample (the first one stops a run that skipped the launch check); the
launch check (launch_check.py) runs the same function on train.py's command line, before Ray starts.
"""

import argparse
from collections.abc import Mapping

from slime_search_r1.settings import ConfigError, SearchR1Config
from slime_search_r1.training.advantages import GROUP_NORMALIZED_ESTIMATORS

# The reward post-process that keeps removed samples out of their group's advantages (training/advantages.py).
REWARD_POST_PROCESS_PATH = "generate_with_search.post_process_rewards"
LEGACY_ROUTER_VARIABLE = "LEGACY_SLIME_ROUTER"


def _flag_names(args, names: tuple[str, ...]) -> list[str]:
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name, False)]


def check_slime_args(args, config: SearchR1Config) -> list[str]:
    """slime flags that cannot work with these settings raise ConfigError; returns warnings for the rest."""
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
    if getattr(args, "partial_rollout", False) and config.token_tracking_mode in ("router_radix", "router_handler"):
        raise ConfigError(
            f"--partial-rollout resumes an aborted episode from the tokens it wrote, but "
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} takes the trajectory from the old slime router's "
            "cache at the end of the episode, which a resumed episode cannot extend exactly; use "
            "TOKEN_TRACKING_MODE=manual with --partial-rollout"
        )
    warnings = []
    if config.llm_api_mode == "chat" and config.token_tracking_mode == "router_radix":
        warnings.append(
            "LLM_API_MODE=chat with TOKEN_TRACKING_MODE=router_radix works but sends rendered text, not messages, "
            "through the router; router_handler or manual keep the messages"
        )
    normalized = getattr(args, "advantage_estimator", "grpo") in GROUP_NORMALIZED_ESTIMATORS and getattr(
        args, "rewards_normalization", True
    )
    # samples that get remove_sample: FAILED ones (a tool still failing) unless kept, and those the judge left unscored
    removed = [
        *(["FAILED samples (a tool still failing after its retries)"] if config.drop_failed_samples else []),
        *(["samples the judge could not score"] if config.reward == "judge" else []),
    ]
    if removed and normalized:
        if getattr(args, "custom_convert_samples_to_train_data_path", None):
            warnings.append(
                "--custom-convert-samples-to-train-data-path replaces slime's reward post-processing, so "
                f"{REWARD_POST_PROCESS_PATH} does not run: make sure your converter keeps removed samples ("
                + " and ".join(removed)
                + ") out of their group's advantages"
            )
        elif getattr(args, "custom_reward_post_process_path", None) != REWARD_POST_PROCESS_PATH:
            which = " and ".join(removed)
            warnings.append(
                which[:1].upper() + which[1:] + " get remove_sample, but slime's reward post-processing still "
                "counts their reward in their group's mean and std, which shifts their siblings' advantages: pass "
                f"--custom-reward-post-process-path {REWARD_POST_PROCESS_PATH} (run_qwen2.5_3B.sh does)"
            )
    return warnings


def check_router_mode(config: SearchR1Config, environ: Mapping[str, str]) -> None:
    """The router modes need the slime router slime removed in March 2026 (THUDM/slime#1735): the user must say so."""
    if config.token_tracking_mode not in ("router_radix", "router_handler"):
        return
    stated = environ.get(LEGACY_ROUTER_VARIABLE, "0").strip().lower()
    if stated not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        raise ConfigError(
            f"environment variable {LEGACY_ROUTER_VARIABLE}={stated!r} is invalid; accepted: 1/true/yes/on or "
            "0/false/no/off"
        )
    if stated not in ("1", "true", "yes", "on"):
        raise ConfigError(
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} needs the old slime router with its radix-tree "
            "cache (/retrieve_from_text, /retrieve_from_messages_template), which current slime no longer has "
            "(removed in THUDM/slime#1735). Use TOKEN_TRACKING_MODE=manual (token-exact with any SGLang engine or "
            f"router), or set {LEGACY_ROUTER_VARIABLE}=1 if your slime still launches that router"
        )


def parse_slime_flags(train_args: list[str]) -> argparse.Namespace:
    """The slime flags check_slime_args reads, parsed from train.py's command line with slime's defaults."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in (
        "--use-tis",
        "--use-rollout-logprobs",
        "--get-mismatch-metrics",
        "--use-rollout-routing-replay",
        "--partial-rollout",
        "--mask-offpolicy-in-partial-rollout",
    ):
        parser.add_argument(flag, action="store_true", default=False)
    parser.add_argument("--rollout-top-p", type=float, default=1.0)
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--disable-rewards-normalization", action="store_false", dest="rewards_normalization")
    parser.add_argument("--custom-reward-post-process-path", default=None)
    parser.add_argument("--custom-convert-samples-to-train-data-path", default=None)
    known, _ = parser.parse_known_args(train_args)
    return known
