"""`access`: ASearcher's page tool, and the page reads that answer it. The model writes `<access> URL </access>` (XML)
or calls access(url) (chat) with a URL from the search results, and is shown that page's text (its `contents`) from
the local retriever's POST /access (started with --pages_path), cut to max_page_tokens; a URL no page has gets an
observation that says so. Off by default: SEARCH_R1_TOOLS=search,access turns it on, and search results then show
each passage's URL. Pages are read from the servers the search tool's local backend spreads its searches over.

Reading chunks (page_chunk_tokens > 0, as ASearcher trains them): a page is cut into at most MAX_PAGE_CHUNKS chunks of
page_chunk_tokens tokens and shown one chunk per call, `[part i of n]` first: accessing the same URL again shows
the next one. Each chunk result carries a short form (its first page_short_tokens tokens), which the contexts after
the turn that read it show instead (loop.py, with split_trajectories), so a long page costs the context one chunk
at a time.
"""

from collections.abc import Callable
from dataclasses import dataclass

from slime_search_r1.episode import encode_text
from slime_search_r1.http_client import RequestFailed
from slime_search_r1.settings.rules import PAGE_CHUNK_FRAME_TOKENS
from slime_search_r1.tools.contract import Tool, ToolAborted, ToolError
from slime_search_r1.tools.search import SearchAborted, SearchError, client_for, guarded

MAX_URL_CHARS = 2048
# A token of Qwen's vocabulary is rarely longer than this many characters: a page is cut to this many characters
# per token of its budget before it is tokenized (a page can be megabytes; the observation is max_page_tokens).
CHARACTERS_PER_TOKEN_AT_MOST = 32
# A page answer may weigh this much: ASearcher shows at most 250,000 characters of a page, and the observation is
# cut to max_page_tokens anyway; a server's --max_response_mb (16 by default) bounds it too.
PAGE_ANSWER_BYTES = 8 * 1024 * 1024
# Chunks of one page at most, as ASearcher reads pages; the rest of the page is never shown.
MAX_PAGE_CHUNKS = 10


def read_access_arguments(arguments: dict) -> dict:
    url = arguments.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ValueError("'url' must be a non-empty string: a URL from the search results")
    if len(url.strip()) > MAX_URL_CHARS:
        raise ValueError(f"'url' must be at most {MAX_URL_CHARS} characters")
    return {"url": url.strip()}


async def run_access(arguments: dict, state) -> str:
    url = arguments["url"]
    config = state.config
    if config.page_chunk_tokens and url in state.pages:
        return next_chunk(url, state)
    try:
        page = await access_page(config, url, lambda: state.aborted)
    except SearchAborted as exc:
        raise ToolAborted(str(exc)) from exc
    except SearchError as exc:
        raise ToolError(str(exc)) from exc
    if page is None:
        return f"No page was found at {url}."
    text = page.get("contents")
    if not isinstance(text, str) or not text.strip():
        return f"The page at {url} has no text."
    if config.page_chunk_tokens:
        state.pages[url] = PageReading(page_chunks(state.tokenizer, text, config))
        return next_chunk(url, state)
    return text[: config.max_page_tokens * CHARACTERS_PER_TOKEN_AT_MOST]


# ---- reading chunks ------------------------------------------------------------------------------------------------


class ChunkResult(str):
    """A tool result that contexts show shorter once a turn has read it: the text shown, and `short_form`."""

    short_form: str

    def __new__(cls, text: str, short_form: str):
        result = super().__new__(cls, text)
        result.short_form = short_form
        return result


@dataclass
class PageReading:
    """A page being read in chunks (EpisodeState.pages, by URL): its chunks' texts and how many were shown."""

    chunks: list[str]
    shown: int = 0


def page_chunks(tokenizer, text: str, config) -> list[str]:
    """The page's first MAX_PAGE_CHUNKS * page_chunk_tokens tokens in chunks of page_chunk_tokens, as text; a chunk
    ends a token or two early rather than in the middle of a character."""
    size = config.page_chunk_tokens
    limit = size * MAX_PAGE_CHUNKS
    ids = encode_text(tokenizer, text[: limit * CHARACTERS_PER_TOKEN_AT_MOST])[:limit]
    chunks, start = [], 0
    while start < len(ids):
        end = min(start + size, len(ids))
        text, start = _whole_characters(tokenizer, ids, start, end)
        chunks.append(text)
    return chunks


def _whole_characters(tokenizer, ids: list[int], start: int, end: int) -> tuple[str, int]:
    """ids[start:end] as text, ending up to 3 tokens early when the last ones hold part of a character (byte-level
    tokens decode a cut character as U+FFFD)."""
    for cut in range(end, max(start + 1, end - 3) - 1, -1):
        text = tokenizer.decode(ids[start:cut], skip_special_tokens=False)
        if not text.endswith("\ufffd") or cut == len(ids):
            return text, cut
    return tokenizer.decode(ids[start:end], skip_special_tokens=False), end


def next_chunk(url: str, state) -> str:
    """The next chunk of the page at `url` with its short form, or that nothing of it is left."""
    reading: PageReading = state.pages[url]
    total = len(reading.chunks)
    if reading.shown >= total:
        return f"The page at {url} has no more text: all {total} parts of it were shown."
    index = reading.shown
    reading.shown += 1
    state.stats.page_chunks += 1
    chunk = reading.chunks[index]
    more = f"\n[access the same URL again to read part {index + 2}]" if index + 1 < total else ""
    chunk_ids = encode_text(state.tokenizer, chunk)
    keep = min(state.config.page_short_tokens, len(chunk_ids))
    short = _whole_characters(state.tokenizer, chunk_ids, 0, keep)[0] if keep else ""
    return ChunkResult(
        f"[part {index + 1} of {total}]\n{chunk}{more}",
        f"[part {index + 1} of {total}, read]\n{short} ...",
    )


def observation_budget(config) -> int:
    """Tokens one access result may take: a page cut to max_page_tokens, or a chunk with its frame."""
    return config.page_chunk_tokens + PAGE_CHUNK_FRAME_TOKENS if config.page_chunk_tokens else config.max_page_tokens


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
    observation_budget=observation_budget,
    prompt_line=(
        "You can read a page of the search results in full by <access> URL </access>, and it will be returned "
        "between <information> and </information>."
    ),
    retrieves=True,  # a page of the search results: retrieved text
)


async def access_page(config, url: str, aborted: Callable[[], bool] | None = None) -> dict | None:
    """The page at `url` from the configured servers' /access (ASearcher's), or None; SearchError when it fails for
    good. It shares the searches' bound (SEARCH_CONCURRENCY): the same servers answer both."""

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
