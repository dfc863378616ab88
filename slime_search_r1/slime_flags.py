"""The slime flags the settings must agree with: refused when they cannot work, warned about when they would
quietly train on the wrong numbers.

generate() runs check_slime_args at every sample (the first one stops a run that skipped the launch's checks); the
launch (launch/checks.py) runs the same function on train.py's command line, before Ray starts.

slime's fully-async rollout (train_async.py with FULLY_ASYNC_ROLLOUT) has refusals of its own. They stop a launch;
at a sample they are logged as warnings instead, because slime's fully-async worker catches an exception raised by
generate(), logs it and drops the group, so raising there would stall the rollout rather than stop it. Split
trajectories with it raise at a sample too (check_long_horizon): going on would be worse, since the worker's abort
check does not look into a list, so an aborted episode would be trained as if it had finished.
"""

import argparse

from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.rules import PAGE_CHUNK_FRAME_TOKENS
from slime_search_r1.settings.view import SearchR1Config
from slime_search_r1.training.advantages import GROUP_NORMALIZED_ESTIMATORS

# The reward post-process that keeps removed samples out of their group's advantages (training/advantages.py).
REWARD_POST_PROCESS_PATH = "generate_with_search.post_process_rewards"
LEGACY_ROUTER_VARIABLE = "LEGACY_SLIME_ROUTER"
# slime's rollout functions (--rollout-function-path, --eval-function-path): the fully-async one keeps a pool of
# episodes in flight across training steps and cannot evaluate; the default one can.
FULLY_ASYNC_ROLLOUT = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
DEFAULT_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"


def _flag_names(args, names: tuple[str, ...]) -> list[str]:
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name, False)]


def check_judge(config: SearchR1Config) -> None:
    """The judge's endpoint and prompt file (judge.url and judge.prompt), read as the judge reads them."""
    judge = config.judge
    if not judge.url:
        return
    # here, not at the top: the judge's client needs aiohttp, which checking the other settings does not
    from slime_search_r1.scoring.judge import JudgePrompt, JudgeSetupError, chat_completions_url

    try:
        chat_completions_url(judge.url)
    except JudgeSetupError as exc:
        raise ConfigError(f"SEARCH_R1_JUDGE_URL {exc}") from None
    try:
        JudgePrompt.load(judge.prompt)
    except JudgeSetupError as exc:
        raise ConfigError(f"SEARCH_R1_JUDGE_PROMPT: {exc}") from None


