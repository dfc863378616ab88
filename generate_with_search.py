"""Search-R1 for slime: multi-turn search rollouts and their reward.

    --custom-generate-function-path generate_with_search.generate
    --custom-rm-path generate_with_search.reward_func
    --custom-reward-post-process-path generate_with_search.post_process_rewards           # FAILED out of groups
    --custom-rollout-log-function-path generate_with_search.log_rollout_metrics            # search metrics
    --custom-eval-rollout-log-function-path generate_with_search.log_eval_rollout_metrics  # and EM per source

LLM_API_MODE=generate speaks Search-R1's XML tags, chat speaks OpenAI tool calls; TOKEN_TRACKING_MODE=manual
keeps the trajectory token-exact with any SGLang engine, the router modes take it from the old slime router's
cache. The machinery is in slime_search_r1/ (its __init__.py maps it); the reward table is qa_em_format.py.

Edit SEARCH_R1_CONFIGS below or set the environment variables listed in slime_search_r1.config.ENV_OVERRIDES
(LLM_API_MODE, SEARCH_BACKEND, TOKEN_TRACKING_MODE, TRACK_LOG_PROBS, LOSS_MASK_MODE, RETRIEVAL_SERVER_URL,
GOOGLE_API_KEY, SEARCH_R1_*). A bad value stops the import with a message saying what is accepted.
"""

import logging

import google_search_server
from qa_em_format import FormatWeights, score_conversation, score_response
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.config import apply_env_overrides, check_slime_args, resolve_config
from slime_search_r1.data import golden_answers
from slime_search_r1.loop import run_episode
from slime_search_r1.search.dispatch import register_search_backend
from slime_search_r1.state import METADATA_KEY
from slime_search_r1.training.advantages import post_process_rewards  # noqa: F401 (slime loads it from here)
from slime_search_r1.training.metrics import log_eval_rollout_metrics, log_rollout_metrics  # noqa: F401 (likewise)

logger = logging.getLogger(__name__)

SEARCH_R1_CONFIGS = apply_env_overrides(
    {
        # ============== Modes ==============
        "llm_api_mode": "generate",  # "generate": XML tags over /generate | "chat": OpenAI tool calls
        "token_tracking_mode": "manual",  # "manual" | "router_radix" | "router_handler"
        "loss_mask_mode": "strict",  # "strict": observations masked out | "simple": trained too
        "return_logprob": True,  # engine log probs of every sampled token (needed for TIS)
        "engine_transport": "aiohttp",  # "aiohttp" | "slime": slime's post() (used anyway with --use-distributed-post)
        "engine_model": "actor",  # the policy's name in --sglang-config (slime's get_model_url); else slime's router
        # ============== Rollout ==============
        "max_turns": 3,  # model turns per sample; a search on the last turn is not executed
        "max_context_length": 16384,  # prompt + response tokens (slime's --rollout-max-context-len also caps it)
        "max_obs_tokens": 500,  # tokens of one <information> block (Search-R1's max_obs_length)
        # ============== Search ==============
        "topk": 3,
        "search_concurrency": 256,  # searches in flight per rollout process
        "search_backend": "local",  # "local" retrieval server | "google" (serper.dev)
        "search_timeout": 30.0,  # seconds per attempt
        "search_attempts": 3,  # tries in all (the first included), on connection errors, timeouts, 5xx and 429
        "drop_failed_samples": True,  # a FAILED sample (search down) gets remove_sample: kept out of the loss
        "local": {
            "search_url": "http://127.0.0.1:8000/retrieve",  # several servers: comma-separated
            "proxy": None,
        },
        "google": {
            "api_key": None,  # from GOOGLE_API_KEY; never logged
            "snippet_only": True,
            "proxy": None,
            "search_url": "https://google.serper.dev/search",
            "fetch_concurrency": 8,  # page downloads in flight when snippet_only is False
        },
        # ============== Reward ==============
        "format_score": 0.2,  # Search-R1's structure bonus; 0 gives pure exact match
        "final_format_score": None,  # wrong answer, bad format; None means format_score / 2
        "retrieval_score": 0.0,  # bonus when a gold answer appears in a retrieved block
    }
)

resolve_config(SEARCH_R1_CONFIGS)  # fail at import, not in the middle of a rollout
register_search_backend("google", google_search_server.search)  # SEARCH_BACKEND=google: serper.dev


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    config = resolve_config(SEARCH_R1_CONFIGS)
    for warning in check_slime_args(args, config):
        _warn_once(warning)
    if config.llm_api_mode == "chat" and config.token_tracking_mode == "router_radix":
        _warn_once(
            "LLM_API_MODE=chat with TOKEN_TRACKING_MODE=router_radix works but sends rendered text, not "
            "messages, through the router; router_handler or manual keep the messages"
        )
    return await run_episode(args, sample, sampling_params, config, evaluation)


def _prompt_text(args, sample: Sample) -> str:
    if isinstance(sample.prompt, str):
        return sample.prompt
    prompt_ids = sample.tokens[: len(sample.tokens) - sample.response_length]
    return GenerateState(args).tokenizer.decode(prompt_ids, skip_special_tokens=False)


async def reward_func(args, sample: Sample | list[Sample], **kwargs) -> float | dict | list:
    """Search-R1 EM with the configured format bonus; evaluation samples get pure EM.

    Returns a float, or {"score", "em", "format_valid", "retrieval_hit"} when slime's --reward-key is set;
    with --group-rm slime passes the group and gets one reward per sample.
    """
    if isinstance(sample, list):
        return [await reward_func(args, one) for one in sample]
    config = resolve_config(SEARCH_R1_CONFIGS)
    episode = (sample.metadata or {}).get(METADATA_KEY, {})  # what generate() recorded
    evaluation = bool(episode.get("evaluation"))
    weights = (
        FormatWeights()
        if evaluation
        else FormatWeights(config.format_score, config.final_format_score, config.retrieval_score)
    )
    golds = golden_answers(sample.label)
    conversation = episode.get("conversation")
    if conversation is not None:
        details = score_conversation(conversation, golds, weights)
    else:
        details = score_response(_prompt_text(args, sample), sample.response, golds, weights)
    reward = {
        "score": details.score,
        "em": details.em,
        "format_valid": float(details.format_valid),
        "retrieval_hit": float(details.retrieval_hit),
    }
    if METADATA_KEY in (sample.metadata or {}):
        episode["reward"] = reward  # what the rollout log function plots (slime_search_r1/training/metrics.py)
    # slime indexes a dict reward with --reward-key (training) and --eval-reward-key (evaluation) only.
    if getattr(args, "reward_key", None) or (evaluation and getattr(args, "eval_reward_key", None)):
        return dict(reward)
    return details.score
