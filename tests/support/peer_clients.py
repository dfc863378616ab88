"""The peers' retrieval clients and reference servers, rewritten here from reading their code (never copied), so
that tests and benchmarks can speak to our server exactly as each peer's training does and compare the answer
with what the peer's own server would give.

Each client keeps its peer's request body, field names, library, timeout, retry rule and parsing; a retry's sleep
is injectable (`sleep`), so a test sees how often a client would have retried without waiting for it. Sources,
read at these commits (the README's table of checked clients lists them too):

- Search-R1 @a14dc3a: search_r1/llm_agent/generation.py (batch_search, _passages2string); its server
  search_r1/search/retrieval_server.py (Encoder.encode, DenseRetriever._batch_search, retrieve_endpoint)
- slime @624b824: examples/search-r1/local_search_server.py (local_search) and generate_with_search.py
  (_passages2string)
- verl @b178a3c: verl/tools/utils/search_r1_like_utils.py (call_search_api, perform_single_search_batch)
- ASearcher @813e804: AReaL/ASearcher/utils/search_utils.py (AsyncSearchBrowserClient: address files, query_async,
  access_async); its server tools/local_retrieval_server.py (PageAccess, /access)
- RLinf @a3816b5: rlinf/agents/searchr1/search_tool_worker.py (AsyncSearchClient, process_tool_result)
"""

import asyncio
import glob
import json
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import requests

# ---------------------------------------------------------------------------------------------- Search-R1


def search_r1_passages(hits: list[dict]) -> str:
    """Search-R1's _passages2string: scored hits -> "Doc 1(Title: ...) text" lines (slime's example too)."""
    text = ""
    for number, hit in enumerate(hits, start=1):
        lines = hit["document"]["contents"].split("\n")
        text += f"Doc {number}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n"
    return text


def search_r1_batch_search(search_url: str, queries: list[str], topk: int = 3) -> list[str]:
    """Search-R1's batch_search: every searching sample of the step in one request, scores on, no timeout, no retry;
    `["result"]` of any answer (an error body raises KeyError and the training step crashes)."""
    answer = requests.post(search_url, json={"queries": queries, "topk": topk, "return_scores": True}).json()
    return [search_r1_passages(hits) for hits in answer["result"]]


# ---------------------------------------------------------------------------------------------- slime's example


def slime_contexts(answer: dict) -> list[dict]:
    """local_search's parsing: the first query's documents, each as {"document": {"contents": ...}}."""
    contexts = []
    for item in answer.get("result", [[]])[0]:
        if isinstance(item, dict):
            contents = item.get("contents", "")
            contexts.append({"document": {"contents": contents or '"No title."\nNo snippet available.'}})
    return contexts


@dataclass
class SlimeSearch:
    """slime's examples/search-r1 local_search: one query per request, scores off, a 60 s total timeout; any error
    (status, connection, JSON) is printed and becomes no documents. `errors` keeps them for the test."""

    search_url: str
    errors: list[str] = field(default_factory=list)

    async def __call__(self, query: str, top_k: int = 3, timeout: int = 60) -> str:
        payload = {"queries": [query], "topk": top_k, "return_scores": False}
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    self.search_url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as response:
                    response.raise_for_status()
                    answer = await response.json()
        except Exception as err:
            self.errors.append(f"{type(err).__name__}: {err}")
            return search_r1_passages([])
        return search_r1_passages(slime_contexts(answer))  # generate_with_search's search() formats them


# ---------------------------------------------------------------------------------------------- verl


VERL_RETRIED_STATUSES = (500, 502, 503, 504)


def verl_passages(hits: list[dict]) -> str:
    """verl's _passages2string: "Doc 1 (Title: ...)\\ntext" blocks, stripped."""
    text = ""
    for number, hit in enumerate(hits, start=1):
        lines = hit["document"]["contents"].split("\n")
        text += f"Doc {number} (Title: {lines[0]})\n{chr(10).join(lines[1:])}\n\n"
    return text.strip()


def verl_result_text(answer: dict | None, error: str | None) -> tuple[str, str]:
    """perform_single_search_batch's (tool text, status) for an API answer or error."""
    if error:
        return json.dumps({"result": f"Search error: {error}"}, ensure_ascii=False), "api_error"
    results = answer.get("result", [])
    if not results:
        return json.dumps({"result": "No search results are found."}, ensure_ascii=False), "no_results"
    text = "\n---\n".join(verl_passages(hits) for hits in results)
    return json.dumps({"result": text}, ensure_ascii=False), "success"


