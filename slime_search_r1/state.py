"""One episode's state: the loop owns it and hands it to the protocol, the driver and the tools; it is recorded on
the sample at the end (record.py), with where it stood when slime aborted it, so that a partial rollout resumes it."""

from argparse import Namespace
from dataclasses import asdict, dataclass, field
from typing import Any

from slime.utils.types import Sample
from slime_search_r1.record import FinishReason, conversation_of, resume_point, tool_counters, write_episode
from slime_search_r1.settings import SearchR1Config
from slime_search_r1.tools.contract import Tool, enabled_tools


@dataclass
class ToolStats:
    calls: int = 0  # calls that returned a result
    failures: int = 0  # calls that failed for good
    seconds: list[float] = field(default_factory=list)  # each call's time, retries included, failed ones too


@dataclass
class EpisodeStats:
    """Per-sample counters, stored in sample.metadata["search_r1"]."""

    turns: int = 0  # model turns that finished (an aborted one is finished when it resumes)
    invalid_actions: int = 0  # finished turns with neither a usable tool call nor an answer
    observation_tokens: int = 0
    truncated_observations: int = 0  # tool results cut to fit their tool's observation budget
    tools: dict[str, ToolStats] = field(default_factory=dict)  # by tool name
    tool_error: str | None = None  # the error that ended the episode FAILED
    generated_tokens: int = 0  # model tokens in the response (observations are not)
    resumes: int = 0  # partial rollout: how often an aborted episode was resumed
    earlier_policy_tokens: int = 0  # of generated_tokens, those an earlier policy wrote (before the last resume)
    resumed_at: list[int] = field(default_factory=list)  # the response length at each resume (tokens before it: older)

    def tool(self, name: str) -> ToolStats:
        return self.tools.setdefault(name, ToolStats())

    @classmethod
    def from_record(cls, record: dict) -> "EpisodeStats":
        counters = {name: record[name] for name in cls.__dataclass_fields__ if name in record and name != "tools"}
        tools = {name: ToolStats(**dict(stats)) for name, stats in tool_counters(record).items()}
        return cls(**counters, tools=tools)


@dataclass
class EpisodeState:
    args: Namespace
    sample: Sample
    config: SearchR1Config
    tokenizer: Any
    generate_state: Any  # slime's GenerateState: `.aborted` turns true when slime aborts the rollout
    evaluation: bool
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    conversation: list[dict] | None = None  # chat mode: the OpenAI messages after the prompt, as they happen
    turn_index: int = 0  # the model turn under way, from 0
    turn_started_at: int = 0  # len(conversation) when the turn under way began
    turn_start: int = 0  # response tokens before the turn under way
    stage: str = "turn"  # "turn": generating it (or about to); "tool": it was read and its calls are to run
    tools: dict[str, Tool] = field(init=False)  # the enabled tools, by name

    def __post_init__(self) -> None:
        self.tools = enabled_tools(self.config)

    @property
    def aborted(self) -> bool:
        return bool(self.generate_state.aborted)

    def begin_turn(self, response_length: int) -> None:
        self.turn_started_at = len(self.conversation) if self.conversation is not None else 0
        self.turn_start = response_length
        self.stage = "turn"

    def resume(self, record: dict, response_length: int) -> None:
        """Stand where an aborted episode stood (its record's resume point), with its counters and conversation;
        what it generated so far (the first `response_length` response tokens) was written by an earlier policy."""
        point = resume_point(record)
        self.stats = EpisodeStats.from_record(record)
        self.stats.resumes += 1
        self.stats.earlier_policy_tokens = self.stats.generated_tokens
        self.stats.resumed_at = [*self.stats.resumed_at, response_length]
        if self.conversation is not None:
            self.conversation = list(conversation_of(record) or [])
        self.turn_index, self.stage = point["turn_index"], point["stage"]
        self.turn_start, self.turn_started_at = point["turn_start"], point["conversation_start"]

    def history_before_turn(self) -> list[dict]:
        """The conversation before the assistant turn under way (chat mode)."""
        return (self.conversation or [])[: self.turn_started_at]

    def finish(self, status: Sample.Status, reason: FinishReason) -> Sample:
        """The episode's end on the sample: its status, and its record in its metadata (where it stood too, when
        slime aborted it in a partial rollout: slime hands the sample back to be resumed)."""
        record = asdict(self.stats)
        record.update(finish_reason=reason.value, evaluation=self.evaluation)
        if self.conversation is not None:
            record["conversation"] = self.conversation
        if status == Sample.Status.ABORTED and getattr(self.args, "partial_rollout", False):
            record["resume"] = {
                "turn_index": self.turn_index,
                "stage": self.stage,
                "turn_start": self.turn_start,
                "conversation_start": self.turn_started_at,
            }
        write_episode(self.sample, record)
        self.sample.status = status
        self.sample.remove_sample = status == Sample.Status.FAILED and self.config.drop_failed_samples
        return self.sample
