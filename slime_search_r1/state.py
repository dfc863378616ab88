"""One episode's state: the loop owns it and hands it to the protocol, the driver and the tools; it is recorded on
the sample at the end (record.py)."""

from argparse import Namespace
from dataclasses import asdict, dataclass, field
from typing import Any

from slime.utils.types import Sample
from slime_search_r1.record import FinishReason, write_episode
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

    def tool(self, name: str) -> ToolStats:
        return self.tools.setdefault(name, ToolStats())


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
    tools: dict[str, Tool] = field(init=False)  # the enabled tools, by name

    def __post_init__(self) -> None:
        self.tools = enabled_tools(self.config)

    @property
    def aborted(self) -> bool:
        return bool(self.generate_state.aborted)

    def begin_turn(self) -> None:
        self.turn_started_at = len(self.conversation) if self.conversation is not None else 0

    def history_before_turn(self) -> list[dict]:
        """The conversation before the assistant turn under way (chat mode)."""
        return (self.conversation or [])[: self.turn_started_at]

    def finish(self, status: Sample.Status, reason: FinishReason) -> Sample:
        """The episode's end on the sample: its status, and its record in its metadata."""
        record = asdict(self.stats)
        record.update(finish_reason=reason.value, evaluation=self.evaluation)
        if self.conversation is not None:
            record["conversation"] = self.conversation
        write_episode(self.sample, record)
        self.sample.status = status
        self.sample.remove_sample = status == Sample.Status.FAILED and self.config.drop_failed_samples
        return self.sample
