"""`access`: ASearcher's page tool. The model writes `<access> URL </access>` (XML) or calls access(url) (chat) with a
URL from the search results, and is shown that page's text (its `contents`) from the local retriever's POST /access
(started with --pages_path), cut to max_page_tokens; a URL no page has gets an observation that says so. Off by
default: SEARCH_R1_TOOLS=search,access turns it on, and search results then show each passage's URL.
"""

from slime_search_r1.search.dispatch import SearchAborted, SearchError, access_page
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError

MAX_URL_CHARS = 2048
# A token of Qwen's vocabulary is rarely longer than this many characters: a page is cut to this many characters
# per token of its budget before it is tokenized (a page can be megabytes; the observation is max_page_tokens).
CHARACTERS_PER_TOKEN_AT_MOST = 32


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
