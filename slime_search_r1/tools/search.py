"""`search`: Search-R1's tool. The model writes `<search> query </search>` (XML) or calls search(query) (chat), and
is shown the top passages of the configured search backend as Search-R1 formats them (`Doc 1(Title: ...) ...`).
"""

import asyncio

from slime_search_r1.search.dispatch import SearchAborted, SearchError, search
from slime_search_r1.search.results import format_documents
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError

MAX_QUERIES_PER_CALL = 5


def read_search_arguments(arguments: dict) -> dict:
    query = arguments.get("query")
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) and q.strip() for q in queries):
        raise ValueError("'query' must be a non-empty string or a list of non-empty strings")
    if len(queries) > MAX_QUERIES_PER_CALL:
        raise ValueError(f"at most {MAX_QUERIES_PER_CALL} queries per call")
    return {"queries": [q.strip() for q in queries]}


async def run_search(arguments: dict, state) -> str:
    """Search-R1's passages for every query, numbered across them; their URLs too when `access` can open them."""
    try:
        found = await asyncio.gather(
            *(search(state.config, query, lambda: state.aborted) for query in arguments["queries"])
        )
    except SearchAborted as exc:
        raise ToolAborted(str(exc)) from exc
    except SearchError as exc:
        raise ToolError(str(exc)) from exc
    documents = [document for hits in found for document in hits]
    return format_documents(documents, with_urls="access" in state.config.tools).strip()


SEARCH = Tool(
    name="search",
    description=(
        "Search Wikipedia and return the top passages. Give one query, or a list of queries to search several "
        "things at once."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
                "description": "What to search for.",
            }
        },
        "required": ["query"],
    },
    read_arguments=read_search_arguments,
    run=run_search,
    usage='Call search with {"query": "..."}.',
    xml_argument="query",
    xml_usage="If I want to search, I should put the query between <search> and </search>.",
    observation_budget=lambda config: config.max_obs_tokens,  # Search-R1's max_obs_length
)
SEARCH_SCHEMA = SEARCH.schema
