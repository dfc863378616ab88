"""The limits that protect the server, on bytes and work rather than on request shapes: the queries in flight over
all requests (--max_queries_in_flight) and the size of an answer (--max_response_mb). The body's size
(--max_request_mb) is checked while it is read (bodies.py)."""

from dataclasses import dataclass

from local_dense_retriever.serving.config import ServerConfig

# A client told to come back: long enough for a few batches to finish, short enough not to idle a rollout.
RETRY_AFTER_SECONDS = 1
# The encoder keeps --max_length tokens of a query, but its tokenizer reads all of it first: 4.9 MB of text took
# 7 s and 674 MB here. Natural text spends 4-5 characters per token, so cutting a query at 32 characters per kept
# token (8,192 for 256) leaves what the encoder keeps unchanged, and bounds what one query costs.
CHARS_PER_KEPT_TOKEN = 32


def clip_queries(config: ServerConfig, queries: list[str]) -> list[str]:
    """Queries as the encoder will read them: each cut at CHARS_PER_KEPT_TOKEN x --max_length characters (BM25
    reads every word: unchanged)."""
    if config.is_bm25:
        return queries
    limit = CHARS_PER_KEPT_TOKEN * config.max_length
    return [query if len(query) <= limit else query[:limit] for query in queries]


class ResponseTooLarge(Exception):
    pass


@dataclass
class InFlight:
    """Queries (and /access URLs) admitted and not yet answered, and bodies being read. Used from the event loop
    only, so no lock."""

    limit: int
    queries: int = 0
    refused: int = 0  # requests turned away because the others held the rest
    reading: int = 0  # requests whose body is still arriving (slow clients show here)

    def admit(self, queries: int) -> bool:
        if self.queries + queries > self.limit:
            self.refused += 1
            return False
        self.queries += queries
        return True

    def release(self, queries: int) -> None:
        self.queries -= queries

    def refusal(self, queries: int) -> str:
        return (
            f"the server is answering {self.queries} queries and this request holds {queries}: over "
            f"--max_queries_in_flight {self.limit}; retry after {RETRY_AFTER_SECONDS} s"
        )

    def report(self) -> dict[str, int]:
        return {
            "queries": self.queries,
            "limit": self.limit,
            "refused_requests": self.refused,
            "bodies_being_read": self.reading,
        }


def check_response_size(
    config: ServerConfig,
    hits: int,
    size: float,
    return_scores: bool,
    estimated: bool,
    what: str = "documents",
    remedy: str = "ask for fewer queries per request or a smaller topk",
    entries: int = 0,
) -> None:
    """Raises ResponseTooLarge when `hits` documents (or pages) of `size` bytes, plus `entries` nulls or empty
    lists around them, would exceed --max_response_mb."""
    size += hits * (32 if return_scores else 2) + entries * 5  # {"document":...,"score":...} or ",", and "null,"
    if size > config.max_response_mb * 2**20:
        about = "about " if estimated else ""
        raise ResponseTooLarge(
            f"the response would hold {hits} {what}, {about}{size / 2**20:.1f} MB, over the server's "
            f"--max_response_mb {config.max_response_mb:g}; {remedy}"
        )
