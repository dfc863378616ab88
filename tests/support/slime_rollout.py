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
    """The slime args the plugin reads, with slime's defaults, pointing at the engine (or router) at `engine_url`."""
    values = dict(
        hf_checkpoint=tokenizer_dir,
        **router_address(engine_url),
        rollout_max_response_len=1024,
        rollout_max_context_len=None,
        partial_rollout=False,
        rollout_top_p=1.0,
        rollout_temperature=1.0,
        n_samples_per_prompt=1,
        use_tis=False,
        reward_key=None,
        eval_reward_key=None,
    )
    values.update(overrides)
    return Namespace(**values)
