"""Search-R1 for slime: multi-turn search rollouts and their reward.

    --custom-generate-function-path generate_with_search.generate
    --custom-rm-path generate_with_search.reward_func                                     # EM, F1, cover EM, judge
    --custom-reward-post-process-path generate_with_search.post_process_rewards           # FAILED out of groups
    --custom-rollout-log-function-path generate_with_search.log_rollout_metrics            # search metrics
    --custom-eval-rollout-log-function-path generate_with_search.log_eval_rollout_metrics  # and EM per source

LLM_API_MODE=generate speaks Search-R1's XML tags, chat speaks OpenAI tool calls; TOKEN_TRACKING_MODE=manual
keeps the trajectory token-exact with any SGLang engine, the router modes take it from the old slime router's
cache. The machinery is in slime_search_r1/ (its __init__.py maps it); the reward table is qa_em_format.py.

Settings: SEARCH_R1_CONFIGS below holds what you change; every setting, its default, its environment variable
(LLM_API_MODE, SEARCH_BACKEND, TOKEN_TRACKING_MODE, RETRIEVAL_SERVER_URL, SEARCH_R1_*, ...) and what it accepts is
one row of slime_search_r1/settings/table.py (`python -m slime_search_r1.launch --list` prints them). Environment
variables override the dict. A bad value stops the import with a message saying where it came from and what is
accepted.
"""

import asyncio
import json
import logging
import weakref

from qa_em_format import FormatWeights, read_chat, read_response, score_reading
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample
from slime_search_r1.data import golden_answers
from slime_search_r1.episode import conversation_of, episode_record, record_reward
from slime_search_r1.loop import enabled_tools, run_episode
from slime_search_r1.protocols.xml_tags import prompt_text
from slime_search_r1.scoring.rewards import JUDGE, question_of
from slime_search_r1.scoring.rewards import grade as grade_answer
from slime_search_r1.settings.sources import resolve_config, search_r1_configs
from slime_search_r1.slime_flags import check_slime_args
from slime_search_r1.training.advantages import post_process_rewards  # noqa: F401 (slime loads it from here)
from slime_search_r1.training.metrics import log_eval_rollout_metrics, log_rollout_metrics  # noqa: F401 (likewise)

logger = logging.getLogger(__name__)

SEARCH_R1_CONFIGS = search_r1_configs(
    {
        # Your settings; every other one keeps its default. For example:
        #   "max_turns": 4,
        #   "search_backend": "google", "google": {"api_key": "..."},   # or GOOGLE_API_KEY in the environment
        #   "local": {"search_url": "http://10.0.0.5:8000"},              # or RETRIEVAL_SERVER_URL
        #   "format_score": 0.0,                                          # pure exact match
        # Keep it a literal dict: the launch script checks it before Ray starts, without importing this file.
    }
)


def current_config():
    """SEARCH_R1_CONFIGS checked, once per content: a script or a test that changes the dict gets it checked again."""
    key = json.dumps(SEARCH_R1_CONFIGS, sort_keys=True, default=repr)
    if _resolved.get("key") != key:
        _resolved.update(key=key, config=resolve_config(SEARCH_R1_CONFIGS))
    return _resolved["config"]


def checked_config(args, evaluation: bool):
    """current_config(), its agreement with slime's flags checked once per args object (its warnings logged once)."""
    config = current_config()
    seen = _checked_args.get(id(args))
    if seen is None or seen[0]() is not args:  # a new args object (or one reusing a freed one's id)
        seen = _checked_args[id(args)] = (weakref.ref(args), set())
    if (id(config), evaluation) not in seen[1]:
        for warning in check_slime_args(args, config, evaluation=evaluation):
            if warning not in _warned:
                _warned.add(warning)
                logger.warning(warning)
        seen[1].add((id(config), evaluation))
    return config


_resolved: dict = {}
_checked_args: dict[int, tuple] = {}
_warned: set[str] = set()
current_config()  # fail at import, not in the middle of a rollout


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample | list[Sample]:
    """One episode; with SEARCH_R1_SPLIT_TRAJECTORIES=true (training) a list of samples, one per context."""
    config = checked_config(args, evaluation)
    return await run_episode(args, sample, sampling_params, config, evaluation)


async def reward_func(args, sample: Sample | list[Sample], **kwargs) -> float | dict | list:
    """Search-R1's reward table over the configured answer score (SEARCH_R1_REWARD: em by default, f1, cover_em or
    judge) with the configured format bonus; evaluation samples get pure EM.

    Returns a float, or {"score", "em", "format_valid", "retrieval_hit"} (and the reward's own score, "f1",
    "cover_em" or "judge", when it is not em) when slime's --reward-key is set; with --group-rm slime passes the
    group and gets one reward per sample. A sample the judge could not score is marked in its record and gets
    remove_sample, so that post_process_rewards keeps it out of its group's advantages.
    """
    if isinstance(sample, list):
        return list(await asyncio.gather(*(reward_func(args, one) for one in sample)))  # judge requests overlap
    config = current_config()
    tools = enabled_tools(config)
    record = episode_record(sample) or {}  # what generate() recorded
    evaluation = bool(record.get("evaluation"))
    weights = (
        FormatWeights()
        if evaluation
        else FormatWeights(config.format_score, config.final_format_score, config.retrieval_score)
    )
    golds = golden_answers(sample.label)
    conversation = conversation_of(record)
    if conversation is not None:
        reading = read_chat(conversation, tools)
    else:
        # the prompt exactly as the episode conditioned on it (messages rendered with the sample's tokenizer)
        tokenizer = None if isinstance(sample.prompt, str) else GenerateState(args).tokenizer
        reading = read_response(prompt_text(args, tokenizer, sample, tools), sample.response, tools)
    # evaluation stays pure EM (evaluate.py asks the judge itself); a rule-based reward's score is recorded beside it
    name = config.reward if not (evaluation and config.reward == JUDGE) else "em"
    grade = await grade_answer(config, name, question_of(sample) if name == JUDGE else "", golds, reading.answer)
    answer_score = None if name == "em" or evaluation else (grade.value if grade.scored else 0.0)
    details = score_reading(reading, golds, weights, answer_score)
    reward = {
        "score": details.score,
        "em": details.em,
        "format_valid": float(details.format_valid),
        "retrieval_hit": float(details.retrieval_hit),
    }
    if name != "em":
        reward[name] = grade.value if grade.scored else 0.0  # a number for slime; the record says it is unscored
    # what the log hooks plot (training/metrics.py) and the viewer shows, the judge's verdict included
    record_reward(sample, reward, name, grade.verdict.as_dict() if grade.verdict else None)
    if not grade.scored:
        sample.remove_sample = True  # kept out of the loss and of its group's advantages, like a failed search
    # slime indexes a dict reward with --reward-key (training) and --eval-reward-key (evaluation) only.
    if getattr(args, "reward_key", None) or (evaluation and getattr(args, "eval_reward_key", None)):
        return dict(reward)
    return details.score