@dataclass
class VerlSearch:
    """verl's search tool: one request per tool call with the model's query_list, scores on, 30 s timeout; 500, 502,
    503, 504, connection errors and timeouts are retried up to 10 attempts, 1, 2, 3... s apart; any other error
    status ends it with an error text shown to the model."""

    retrieval_service_url: str
    sleep: Callable[[float], None] = time.sleep
    attempts: int = 0

    def call_search_api(self, query_list: list[str], topk: int = 3, timeout: int = 30) -> tuple[dict | None, str]:
        payload = {"queries": query_list, "topk": topk, "return_scores": True}
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        last_error = None
        for attempt in range(10):
            self.attempts += 1
            try:
                response = requests.post(self.retrieval_service_url, headers=headers, json=payload, timeout=timeout)
                if response.status_code in VERL_RETRIED_STATUSES:
                    last_error = f"Server Error ({response.status_code})"
                    if attempt < 9:
                        self.sleep(attempt + 1)
                    continue
                response.raise_for_status()
                return response.json(), None
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as err:
                last_error = f"{type(err).__name__}: {err}"
                if attempt < 9:
                    self.sleep(attempt + 1)
            except requests.exceptions.RequestException as err:
                last_error = f"API Request Error: {err}"
                break
        return None, last_error or "API Call Failed after retries"

    def __call__(self, query_list: list[str], topk: int = 3) -> tuple[str, str]:
        return verl_result_text(*self.call_search_api(query_list, topk))


# ---------------------------------------------------------------------------------------------- ASearcher, RLinf


def asearcher_server_addresses(address_dir: str | os.PathLike) -> list[str]:
    """AsyncSearchBrowserClient.get_server_list: the lines of $RAG_SERVER_ADDR_DIR/Host*_IP*.txt, unstripped."""
    addresses = []
    for name in glob.glob(f"{address_dir}/Host*_IP*.txt"):
        addresses.extend(Path(name).read_text().splitlines(keepends=True))
    return addresses


def asearcher_search(answer: dict) -> list[dict]:
    """query_async's parsing: per query, its documents' contents and urls."""
    return [
        {"documents": [hit["contents"] for hit in hits], "urls": [hit["url"] for hit in hits]}
        for hits in answer["result"]
    ]


def asearcher_pages(answer: dict) -> list[dict]:
    """access_async's parsing: per URL, its page's contents, or "" when the server has none."""
    return [{"page": page["contents"] if page is not None else "", "type": "access"} for page in answer["result"]]


@dataclass
class RetryingAiohttpClient:
    """ASearcher's AsyncSearchBrowserClient and RLinf's AsyncSearchClient share this: aiohttp, a 120 s timeout,
    `raise_for_status()`, and on any exception up to 10 attempts 10 s apart, then RuntimeError."""

    server_addr: str  # host:port
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    attempts: int = 0
    failures: list[str] = field(default_factory=list)

    def after_failure(self) -> None:
        """RLinf keeps its one address."""

    async def post(self, path: str, body: dict, parse: Callable[[dict], list[dict]]) -> list[dict]:
        last = None
        for _ in range(10):
            self.attempts += 1
            try:
                async with aiohttp.ClientSession() as session:
                    async with session.post(
                        f"http://{self.server_addr}{path}",
                        json=body,
                        timeout=aiohttp.ClientTimeout(total=120, sock_connect=120),
                    ) as response:
                        response.raise_for_status()
                        return parse(await response.json())
            except Exception as err:
                last = err
                self.failures.append(f"{self.server_addr}: {type(err).__name__}: {err}")
                self.after_failure()
                await self.sleep(10)
        raise RuntimeError(f"Fail to post {path} to RAG server") from last


