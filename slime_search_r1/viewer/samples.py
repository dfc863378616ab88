"""What the viewer knows of a sample, whichever file it came from: a slime dump (Sample.to_dict) or a line of
evaluate.py's trajectories.jsonl; and the run (one rollout, one evaluation) it belongs to."""

from dataclasses import dataclass, field
from typing import Any

from slime_search_r1.episode import episode_record
from slime_search_r1.standin import scripted_record


@dataclass
class ViewSample:
    position: int  # where it sits in its file: slime's train dump names samples by this (rollout_position)
    status: str  # slime's Sample.Status value: completed, truncated, aborted, failed, pending
    prompt: str | list  # the prompt string, or chat messages
    response: str
    response_length: int
    metadata: dict  # sample.metadata: the plugin's record under "search_r1", data_source, ...
    label: Any = None
    answer: str | None = None  # what the model answered, as reward_func read it (None: it gave no answer)
    reward: Any = None  # slime's sample.reward: what GRPO trained on (a number, or reward_func's dict)
    index: int | None = None
    group_index: int | None = None
    remove_sample: bool = False
    prompt_ids: list[int] | None = None  # None when the file holds text only
    response_ids: list[int] | None = None
    loss_mask: list[int] | None = None  # one per response token: 1 trained, 0 shown to the model only
    rollout_log_probs: list[float] | None = None
    # per response token besides the rollout log probs: the train dump's (log_probs, ref_log_probs, advantages,
    # entropy, ...) and slime's teacher_log_probs
    series: dict[str, list[float]] = field(default_factory=dict)
    train_fields: dict = field(default_factory=dict)  # the train dump's other per-sample values
    other: dict = field(default_factory=dict)  # every other field the file holds, shown as it is

    @property
    def record(self) -> dict | None:
        return episode_record(self)

    @property
    def scripted(self) -> bool:
        """The scripted stand-in wrote its turns: its record's weight versions say so, or evaluate.py's line does."""
        return scripted_record(self.record) or bool(self.other.get("scripted"))


@dataclass
class Run:
    """The samples of one file (or folder): a training rollout, an evaluation rollout, or an evaluate.py run."""

    name: str
    kind: str  # "rollout", "eval" (slime's eval_<id> dump) or "evaluate" (an evaluate.py --output-dir)
    source: str
    samples: list[ViewSample]
    rollout_id: int | None = None
    train_sources: list[str] = field(default_factory=list)
    total: int | None = None  # samples in the source when the page holds only some of them
    notes: list[str] = field(default_factory=list)  # what the reader should know (a train dump that did not join)
