"""The limits that protect the server, on bytes and work rather than on request shapes: the queries in flight over
all requests (--max_queries_in_flight), how much of a query is read, and the size of an answer (--max_response_mb).
The body's size (--max_request_mb) is checked while it is read (bodies.py)."""

import asyncio
import threading
from dataclasses import dataclass

from local_dense_retriever.retrieval.query_reader import QueryReader
from local_dense_retriever.serving.config import ServerConfig

# A client told to come back: long enough for a few batches to finish, short enough not to idle a rollout.
RETRY_AFTER_SECONDS = 1
# Requests with at most this many characters of queries are read on the event loop (a thread hop costs more than
# reading them); larger ones in a thread, so a long request does not hold up the others.
INLINE_READ_CHARS = 1024


class QueryReading:
    """Queries as the encoder will read them (cut where that changes none of the tokens it keeps, so a huge query
    costs what its kept tokens do), and the tokens each is encoded at, which bound the batcher's batches. `reader`:
    None for BM25 (it reads every word: queries unchanged, no token counts). Each thread reads with a copy of its
    own."""

    def __init__(self, reader: QueryReader | None):
        self._template = reader
        self._own = threading.local()

    async def read(self, queries: list[str]) -> tuple[list[str], list[int] | None]:
        if self._template is None:
            return queries, None
        if sum(len(query) for query in queries) <= INLINE_READ_CHARS:
            return self._read(queries)
        return await asyncio.to_thread(self._read, queries)

    def _read(self, queries: list[str]) -> tuple[list[str], list[int]]:
        reader = getattr(self._own, "reader", None)
        if reader is None:
            reader = self._own.reader = self._template.copy()
        return reader.read(queries)


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