@dataclass
class ASearcherClient(RetryingAiohttpClient):
    """ASearcher's AsyncSearchBrowserClient (AReaL's): an address drawn from the server's --save-address-to files
    ($RAG_SERVER_ADDR_DIR), drawn again after every failure."""

    address_dir: Path | None = None

    @classmethod
    def from_address_dir(cls, address_dir: str | os.PathLike, **options) -> "ASearcherClient":
        return cls(random.choice(asearcher_server_addresses(address_dir)), address_dir=Path(address_dir), **options)

    def after_failure(self) -> None:
        self.server_addr = random.choice(asearcher_server_addresses(self.address_dir))

    async def query_async(self, req_meta: dict) -> list[dict]:
        return await self.post("/retrieve", req_meta, asearcher_search)

    async def access_async(self, urls: list[str]) -> list[dict]:
        return await self.post("/access", {"urls": urls}, asearcher_pages)

    async def search_tool(self, query: str, topk: int) -> list[dict]:
        """SearchToolBox.step for <search>: one query per request, scores off."""
        return await self.query_async({"queries": [query], "topk": topk, "return_scores": False})


def rlinf_tool_text(response: list[dict], topk: int = 3) -> str:
    """RLinf's process_tool_result: the first query's documents as "[Doc k](url):" blocks, or "no results"."""
    documents, urls = response[0]["documents"][:topk], response[0]["urls"][:topk]
    if documents:
        pairs = enumerate(zip(documents, urls, strict=False))
        blocks = [f"[Doc {k + 1}]({url}):\n" + doc[:5000] for k, (doc, url) in pairs]
        text = "<information>\n" + "\n\n".join(blocks) + "\n</information>"
    else:
        text = "<information>\nNo search results are found.\n</information>"
    return "\n\n" + text + "\n<think>\n"


class RLinfClient(RetryingAiohttpClient):
    """RLinf's SearchToolWorker: tools.search.server_addr (host:port), one query per request, scores off."""

    async def search_tool(self, keyword: str, topk: int = 3) -> str:
        body = {"queries": [keyword], "topk": topk, "return_scores": False}
        return rlinf_tool_text(await self.post("/retrieve", body, asearcher_search), topk)


# ---------------------------------------------------------------------------------------------- reference servers


class ReferenceServer:
    """The request path of Search-R1's retrieval_server.py (ASearcher's and RLinf's copies are the same), on CPU,
    in-process: transformers' tokenizer (padding to the longest, truncation at 256 tokens), AutoModel, masked mean
    pooling, L2 normalisation (not for dpr), a FAISS search, the corpus line of every row; requests of any size in
    its own batches of 512. And ASearcher's /access: a dict from URL to page, with its index.php/ rewrite."""

    def __init__(
        self,
        model_dir: Path,
        index_path: Path,
        corpus_path: Path,
        retriever_name: str,
        default_topk: int = 3,
        pages_path: Path | None = None,
        max_length: int = 256,
    ):
        import faiss
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.index = faiss.read_index(str(index_path))
        self.corpus = [json.loads(line) for line in Path(corpus_path).read_text().splitlines()]
        self.name, self.default_topk, self.max_length = retriever_name.lower(), default_topk, max_length
        self.pages = {}
        if pages_path is not None:
            for line in Path(pages_path).read_text().splitlines():
                page = json.loads(line)
                self.pages[page["url"]] = page

    def encode(self, queries: list[str]) -> np.ndarray:
        import torch

        if "e5" in self.name:
            queries = [f"query: {query}" for query in queries]
        if "bge" in self.name:
            queries = [f"Represent this sentence for searching relevant passages: {query}" for query in queries]
        inputs = self.tokenizer(
            queries, max_length=self.max_length, padding=True, truncation=True, return_tensors="pt"
        )
        with torch.no_grad():
            hidden = self.model(**inputs, return_dict=True).last_hidden_state
        mask = inputs["attention_mask"]
        pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
        if "dpr" not in self.name:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.numpy().astype(np.float32)

    def retrieve(self, body: dict) -> dict:
        """The answer of POST /retrieve to `body`."""
        topk = body.get("topk") or self.default_topk
        result = []
        queries = body["queries"]
        for start in range(0, len(queries), 512):
            scores, rows = self.index.search(self.encode(queries[start : start + 512]), topk)
            for query_scores, query_rows in zip(scores.tolist(), rows.tolist(), strict=True):
                documents = [self.corpus[row] for row in query_rows]
                if body.get("return_scores"):
                    result.append([{"document": d, "score": s} for d, s in zip(documents, query_scores, strict=True)])
                else:
                    result.append(documents)
        return {"result": result}

    def access(self, urls: list[str]) -> dict:
        """The answer of ASearcher's POST /access to {"urls": urls}."""
        return {"result": [self.pages.get(url.replace("index.php/", "index.php?title=")) for url in urls]}
