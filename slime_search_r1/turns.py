"""What one turn is made of, as it passes between the loop, a token driver and a protocol.

A driver returns the Turn the model generated; the protocol reads it into an Action (its tool calls, or its
answer); the loop runs the calls and the protocol turns their results into the Reply the model is shown next.
"""

from dataclasses import dataclass, field


@dataclass
class Turn:
    """One model turn, whichever way its tokens came: what was sampled, how it ended, and its text."""

    ids: list[int]
    finish_type: str  # "stop" | "length" | "abort"
    text: str = ""
    log_probs: list[float] | None = None  # the engine's, one per id (manual mode with TRACK_LOG_PROBS)
    meta_info: dict = field(default_factory=dict)  # SGLang's, handed on to slime's append_response_tokens
    message: dict | None = None  # the assistant message, when a server parsed it (router_handler)


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: dict  # as the model wrote them (the recorded conversation keeps these)
    parsed: dict = field(default_factory=dict)  # as the tool read them: what it runs on
    error: str | None = None  # why the call cannot run; the model is told in the reply

    def to_dict(self) -> dict:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments, "parsed": self.parsed}


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
    truncated: int = 0  # how many tool results were cut to fit their tool's observation budget
