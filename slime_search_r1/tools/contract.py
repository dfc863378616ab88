"""A tool the model may call, in either protocol, how it fails, and how its calls are read and run.

A tool reads the arguments the model wrote (`read_arguments`: a dict in, the dict it runs on out, ValueError saying
what to fix) and runs them with the episode (`run`: observation text out, ToolError when its service fails for
good). Everything the protocols and the reward say about it comes from its own description: the chat schema, the
line the XML prompt gains when it is enabled, the hint after a malformed call, the token budget of what it returns,
the XML tag its result is shown in, and whether its results are retrieved text (the retrieval bonus reads only those).

The protocols read a call with read_call; the loop runs every call through run_calls, so a tool only returns text
or raises: its calls, failures and latency are counted here, under its name, for the log hooks.
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slime_search_r1.episode import ToolCall

logger = logging.getLogger(__name__)


class ToolError(RuntimeError):
    """The tool failed for good (its service down after retries, or an answer it cannot use): the sample ends
    FAILED, with remove_sample."""


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
    result_tag: str = "information"  # XML: the tag its result is shown between (Search-R1's <information>)
    retrieves: bool = False  # its results are retrieved text: a gold answer in one earns the retrieval bonus

    @property
    def schema(self) -> dict:
        """The OpenAI function schema a chat template shows the model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


# ---- calls: read with their tool's arguments (or refused with what to fix), run with per-tool counters ---------


def read_call(call_id: str, name: object, arguments: object, tools: Mapping[str, Tool]) -> ToolCall:
    """A call with its arguments read by its tool, or with the error the model is told."""
    if isinstance(arguments, str):  # OpenAI messages carry arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(call_id, str(name), {}, error="arguments are not valid JSON")
    if not isinstance(arguments, dict):
        return ToolCall(call_id, str(name), {}, error="arguments must be a JSON object")
    call = ToolCall(call_id, str(name), arguments)
    tool = tools.get(name) if isinstance(name, str) else None
    if tool is None:
        names = ", ".join(repr(n) for n in tools)
        call.error = f"unknown tool {name!r}; " + (
            f"the only tool is {names}" if len(tools) == 1 else f"the tools are {names}"
        )
        return call
    try:
        call.parsed = tool.read_arguments(arguments)
    except ValueError as exc:
        call.error = str(exc)
    return call


async def run_calls(calls: list[ToolCall], tools: Mapping[str, Tool], state) -> dict[str, str]:
    """The result text of every call its tool could read, by call id, all run at once.

    Raises ToolError when one fails for good (ToolAborted when slime aborted the rollout while it waited).
    """
    runnable = [call for call in calls if call.error is None]
    texts = await asyncio.gather(*(_run_one(call, tools[call.name], state) for call in runnable))
    return {call.call_id: text for call, text in zip(runnable, texts, strict=True)}


async def _run_one(call: ToolCall, tool: Tool, state) -> str:
    stats = state.stats.tool(call.name)
    started = time.perf_counter()
    try:
        text = await tool.run(call.parsed, state)
        if not isinstance(text, str):
            raise ToolError(f"it returned {type(text).__name__}, not the text the model is shown")
    except ToolAborted:  # it did not run: no counters (on resume it runs again)
        raise
    except Exception as exc:
        if state.aborted:  # slime aborted while it waited or retried: stopped, not failed (it runs again on resume)
            raise ToolAborted(f"the rollout was aborted while {call.name} ran: {exc}") from exc
        # Whatever a tool raises fails this sample, never the batch (CancelledError is no Exception: it propagates).
        error = exc if isinstance(exc, ToolError) else ToolError(f"{type(exc).__name__}: {str(exc)[:300]}")
        stats.failures += 1
        stats.seconds.append(time.perf_counter() - started)  # retries included: what the sample waited
        state.stats.tool_error = f"{call.name}: {error}"[:500]
        logger.warning("tool %s failed for good, sample marked FAILED: %s", call.name, error)
        if error is exc:
            raise
        raise error from exc
    stats.calls += 1
    stats.seconds.append(time.perf_counter() - started)
    return text
