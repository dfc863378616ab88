"""What slime hands the plugin on a rollout: its args, its default sampling params, a chat-templated prompt.

Shared by the pytest fixtures (conftest.py) and the wrapper's stand-in training process (standin_training.py).
"""

from argparse import Namespace

from xml_actions import search_r1_prompt


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
    )
    values.update(overrides)
    if values["eval_reward_key"] is None:
        values["eval_reward_key"] = values["reward_key"]
    return Namespace(**values)
