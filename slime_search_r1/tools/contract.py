"""A tool the model may call, in either protocol, and how it fails.

A tool reads the arguments the model wrote (`read_arguments`: a dict in, the dict it runs on out, ValueError saying
what to fix) and runs them with the episode (`run`: observation text out, ToolError when its service fails for
good). Everything the protocols say about it comes from its own description: the chat schema, the line the XML
prompt gains when it is enabled, the hint after a malformed call, and the token budget of what it returns.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slime_search_r1.registry import TOOLS


class ToolError(RuntimeError):
    """The tool failed for good (its service down after retries, or an answer it cannot use): the sample ends
    FAILED, with remove_sample when drop_failed_samples."""


class ToolAborted(ToolError):
    """slime aborted the rollout while the tool waited: the call did not run, and runs again if the sample resumes."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str  # what the tool does, for the chat schema
    parameters: dict  # the JSON schema of its arguments object
    read_arguments: Callable[[dict], dict]  # the model's arguments -> what run() takes; ValueError says what to fix
    run: Callable[[dict, Any], Awaitable[str]]  # (arguments read, EpisodeState) -> the text the model is shown
    usage: str  # chat: the hint after a malformed call, e.g. 'Call search with {"query": "..."}.'
    xml_argument: str  # XML: the argument the text of <name>...</name> fills
    xml_usage: str  # XML: the sentence of the invalid-action message that names this tool's tag
    observation_budget: Callable[[Any], int]  # settings -> the most tokens one result may take
    prompt_line: str | None = None  # XML: a sentence added to Search-R1's instruction when the tool is enabled

    @property
    def schema(self) -> dict:
        """The OpenAI function schema a chat template shows the model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def enabled_tools(config) -> dict[str, Tool]:
    """The tools the `tools` setting enables, by name, in its order."""
    return {name: TOOLS.get(name) for name in config.tools}
