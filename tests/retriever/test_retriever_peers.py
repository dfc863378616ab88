"""Our server as a drop-in for every peer's client: each test speaks one peer's protocol as its client code does
(tests/support/peer_clients.py, written from their code) against our real server on the test index, and checks
that the client gets what the peer's own server would give it (its request path run in-process on the same
index), for the request shapes of real training: Search-R1's whole step in one request (2,560 queries, blanks,
over-long ones, and none at all), slime's, verl's, ASearcher's and RLinf's per-call requests, ASearcher's page
access with blank URLs, empty lists and many URLs, and RLinf's guide command line with --save-address-to."""

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from local_dense_retriever.retrieval.query_reader import CHARS_PER_KEPT_TOKEN
from local_dense_retriever.serving.launcher import health_status
from support.loopback import free_port
from support.peer_clients import (
    ASearcherClient,
    ReferenceServer,
    RLinfClient,
    SlimeSearch,
    VerlSearch,
    asearcher_pages,
    asearcher_search,
    rlinf_tool_text,
    search_r1_batch_search,
    search_r1_passages,
    slime_contexts,
    verl_result_text,
)
from support.retriever_fixtures import RETRIEVER_NAME, dense_server_fixture, small_wiki_fixture  # noqa: F401
from support.retriever_gate import first_rows, gated_server, health, wait_for

REPO = Path(__file__).resolve().parents[2]
SEARCH_R1_STEP = 512 * 5  # train_batch_size x n_agent: every searching sample of a step in one request
BLANKS = ["", "   ", "\n\t "]  # what `<search></search>`, `<search> </search>` ... leave after each client's parsing


def long_query(wiki) -> str:
    """A search far over 256 tokens (~30,000 characters): the encoder keeps its first --max_length tokens."""
    return " ".join(q.question for q in wiki.questions) * 3


@pytest.fixture(scope="module", name="queries")
def queries_fixture(small_wiki) -> list[str]:
    """Distinct queries of every kind a model writes: real questions, titles, non-ASCII, blank, over-long."""
    return [
        *[q.question for q in small_wiki.questions],
        *small_wiki.titles,
        "Zürich 苏黎世 😀",
        *BLANKS,
        long_query(small_wiki),
    ]


@pytest.fixture(scope="module", name="reference")
def reference_fixture(small_wiki) -> ReferenceServer:
    return ReferenceServer(
        small_wiki.model_dir, small_wiki.index_path, small_wiki.corpus_path, RETRIEVER_NAME, pages_path=None
    )


def reference_scored(reference: ReferenceServer, queries: list[str], topk: int = 3) -> dict[str, list[dict]]:
    """Query -> the reference server's scored hits."""
    distinct = sorted(dict.fromkeys(queries), key=len)  # in groups of similar length: less padding to compute
    hits = {}
    for start in range(0, len(distinct), 64):
        group = distinct[start : start + 64]
        answer = reference.retrieve({"queries": group, "topk": topk, "return_scores": True})
        hits.update(zip(group, answer["result"], strict=True))
    return hits


def documents_of(scored_hits: list[dict]) -> list[dict]:
    return [hit["document"] for hit in scored_hits]


# ---- Search-R1 ------------------------------------------------------------------------------------------------------


