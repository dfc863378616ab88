"""Google search through serper.dev, under the name slime's Search-R1 example gives it: `google_search(api_key,
query, top_k, timeout, proxy, snippet_only)`, returning hits in the retrieval server's document shape.

SEARCH_BACKEND=google (with GOOGLE_API_KEY) makes generate() use it; the implementation is
slime_search_r1/search/google.py.
"""

from slime_search_r1.search.google import PAGE_MAX_BYTES, google_search

__all__ = ["PAGE_MAX_BYTES", "google_search"]
