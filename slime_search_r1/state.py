"""One episode's state: the loop owns it and hands it to the protocol and the tools; it is recorded at the end."""

from argparse import Namespace
from dataclasses import asdict, dataclass, field
from typing import Any

from slime.utils.types import Sample
from slime_search_r1.config import SearchR1Config

METADATA_KEY = "search_r1"  # sample.metadata[METADATA_KEY] holds the counters below (training/metrics.py plots them)


@dataclass
class EpisodeStats:
    """Per-sample counters, stored in sample.metadata["search_r1"]."""

    turns: int = 0
    searches: int = 0
    search_failures: int = 0
    search_seconds: float = 0.0
    search_latencies: list[float] = field(default_factory=list)  # seconds of each search call, failed ones too
    invalid_actions: int = 0  # finished turns with neither a usable search nor an answer
    observation_tokens: int = 0
    truncated_observations: int = 0
    finish_reason: str = ""
    evaluation: bool = False
    search_error: str | None = None


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

    @property
    def aborted(self) -> bool:
        return bool(self.generate_state.aborted)

    def record(self, status: Sample.Status, reason: str) -> Sample:
        """The episode's end on the sample: its status, and its counters (and conversation) in its metadata."""
        self.sample.status = status
        self.stats.finish_reason = reason
        self.stats.evaluation = self.evaluation
        self.sample.metadata[METADATA_KEY] = asdict(self.stats)
        if self.conversation is not None:
            self.sample.metadata[METADATA_KEY]["conversation"] = self.conversation
        self.sample.remove_sample = status == Sample.Status.FAILED and self.config.drop_failed_samples
        return self.sample