def check_slime_args(args, config: SearchR1Config, at_launch: bool = False, evaluation: bool = False) -> list[str]:
    """slime flags that cannot work with these settings raise ConfigError; returns warnings for the rest.
    `evaluation`: the sample is an evaluation's (evaluate.py, slime's eval rollout), which no advantage reads, so
    the warnings about advantages are left out."""
    check_judge(config)
    refusals, warnings = fully_async_problems(args)
    if refusals and at_launch:
        raise ConfigError(refusals[0])
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
    if config.max_version_lag is not None and getattr(args, "custom_convert_samples_to_train_data_path", None):
        warnings.append(
            "--custom-convert-samples-to-train-data-path replaces slime's reward post-processing, so "
            f"{REWARD_POST_PROCESS_PATH} does not run: SEARCH_R1_MAX_VERSION_LAG then masks each episode when it "
            "ends only, not again against the policy being trained when slime forms the batch"
        )
    elif config.max_version_lag is not None and getattr(args, "custom_reward_post_process_path", None) != (
        REWARD_POST_PROCESS_PATH
    ):
        raise ConfigError(
            f"SEARCH_R1_MAX_VERSION_LAG={config.max_version_lag} masks the tokens that lag the policy being trained "
            f"when slime forms the batch, in {REWARD_POST_PROCESS_PATH}, which slime does not call; accepted: "
            f"--custom-reward-post-process-path {REWARD_POST_PROCESS_PATH} (run_qwen2.5_3B.sh passes it), or "
            "SEARCH_R1_MAX_VERSION_LAG unset"
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
    check_long_horizon(args, config)
    warnings += refusals  # at a sample: see the module's docstring
    if config.llm_api_mode == "chat" and config.token_tracking_mode == "router_radix":
        warnings.append(
            "LLM_API_MODE=chat with TOKEN_TRACKING_MODE=router_radix works but sends rendered text, not messages, "
            "through the router; router_handler or manual keep the messages"
        )
    normalized = getattr(args, "advantage_estimator", "grpo") in GROUP_NORMALIZED_ESTIMATORS and getattr(
        args, "rewards_normalization", True
    )
    # samples that get remove_sample: FAILED ones (a tool still failing), and those the judge left unscored
    removed = [
        "FAILED samples (a tool still failing after its retries)",
        *(["samples the judge could not score"] if config.reward == "judge" else []),
    ]
    if normalized and not evaluation:
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


def check_long_horizon(args, config: SearchR1Config) -> None:
    """Split trajectories where slime cannot take a list of samples for one episode (slime @624b824), and page chunks
    the response budget cannot hold."""
    if config.split_trajectories:
        split = "SEARCH_R1_SPLIT_TRAJECTORIES=true returns an episode as several samples (a list) to slime, but"
        accepted = "accepted: SEARCH_R1_SPLIT_TRAJECTORIES=false"
        if getattr(args, "partial_rollout", False):
            raise ConfigError(
                f"{split} --partial-rollout puts aborted groups back in its data buffer and hands them to generate() "
                "again, and abort() reads sample.response and generate_and_rm sample.response_length of each entry, "
                f"which a list has not; {accepted} with --partial-rollout, or split without --partial-rollout"
            )
        if getattr(args, "rollout_function_path", None) == FULLY_ASYNC_ROLLOUT:
            raise ConfigError(
                f"{split} the fully-async rollout's abort check reads each group entry's status, which a list has "
                f"not, and a requeued group with a list in it fails in generate_and_rm; {accepted} with "
                f"--rollout-function-path {FULLY_ASYNC_ROLLOUT}"
            )
        if getattr(args, "group_rm", False):
            raise ConfigError(
                f"{split} --group-rm sets the reward on each group entry, which a list has not; {accepted} with "
                "--group-rm, or split without --group-rm"
            )
        normalized = getattr(args, "advantage_estimator", "grpo") in GROUP_NORMALIZED_ESTIMATORS and getattr(
            args, "rewards_normalization", True
        )
        hook = getattr(args, "custom_reward_post_process_path", None)
        if (
            normalized
            and hook != REWARD_POST_PROCESS_PATH
            and not getattr(args, "custom_convert_samples_to_train_data_path", None)
        ):
            raise ConfigError(
                f"{split} slime's own group normalisation counts each sample, so a split episode would weigh as many "
                f"times as it has samples in its group (and the groups no longer line up); accepted: "
                f"--custom-reward-post-process-path {REWARD_POST_PROCESS_PATH} with split trajectories"
            )
    budget = getattr(args, "rollout_max_response_len", None)
    shown = config.page_chunk_tokens + PAGE_CHUNK_FRAME_TOKENS
    if config.page_chunk_tokens and budget and shown >= int(budget):
        raise ConfigError(
            f"SEARCH_R1_PAGE_CHUNK_TOKENS={config.page_chunk_tokens} cannot fit --rollout-max-response-len {budget}: "
            f"a chunk is shown in up to {shown} tokens and the model must still write; accepted: 0 (off) or up to "
            f"{int(budget) - PAGE_CHUNK_FRAME_TOKENS - 1}"
        )


def fully_async_problems(args) -> tuple[list[str], list[str]]:
    """With slime's fully-async rollout: what cannot work (refusals) and what would quietly waste work (warnings)."""
    if getattr(args, "rollout_function_path", None) != FULLY_ASYNC_ROLLOUT:
        return [], []
    refusals, warnings = [], []
    if getattr(args, "colocate", False):
        refusals.append(
            f"--colocate with --rollout-function-path {FULLY_ASYNC_ROLLOUT}: the fully-async rollout generates while "
            "training runs, so the two need GPUs of their own (train_async.py refuses --colocate); accepted: "
            "ASYNC_MODE=fully without --colocate, training on ACTOR_GPUS and rollout on the rest of NUM_GPUS"
        )
    evaluation = getattr(args, "eval_function_path", None) or FULLY_ASYNC_ROLLOUT  # slime's default: the rollout's
    if getattr(args, "eval_interval", None) is not None and evaluation == FULLY_ASYNC_ROLLOUT:
        refusals.append(
            f"--eval-interval with {FULLY_ASYNC_ROLLOUT} as the evaluation function (slime's default is the rollout "
            "function) raises 'fully-async rollout doesn't support evaluation mode' at the first evaluation; "
            f"accepted: --eval-function-path {DEFAULT_ROLLOUT} (ASYNC_MODE=fully passes it), or no --eval-interval"
        )
    if not getattr(args, "rollout_global_dataset", True):
        refusals.append(
            f"--disable-rollout-global-dataset with {FULLY_ASYNC_ROLLOUT}: it reads prompts from slime's global data "
            "buffer (and asserts it); accepted: without --disable-rollout-global-dataset"
        )
    if not getattr(args, "partial_rollout", False):
        warnings.append(
            f"{FULLY_ASYNC_ROLLOUT} without --partial-rollout: every weight update aborts the episodes in flight "
            "and slime requeues their groups to start over, so an episode longer than one training step may never "
            "finish; add --partial-rollout to resume them where they stopped"
        )
    return refusals, warnings


def check_router_mode(config: SearchR1Config, legacy_router: bool) -> None:
    """The router modes need the slime router slime removed in March 2026 (THUDM/slime#1735): the user must say so
    (LEGACY_SLIME_ROUTER=1, a launch knob)."""
    if config.token_tracking_mode not in ("router_radix", "router_handler"):
        return
    if not legacy_router:
        raise ConfigError(
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} needs the old slime router with its radix-tree "
            "cache (/retrieve_from_text, /retrieve_from_messages_template), which current slime no longer has "
            "(removed in THUDM/slime#1735). Use TOKEN_TRACKING_MODE=manual (token-exact with any SGLang engine or "
            f"router), or set {LEGACY_ROUTER_VARIABLE}=1 if your slime still launches that router"
        )


