"""What the model did in a turn (an Action, with its tool calls) and what the environment answers (a Reply).

A protocol reads a turn into an Action and turns an Action into a Reply; the loop (loop.py) acts on both.
"""

from dataclasses import dataclass, field


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: dict
    queries: list[str] = field(default_factory=list)  # what the tool runs on, once its arguments were read
    error: str | None = None  # why the call cannot run; the model is told in the reply


@dataclass
class Action:
    calls: list[ToolCall] = field(default_factory=list)  # tool calls to answer (a malformed one answers its error)
    final: bool = False  # the model gave its answer: the episode ends
    invalid: bool = False  # neither a usable call nor an answer (counted in the sample's invalid_actions)
    message: dict | None = None  # chat mode: the assistant message, as the recorded conversation keeps it


@dataclass
class Reply:
    ids: list[int]  # what the model is shown next: appended to the trajectory as observation tokens
    messages: list[dict] = field(default_factory=list)  # chat mode: the messages those ids render
    truncated: int = 0  # how many tool results were cut to fit max_obs_tokens
