"""The tools the model can call, by name: `search` is one entry, and a new tool is a new entry.

Both protocols dispatch through TOOLS: XML mode reads `<name>text</name>` (Search-R1's `<search> q </search>`),
chat mode reads `{"name", "arguments"}` tool calls, and the chat reward checks calls against it too. A tool runs
with the episode's EpisodeState (state.py: config, counters, slime's abort); this module imports no slime, so the
data scripts can read the schemas without it.
"""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from slime_search_r1.protocols.actions import ToolCall
from slime_search_r1.search.dispatch import SearchAborted, SearchError, search
from slime_search_r1.search.results import format_documents

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict  # the OpenAI function schema a chat template shows the model
    read_arguments: Callable[[dict], list[str]]  # -> what to run; raises ValueError saying what to fix
    run: Callable[..., Awaitable[str]]  # (state, queries) -> the text the model is shown (before any cut)
    usage: str  # what the model is told after a malformed call
    xml_argument: str = "query"  # the argument that the text of an XML tag <name>...</name> fills


TOOLS: dict[str, Tool] = {}


def register_tool(tool: Tool) -> None:
    TOOLS[tool.name] = tool


def tool_schemas() -> list[dict]:
    """Every registered tool's OpenAI function schema, as the chat data and the chat template list them."""
    return [tool.schema for tool in TOOLS.values()]


def check_call(call_id: str, name: object, arguments: object) -> ToolCall:
    """A tool call with its arguments read by its tool, or with the error the model is told."""
    if isinstance(arguments, str):  # OpenAI messages carry arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(call_id, str(name), {}, error="arguments are not valid JSON")
    if not isinstance(arguments, dict):
        return ToolCall(call_id, str(name), {}, error="arguments must be a JSON object")
    call = ToolCall(call_id, str(name), arguments)
    tool = TOOLS.get(name) if isinstance(name, str) else None
    if tool is None:
        names = ", ".join(repr(n) for n in TOOLS)
        call.error = f"unknown tool {name!r}; " + (
            f"the only tool is {names}" if len(TOOLS) == 1 else f"the tools are {names}"
        )
        return call
    try:
        call.queries = tool.read_arguments(arguments)
    except ValueError as exc:
        call.error = str(exc)
    return call


# ---- search ------------------------------------------------------------------------------------------------------

SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": (
            "Search Wikipedia and return the top passages. Give one query, or a list of queries to search "
            "several things at once."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    ],
                    "description": "What to search for.",
                }
            },
            "required": ["query"],
        },
    },
}
MAX_QUERIES_PER_CALL = 5


def read_search_arguments(arguments: dict) -> list[str]:
    query = arguments.get("query")
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        raise ValueError("'query' must be a non-empty string or a list of non-empty strings")
    if len(queries) > MAX_QUERIES_PER_CALL:
        raise ValueError(f"at most {MAX_QUERIES_PER_CALL} queries per call")
    return [q.strip() for q in queries]


async def timed_search(state, query: str) -> list[str]:
    """search() with the sample's counters kept; SearchError (after retries) is logged and re-raised."""
    stats = state.stats
    started = time.perf_counter()
    try:
        contents = await search(state.config, query, lambda: state.aborted)
    except SearchAborted:  # it never ran: no latency of its own
        raise
    except SearchError as exc:
        stats.search_latencies.append(time.perf_counter() - started)  # retries included: what the sample waited
        stats.search_failures += 1
        stats.search_error = str(exc)[:500]
        logger.warning("search failed for good, sample marked FAILED: %s", exc)
        raise
    finally:
        stats.search_seconds += time.perf_counter() - started
    stats.search_latencies.append(time.perf_counter() - started)
    stats.searches += 1
    return contents


async def run_search(state, queries: list[str]) -> str:
    """Search-R1's passages for every query, numbered across them (`Doc 1(Title: ...) ...`)."""
    found = await asyncio.gather(*(timed_search(state, query) for query in queries))
    return format_documents([content for contents in found for content in contents]).strip()


register_tool(Tool("search", SEARCH_SCHEMA, read_search_arguments, run_search, 'Call search with {"query": "..."}.'))