def parse_slime_flags(train_args: list[str]) -> argparse.Namespace:
    """The slime flags check_slime_args reads, parsed from train.py's command line with slime's defaults."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for flag in (
        "--use-tis",
        "--use-rollout-logprobs",
        "--get-mismatch-metrics",
        "--use-rollout-routing-replay",
        "--partial-rollout",
        "--mask-offpolicy-in-partial-rollout",
        "--colocate",
        "--group-rm",
    ):
        parser.add_argument(flag, action="store_true", default=False)
    parser.add_argument("--disable-rollout-global-dataset", action="store_false", dest="rollout_global_dataset")
    parser.add_argument("--rollout-function-path", default=DEFAULT_ROLLOUT)
    parser.add_argument("--hf-checkpoint", default=None)
    parser.add_argument("--eval-function-path", default=None)
    parser.add_argument("--eval-interval", type=int, default=None)
    parser.add_argument("--rollout-top-p", type=float, default=1.0)
    parser.add_argument("--rollout-max-response-len", type=int, default=None)
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--disable-rewards-normalization", action="store_false", dest="rewards_normalization")
    parser.add_argument("--custom-reward-post-process-path", default=None)
    parser.add_argument("--custom-convert-samples-to-train-data-path", default=None)
    try:
        known, _ = parser.parse_known_args(train_args)
    except argparse.ArgumentError as exc:
        raise ConfigError(f"train.py's flags: {exc}") from None
    return known
