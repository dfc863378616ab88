"""What an episode leaves on its sample, in sample.metadata["search_r1"], and the named ways to read it back.

generate() writes the episode's counters, how it ended and (chat mode) its conversation; reward_func adds the
reward's breakdown; the log hooks, evaluate.py and the viewer read them. Everything stored is plain Python (dicts,
lists, str, int, float, bool, None): slime keeps samples in its data buffer and dumps them with torch.save.
"""

from enum import Enum

METADATA_KEY = "search_r1"


class FinishReason(str, Enum):
    """How an episode ended (the loop's table, loop.py); the log hooks count each one."""

    ANSWER = "answer"
    MAX_TURNS = "max_turns"
    TOKEN_BUDGET = "token_budget"
    TOOL_FAILED = "tool_failed"
    ROLLOUT_ABORTED = "rollout_aborted"  # slime's abort flag, seen before a turn or while a tool waited
    ENGINE_ABORT = "engine_abort"  # the engine answered a turn with finish_reason abort


def episode_record(sample) -> dict | None:
    """The record generate() wrote on `sample`, or None for a sample this plugin did not generate."""
    record = (getattr(sample, "metadata", None) or {}).get(METADATA_KEY)
    return record if isinstance(record, dict) else None


def write_episode(sample, record: dict) -> None:
    sample.metadata[METADATA_KEY] = record


def forget_episode(sample) -> None:
    """A sample generated again from scratch (slime retries it) keeps nothing of the earlier episode."""
    sample.metadata = {k: v for k, v in (sample.metadata or {}).items() if k != METADATA_KEY}


def record_reward(sample, reward: dict) -> None:
    """reward_func's breakdown {score, em, format_valid, retrieval_hit}, where the log hooks find it."""
    record = episode_record(sample)
    if record is not None:
        record["reward"] = dict(reward)


def reward_of(record: dict) -> dict | None:
    reward = record.get("reward")
    return reward if isinstance(reward, dict) else None


def conversation_of(record: dict) -> list[dict] | None:
    """Chat mode: the episode's messages after the prompt, as OpenAI messages."""
    return record.get("conversation")


def resume_point(record: dict) -> dict | None:
    """Where an episode slime aborted stood: {"turn_index", "stage", "turn_start", "conversation_start"} (written only
    with --partial-rollout, when slime keeps the sample to resume it in a later rollout)."""
    point = record.get("resume")
    return point if isinstance(point, dict) else None


def tool_counters(record: dict) -> dict[str, dict]:
    """Per tool name: {"calls": finished calls, "failures": calls that failed for good, "seconds": [each call's]}."""
    return record.get("tools") or {}
