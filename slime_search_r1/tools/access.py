"""`access`: ASearcher's page tool, and the page reads that answer it. The model writes `<access> URL </access>` (XML)
or calls access(url) (chat) with a URL from the search results, and is shown that page's text (its `contents`) from
the local retriever's POST /access (started with --pages_path), cut to max_page_tokens; a URL no page has gets an
observation that says so. Off by default: SEARCH_R1_TOOLS=search,access turns it on, and search results then show
each passage's URL. Pages are read from the servers the search tool's local backend spreads its searches over.
"""

from collections.abc import Callable

from slime_search_r1.http_client import RequestFailed
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError
from slime_search_r1.tools.search import SearchAborted, SearchError, client_for, guarded

MAX_URL_CHARS = 2048
# A token of Qwen's vocabulary is rarely longer than this many characters: a page is cut to this many characters
# per token of its budget before it is tokenized (a page can be megabytes; the observation is max_page_tokens).
CHARACTERS_PER_TOKEN_AT_MOST = 32
# A page answer may weigh this much: ASearcher shows at most 250,000 characters of a page, and the observation is
# cut to max_page_tokens anyway; a server's --max_response_mb (16 by default) bounds it too.
PAGE_ANSWER_BYTES = 8 * 1024 * 1024


def read_access_arguments(arguments: dict) -> dict:
    url = arguments.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ValueError("'url' must be a non-empty string: a URL from the search results")
    if len(url.strip()) > MAX_URL_CHARS:
        raise ValueError(f"'url' must be at most {MAX_URL_CHARS} characters")
    return {"url": url.strip()}


async def run_access(arguments: dict, state) -> str:
    url = arguments["url"]
    try:
        page = await access_page(state.config, url, lambda: state.aborted)
    except SearchAborted as exc:
        raise ToolAborted(str(exc)) from exc
    except SearchError as exc:
        raise ToolError(str(exc)) from exc
    if page is None:
        return f"No page was found at {url}."
    text = page.get("contents")
    if not isinstance(text, str) or not text.strip():
        return f"The page at {url} has no text."
    return text[: state.config.max_page_tokens * CHARACTERS_PER_TOKEN_AT_MOST]


ACCESS = Tool(
    name="access",
    description="Read the page at a URL from the search results, and return its text.",
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "description": "A URL shown in the search results."}},
        "required": ["url"],
    },
    read_arguments=read_access_arguments,
    run=run_access,
    usage='Call access with {"url": "..."}.',
    xml_argument="url",
    xml_usage="If I want to read a page, I should put its URL between <access> and </access>.",
    observation_budget=lambda config: config.max_page_tokens,
    prompt_line=(
        "You can read a page of the search results in full by <access> URL </access>, and it will be returned "
        "between <information> and </information>."
    ),
)


async def access_page(config, url: str, aborted: Callable[[], bool] | None = None) -> dict | None:
    """The page at `url` from the configured servers' /access (ASearcher's), or None; SearchError when it fails for
    good. It shares the searches' bound (search_concurrency): the same servers answer both."""

    async def page() -> dict | None:
        body, answered = await client_for(config).post({"urls": [url]}, PAGE_ANSWER_BYTES, access_url, aborted)
        result = body.get("result") if isinstance(body, dict) else None
        found = result[0] if isinstance(result, list) and len(result) == 1 else False
        if found is not None and not isinstance(found, dict):
            raise RequestFailed(f"{answered} answered without a usable 'result' list (one page or null per URL)")
        return found

    return await guarded(config, "page access", page, aborted)


def access_url(retrieve_url: str) -> str:
    """The /access endpoint of the server whose /retrieve endpoint this is."""
    return retrieve_url.removesuffix("/retrieve").rstrip("/") + "/access"
