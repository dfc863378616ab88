"""What slime hands the plugin on a rollout: its args, its default sampling params, a chat-templated prompt, and
the calls of slime's rollout logging into the plugin's log functions.

Shared by the pytest fixtures (conftest.py) and the wrapper's stand-in training process (standin_training.py).
"""

import importlib
from argparse import Namespace

from slime_search_r1.data import search_r1_prompt


# The log functions run_qwen2.5_3B.sh hands slime (a launch-script test keeps the two equal).
ROLLOUT_LOG_FUNCTION = "generate_with_search.log_rollout_metrics"
EVAL_ROLLOUT_LOG_FUNCTION = "generate_with_search.log_eval_rollout_metrics"


def chat_prompt(tokenizer, question: str) -> str:
    """The prompt string slime builds with --apply-chat-template from Search-R1's parquet."""
    messages = [{"role": "user", "content": search_r1_prompt(question)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def slime_sampling_params(max_new_tokens: int) -> dict:
    """slime's default per-sample sampling params (GenerateState.sampling_params)."""
    return dict(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=max_new_tokens,
        stop=None,
        stop_token_ids=None,
        skip_special_tokens=False,
        no_stop_trim=True,
        spaces_between_special_tokens=False,
    )


def router_address(url: str) -> dict:
    """slime's --sglang-router-ip/--sglang-router-port for a loopback http://host:port URL."""
    host, port = url.removeprefix("http://").split(":")
    return {"sglang_router_ip": host, "sglang_router_port": int(port)}


def slime_args(tokenizer_dir: str, engine_url: str, **overrides) -> Namespace:
    """The slime args the plugin and slime's rollout code read, with slime's argparse defaults (after its
    post-processing: eval_reward_key falls back to reward_key), pointing at the engine (or router) at `engine_url`."""
    values = dict(
        hf_checkpoint=tokenizer_dir,
        **router_address(engine_url),
        sglang_server_concurrency=512,
        rollout_num_engines=1,
        sglang_dp_size=None,
        sglang_enable_deterministic_inference=False,
        sglang_speculative_algorithm=None,
        use_distributed_post=False,
        rollout_seed=42,
        rollout_max_response_len=1024,
        rollout_max_context_len=None,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        apply_chat_template_kwargs={},
        n_samples_per_prompt=1,
        rollout_batch_size=1,
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        custom_generate_function_path="generate_with_search.generate",
        custom_rm_path="generate_with_search.reward_func",
        rollout_sample_hook_path=None,
        group_rm=False,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        use_tis=False,
        use_rollout_logprobs=False,
        get_mismatch_metrics=False,
        use_rollout_routing_replay=False,
        custom_reward_post_process_path=None,
        custom_convert_samples_to_train_data_path=None,
        reward_key=None,
        eval_reward_key=None,
        # logging (slime's defaults: no wandb, no TensorBoard, metrics at the rollout id)
        use_wandb=False,
        use_tensorboard=False,
        wandb_always_use_train_step=False,
        global_batch_size=1,
        load_debug_rollout_data=None,
        custom_rollout_log_function_path=None,
        custom_eval_rollout_log_function_path=None,
    )
    values.update(overrides)
    if values["eval_reward_key"] is None:
        values["eval_reward_key"] = values["reward_key"]
    return Namespace(**values)


def load_function(path: str):
    """slime.utils.misc.load_function: "module.attr" -> the attribute."""
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


def log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> None:
    """slime's log_rollout_data (slime/observability/rollout_metrics.py) as the plugin meets it: the custom function
    first, which skips the rest by returning True; then slime's own metrics (two of them here) at rollout/step."""
    from slime.observability import logging_utils
    from slime.observability.metric_utils import compute_rollout_step

    if args.custom_rollout_log_function_path is not None:
        custom_log_func = load_function(args.custom_rollout_log_function_path)
        if custom_log_func(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
            return
    if args.load_debug_rollout_data:
        return
    log_dict = {**(rollout_extra_metrics or {})}
    log_dict["rollout/response_len/mean"] = sum(s.response_length for s in samples) / len(samples)
    log_dict["perf/rollout_time"] = rollout_time
    log_dict["rollout/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, log_dict, step_key="rollout/step")


def log_eval_rollout_data(rollout_id, args, data, extra_metrics=None) -> None:
    """slime's log_eval_rollout_data: the custom function first (True skips the rest), then eval/<dataset> (the
    mean reward per dataset) at eval/step. `data` is {dataset: {"rewards", "truncated", "samples"}}."""
    from slime.observability import logging_utils
    from slime.observability.metric_utils import compute_rollout_step

    if args.custom_eval_rollout_log_function_path is not None:
        custom_log_func = load_function(args.custom_eval_rollout_log_function_path)
        if custom_log_func(rollout_id, args, data, extra_metrics):
            return
    log_dict = extra_metrics or {}
    for key, result in data.items():
        log_dict[f"eval/{key}"] = sum(result["rewards"]) / len(result["rewards"])
    log_dict["eval/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, log_dict, step_key="eval/step")


def eval_data(dataset: str, samples, reward_key: str | None = None) -> dict:
    """What slime's eval_rollout_single_dataset returns for one dataset (samples sorted by index)."""
    rewards = [s.reward if not reward_key else s.reward[reward_key] for s in samples]
    return {
        dataset: {
            "rewards": rewards,
            "truncated": [s.status.value == "truncated" for s in samples],
            "samples": samples,
        }
    }