def test_search_r1_one_request_for_a_whole_step_gets_the_reference_passages(dense_server, reference, queries):
    """2,560 queries in one request (blanks and over-long ones among them), scores on, parsed into passages."""
    step = (queries * (SEARCH_R1_STEP // len(queries) + 1))[:SEARCH_R1_STEP]
    passages = search_r1_batch_search(f"{dense_server}/retrieve", step)
    expected = {query: search_r1_passages(hits) for query, hits in reference_scored(reference, queries).items()}
    assert len(passages) == SEARCH_R1_STEP
    pairs = enumerate(zip(step, passages, strict=True))
    wrong = [(i, query[:40]) for i, (query, text) in pairs if text != expected[query]]
    assert wrong == []
    assert all(text.count("Doc ") >= 3 for text in passages)  # blanks too: top-3, as the reference answers them


def test_search_r1_a_step_in_which_no_sample_searched_gets_an_empty_result(dense_server):
    """batch_search is called with [] when no sample of the step searched; it reads ["result"] all the same."""
    assert search_r1_batch_search(f"{dense_server}/retrieve", []) == []


def test_a_blank_query_gets_the_reference_servers_hits_for_it(dense_server, reference):
    answer = httpx.post(f"{dense_server}/retrieve", json={"queries": BLANKS, "return_scores": True}, timeout=60)
    assert answer.status_code == 200
    expected = reference_scored(reference, BLANKS)
    assert [documents_of(hits) for hits in answer.json()["result"]] == [documents_of(expected[q]) for q in BLANKS]


# ---- slime's example ------------------------------------------------------------------------------------------------


def test_slimes_example_client_gets_the_reference_documents_for_every_kind_of_query(dense_server, reference, queries):
    """local_search, one query per request, scores off, all at once (generate_with_search's 256 concurrency)."""
    search = SlimeSearch(f"{dense_server}/retrieve")

    async def all_at_once() -> list[str]:
        return await asyncio.gather(*(search(query) for query in queries))

    got = asyncio.run(all_at_once())
    expected = reference_scored(reference, queries)
    assert search.errors == []  # every call was answered 200 (an error would silently show the model nothing)
    assert got == [search_r1_passages(slime_contexts({"result": [documents_of(expected[q])]})) for q in queries]
    assert all(text.startswith("Doc 1(Title: ") for text in got)


# ---- verl -----------------------------------------------------------------------------------------------------------


def test_verls_search_tool_gets_the_reference_text_in_one_attempt(dense_server, reference, queries, small_wiki):
    """The model's query_list in one request (blank and over-long entries included), scores on."""
    sleeps: list[float] = []
    search = VerlSearch(f"{dense_server}/retrieve", sleep=sleeps.append)
    query_list = [queries[0], "", long_query(small_wiki), queries[1], "  "]
    text, status = search(query_list)
    expected = reference_scored(reference, query_list)
    assert (text, status) == verl_result_text({"result": [expected[q] for q in query_list]}, None)
    assert status == "success" and search.attempts == 1 and sleeps == []
    assert json.loads(text)["result"].count("\n---\n") == len(query_list) - 1


# ---- fairness and limits --------------------------------------------------------------------------------------------


def test_single_queries_sent_while_a_whole_step_is_served_go_into_the_next_batches(small_wiki):
    """Search-R1's 2,560-query request is served in the server's batches of 64 (40 of them). 64 single-query
    clients (slime's) arrive while its 3rd batch runs: each is in one of the next two batches, not behind the other
    37 batches of the large request."""
    with gated_server(small_wiki, open_batches=2, max_batch_size=64, search=first_rows) as (url, gate):
        step = [f"step query {i}" for i in range(SEARCH_R1_STEP)]
        large: list[list[str]] = []
        big = threading.Thread(target=lambda: large.append(search_r1_batch_search(f"{url}/retrieve", step)))
        big.start()
        assert gate.holding.wait(60)  # its 3rd batch is running
        singles = [f"single {i}" for i in range(64)]
        search = SlimeSearch(f"{url}/retrieve")
        answers: list[list[str]] = []

        async def clients() -> list[str]:
            return await asyncio.gather(*(search(query) for query in singles))

        clients_thread = threading.Thread(target=lambda: answers.append(asyncio.run(clients())))
        clients_thread.start()
        queued = SEARCH_R1_STEP - 3 * 64 + len(singles)
        wait_for(lambda: health(url)["batches"]["waiting_queries"] == queued, "every single query is queued")
        gate.release()
        big.join(120)
        clients_thread.join(120)
    assert len(large[0]) == SEARCH_R1_STEP and len(answers[0]) == len(singles) and search.errors == []
    batch_of = {query: i for i, batch in enumerate(gate.batches) for query in batch if query.startswith("single")}
    assert sorted(batch_of) == sorted(singles)
    assert set(batch_of.values()) <= {3, 4}, sorted(set(batch_of.values()))
    assert len(gate.batches) == (SEARCH_R1_STEP + len(singles)) // 64 and max(map(len, gate.batches)) == 64


def test_queries_in_flight_past_the_limit_get_a_503_naming_it_and_a_request_over_it_alone_a_422(small_wiki):
    with gated_server(small_wiki, open_batches=0, max_batch_size=4, max_queries_in_flight=8) as (url, gate):
        six = {"queries": ["a"] * 6}
        holder = threading.Thread(target=lambda: httpx.post(f"{url}/retrieve", json=six, timeout=60))
        holder.start()
        assert gate.holding.wait(60)  # 6 queries in flight: its first batch is held
        turned_away = httpx.post(f"{url}/retrieve", json={"queries": ["b"] * 3}, timeout=60)
        pages_too = httpx.post(f"{url}/access", json={"urls": ["u"] * 3}, timeout=60)
        fits = httpx.post(f"{url}/access", json={"urls": ["u"] * 2}, timeout=60)  # /access URLs count as queries
        never = httpx.post(f"{url}/retrieve", json={"queries": ["c"] * 9}, timeout=60)
        in_flight = health(url)["in_flight"]
        gate.release()
        holder.join(60)
        later = httpx.post(f"{url}/retrieve", json={"queries": ["b"] * 3}, timeout=60)
        after = health(url)["in_flight"]
    for refused in (turned_away, pages_too):
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "over --max_queries_in_flight 8" in refused.json()["detail"]
    assert fits.status_code == 200 and fits.json() == {"result": [None, None]}
    assert never.status_code == 422 and "--max_queries_in_flight" in never.json()["detail"]
    assert in_flight == {"queries": 6, "limit": 8, "refused_requests": 2, "bodies_being_read": 0}
    assert later.status_code == 200 and after["queries"] == 0


def test_a_query_of_megabytes_reaches_the_encoder_cut_after_the_tokens_it_keeps(small_wiki):
    """The tokenizer reads a whole query before truncating it (4.9 MB took 7 s and 674 MB): the server reads
    natural text only as far as its kept tokens need: one window of CHARS_PER_KEPT_TOKEN characters per kept token."""
    huge = "word " * 400_000  # 2 MB
    with gated_server(small_wiki, open_batches=2, max_batch_size=4, search=first_rows, max_length=64) as (url, gate):
        answer = httpx.post(f"{url}/retrieve", json={"queries": ["short", huge]}, timeout=60)
    assert answer.status_code == 200 and len(answer.json()["result"]) == 2
    assert sum(gate.batches, []) == ["short", huge[: CHARS_PER_KEPT_TOKEN * 64]]


# The question after 9,000 newlines, and after 60 words of 150 letters (one [UNK] each): over 8,192 characters, yet
# the tokenizer keeps 8 and 68 tokens of them, the question's among them, as the reference servers encode them.
AFTER_NEWLINES = "Who painted" + "\n" * 9000 + " the Mona Lisa?"
AFTER_LONG_WORDS = " ".join(["x" * 150] * 60) + " Who painted the Mona Lisa?"


def test_a_question_after_whitespace_or_long_words_reaches_the_encoder_whole(small_wiki):
    from transformers import AutoTokenizer

    with gated_server(small_wiki, open_batches=2, max_batch_size=4, search=first_rows) as (url, gate):
        answer = httpx.post(f"{url}/retrieve", json={"queries": [AFTER_NEWLINES, AFTER_LONG_WORDS]}, timeout=60)
    assert answer.status_code == 200
    tokenizer = AutoTokenizer.from_pretrained(str(small_wiki.model_dir))
    for query, reached in zip([AFTER_NEWLINES, AFTER_LONG_WORDS], sum(gate.batches, []), strict=True):
        kept = tokenizer(reached, truncation=True, max_length=256)["input_ids"]
        assert kept == tokenizer(query, truncation=True, max_length=256)["input_ids"]
        assert tokenizer.decode(kept).endswith("who painted the mona lisa? [SEP]")


# ---- ASearcher and RLinf: RLinf's guide command line (ASearcher's server flags) -------------------------------------


@pytest.fixture(scope="module", name="rlinf_files")
def rlinf_files_fixture(small_wiki, tmp_path_factory) -> Path:
    """$WIKI2018_WORK_DIR as RLinf's guide lays it out, made with RLinf's own build_index.sh command."""
    work = tmp_path_factory.mktemp("wiki2018")
    lines = small_wiki.corpus_path.read_text().splitlines()[:60]
    (work / "wiki_corpus.jsonl").write_text("\n".join(lines) + "\n")
    pages = [json.loads(line) | {"contents": "page of " + json.loads(line)["url"]} for line in lines]
    (work / "wiki_webpages.jsonl").write_text("".join(json.dumps(page, ensure_ascii=False) + "\n" for page in pages))
    build = [
        sys.executable, str(REPO / "local_dense_retriever" / "index_builder.py"),
        "--retrieval_method", "e5", "--model_path", str(small_wiki.model_dir),
        "--corpus_path", str(work / "wiki_corpus.jsonl"), "--save_dir", str(work / "e5.index"),
        "--use_fp16", "--max_length", "256", "--batch_size", "512", "--pooling_method", "mean",
        "--faiss_type", "Flat", "--save_embedding",
    ]  # fmt: skip
    result = subprocess.run(build, capture_output=True, text=True, timeout=300, cwd=work)
    assert result.returncode == 0, result.stderr
    assert (work / "e5.index" / "e5_Flat.index").is_file()
    assert (work / "e5.index" / "emb_e5.npy").is_file()  # FlashRAG's --save_embedding
    return work


def rlinf_server_command(work: Path, model_dir: Path, port: int, *, gpu: bool) -> list[str]:
    """launch_local_server.sh of RLinf's guide, with our server's path."""
    return [
        sys.executable, str(REPO / "local_dense_retriever" / "retrieval_server.py"),
        "--index_path", str(work / "e5.index" / "e5_Flat.index"),
        "--corpus_path", str(work / "wiki_corpus.jsonl"),
        "--pages_path", str(work / "wiki_webpages.jsonl"),
        "--topk", "3", "--retriever_name", "e5", "--retriever_model", str(model_dir),
        *(["--faiss_gpu"] if gpu else []),
        "--port", str(port), "--save-address-to", str(work / "address"),
    ]  # fmt: skip


@pytest.fixture(scope="module", name="rlinf_server")
def rlinf_server_fixture(rlinf_files, small_wiki, tmp_path_factory):
    """Our server started by RLinf's command line, unchanged; yields its port once /health says it is ready."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("rlinf_server") / "server.log"
    log = open(log_path, "wb")
    server = subprocess.Popen(
        rlinf_server_command(rlinf_files, small_wiki.model_dir, port, gpu=False), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        url = f"http://127.0.0.1:{port}"  # it listens at once and loads in the background: /health says when
        wait_for(lambda: health_status(url) == 200 or server.poll() is not None, "the server is ready", 180)
        assert server.poll() is None, log_path.read_text()
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module", name="rlinf_reference")
def rlinf_reference_fixture(rlinf_files, small_wiki) -> ReferenceServer:
    """ASearcher's local_retrieval_server.py on the same files (e5 prefixes, the pages as a dict)."""
    return ReferenceServer(
        small_wiki.model_dir,
        rlinf_files / "e5.index" / "e5_Flat.index",
        rlinf_files / "wiki_corpus.jsonl",
        "e5",
        pages_path=rlinf_files / "wiki_webpages.jsonl",
    )


def test_rlinfs_command_with_faiss_gpu_is_refused_clearly_without_a_gpu_and_leaves_no_address(rlinf_files, small_wiki):
    port = free_port()
    result = subprocess.run(
        rlinf_server_command(rlinf_files, small_wiki.model_dir, port, gpu=True),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode != 0
    assert "--faiss_gpu needs the faiss-gpu package and a visible GPU; this faiss sees none" in result.stderr
    # it listened (and wrote its address) before loading failed: a file left behind would send clients nowhere
    assert "address written to" in result.stderr
    assert not (rlinf_files / "address" / f"Host127.0.0.1_IP{port}.txt").exists()


def test_rlinfs_command_writes_the_address_file_asearchers_clients_read(rlinf_server, rlinf_files):
    address = rlinf_files / "address" / f"Host127.0.0.1_IP{rlinf_server}.txt"
    assert address.read_text() == f"127.0.0.1:{rlinf_server}"


def test_asearchers_client_finds_the_server_by_its_address_file_and_gets_the_reference_hits(
    rlinf_server, rlinf_files, rlinf_reference, small_wiki
):
    """query_async as SearchToolBox sends it (one query, topk, scores off), blank and over-long queries too."""
    sleeps: list[float] = []

    async def no_wait(seconds: float) -> None:
        sleeps.append(seconds)

    client = ASearcherClient.from_address_dir(rlinf_files / "address", sleep=no_wait)
    queries = [small_wiki.questions[0].question, "Paris", *BLANKS, long_query(small_wiki)]

    async def each() -> list[list[dict]]:
        return await asyncio.gather(*(client.search_tool(query, topk=5) for query in queries))

    got = asyncio.run(each())
    expected = [asearcher_search(rlinf_reference.retrieve({"queries": [q], "topk": 5})) for q in queries]
    assert got == expected
    assert all(len(answer[0]["urls"]) == 5 for answer in got)  # every hit carries the url the agent shows
    assert client.attempts == len(queries) and sleeps == [] and client.failures == []


def test_asearchers_page_access_answers_blank_urls_empty_lists_and_many_urls_as_its_server(
    rlinf_server, rlinf_files, rlinf_reference
):
    client = ASearcherClient.from_address_dir(rlinf_files / "address")
    every_page = [json.loads(line)["url"] for line in (rlinf_files / "wiki_webpages.jsonl").read_text().splitlines()]
    requests = [
        [every_page[0]],
        [""],  # <access></access>
        [],
        (every_page + ["https://nowhere.example/", "  ", every_page[1].replace("/wiki/", "/w/index.php/")]) * 2,
    ]

    async def each() -> list[list[dict]]:
        return [await client.access_async(urls) for urls in requests]

    got = asyncio.run(each())
    assert got == [asearcher_pages(rlinf_reference.access(urls)) for urls in requests]
    assert got[1] == [{"page": "", "type": "access"}] and got[2] == []
    assert len(got[3]) == 2 * (len(every_page) + 3) > 32  # more than the old 32-URL cap, in one request
    assert client.attempts == len(requests) and client.failures == []


def test_rlinfs_search_tool_gets_the_reference_text(rlinf_server, rlinf_reference, small_wiki):
    """tools.search.server_addr as RLinf's config writes it (host:port), topk 3, scores off."""
    client = RLinfClient(f"127.0.0.1:{rlinf_server}")
    keywords = [small_wiki.questions[1].question, "", long_query(small_wiki)]

    async def each() -> list[str]:
        return await asyncio.gather(*(client.search_tool(keyword) for keyword in keywords))

    got = asyncio.run(each())
    expected = [
        rlinf_tool_text(asearcher_search(rlinf_reference.retrieve({"queries": [k], "topk": 3}))) for k in keywords
    ]
    assert got == expected
    assert all(text.count("[Doc ") == 3 for text in got) and client.failures == []
