"""Reliability of the retrieval server against a hostile but fair client: counts of what went wrong, as a table.

    python bench/retriever_hostile.py                    # modest sizes (about 5 minutes on 2 cores)
    python bench/retriever_hostile.py --requests 30000 --fuzz 4500 --connections 300 --write-results

Runs the real CLI server (127.0.0.1) on the embedded 10k mini-Wikipedia with MiniLM, its default settings except
`--timeout_request` (this script's flag, 10 s, to keep the run short), and checks:
1. concurrency: --requests requests (1 to 8 queries, top-k 1 to 10, scores on) at --concurrency, each compared with
   the answer the same request got alone beforehand: errors, and mismatches (other documents or order; scores within
   1e-4, documents whose scores tie within that may swap);
2. bad requests: hand-made ones (wrong JSON types, unknown fields, content types, methods, paths, bodies that are
   not JSON or not UTF-8, oversize bodies, lone surrogates, ...) and --fuzz seeded random ones (valid requests with
   one part mutated, random JSON, random bytes): server errors (5xx), and responses whose status or body the
   server's OpenAPI document does not describe for that operation (404/405 expected elsewhere);
3. connections: --connections idle, half-header and half-body connections each, with requests served meanwhile:
   how many are still open --timeout_request + 5 s later;
4. descriptors: a second server under `ulimit -n 256` and 400 idle connections: requests refused with a 503 while
   it is full, whether that was logged, and requests served once the idle connections timed out;
5. max-size: single-query clients alone, then beside one client sending large requests (512 queries of 4,096
   characters: every query encoded at the full 256 tokens) back to back (bench/retriever_load.py's case);
6. shutdown: SIGTERM while a client holds a half-sent body and such a large request runs: seconds to exit.
After every check the server must still answer /health with 200 (otherwise it counts as a crash).
Counts do not depend on the machine's load; the few times reported are ratios or bounds, not speeds.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from local_dense_retriever.demo import embedded_default  # noqa: E402
from local_dense_retriever.serving.launcher import ServerProcess, health_status  # noqa: E402
from results_md import write_section  # noqa: E402
from load_corpora import load_questions  # noqa: E402
from load_max_size import max_size_request, measure_max_size_case  # noqa: E402
from support.rankings import same_ranking  # noqa: E402
from support.sockets import HALF_BODY, HALF_HEADERS, open_connection, still_open  # noqa: E402

CACHE_DIR = REPO / ".cache" / "bench"


# ---------------------------------------------------------------------------------------------- helpers


class ResponseSchemas:
    """The server's own OpenAPI document: which statuses each operation sends, and their body schemas."""

    def __init__(self, document: dict):
        import jsonschema_rs  # schemathesis's validator (a test dependency)

        self.operations = {}
        for path, methods in document["paths"].items():
            for method, operation in methods.items():
                self.operations[(method.upper(), path)] = {
                    status: jsonschema_rs.validator_for(
                        {**spec["content"]["application/json"]["schema"], "components": document["components"]}
                    )
                    for status, spec in operation["responses"].items()
                }

    def problem(self, method: str, path: str, status: int, content_type: str, body: bytes) -> str | None:
        documented = self.operations.get((method, path))
        if documented is None:  # an undocumented path or method
            paths = {p for _, p in self.operations}
            expected = 405 if path in paths else 404
            return None if status == expected else f"{method} {path}: {status}, expected {expected}"
        validator = documented.get(str(status))
        if validator is None:
            return f"{method} {path}: status {status} is not in the OpenAPI document"
        if not content_type.startswith("application/json"):
            return f"{method} {path}: {status} with content-type {content_type!r}"
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return f"{method} {path}: {status} body is not JSON"
        if not validator.is_valid(payload):
            return f"{method} {path}: {status} body does not match its schema: {body[:200]!r}"
        return None


# ---------------------------------------------------------------------------------------------- 1. concurrency


def check_concurrency(url: str, questions: list[str], args) -> dict:
    import aiohttp

    rng = random.Random(args.seed)
    distinct = [
        {"queries": rng.sample(questions, rng.choice([1, 1, 1, 2, 4, 8])), "topk": rng.choice([1, 3, 5, 10])}
        for _ in range(args.distinct)
    ]
    for request in distinct:
        request["return_scores"] = True
    with httpx.Client(timeout=120) as client:
        expected = [client.post(f"{url}/retrieve", json=r).json()["result"] for r in distinct]
    picks = [rng.randrange(len(distinct)) for _ in range(args.requests)]
    errors = mismatches = 0

    async def fire() -> None:
        nonlocal errors, mismatches
        semaphore = asyncio.Semaphore(args.concurrency)
        connector = aiohttp.TCPConnector(limit=args.concurrency)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

            async def one(pick: int) -> None:
                nonlocal errors, mismatches
                async with semaphore:
                    try:
                        async with session.post(f"{url}/retrieve", json=distinct[pick]) as response:
                            body = await response.read()
                            if response.status != 200:
                                errors += 1
                                return
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        errors += 1
                        return
                result = orjson.loads(body)["result"]
                if not all(same_ranking(a, b) for a, b in zip(result, expected[pick], strict=True)):
                    mismatches += 1

            await asyncio.gather(*(one(pick) for pick in picks))

    asyncio.run(fire())
    return {
        "check": "concurrency",
        "what": f"{args.requests} requests (1-8 queries, top-k 1-10) at {args.concurrency} concurrency vs the same "
        f"{args.distinct} requests sent one at a time",
        "requests": args.requests,
        "errors": errors,
        "mismatches": mismatches,
        "server_errors": errors,  # every non-200 here would be the server's fault: the requests are valid
    }


# ---------------------------------------------------------------------------------------------- 2. bad requests


JSON = "application/json"


def hand_made_requests() -> list[tuple[str, str, dict[str, str], bytes]]:
    """(method, path, headers, body) of requests a careless or hostile client sends."""

    def post(body, content_type: str | None = JSON):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return ("POST", "/retrieve", {"content-type": content_type} if content_type else {}, raw)

    ok = {"queries": ["Who painted the Mona Lisa?"]}
    requests = [
        post({**ok, "topk": value}) for value in ["3", " 3 ", 3.0, True, 0, 101, -1, 2**63, 1e308, None, [3], {}]
    ]
    requests += [post({**ok, "return_scores": value}) for value in ["yes", 1, 0, None, "true", []]]
    requests += [
        post({**ok, "top_k": 3}),
        post({"query": "q"}),
        post({}),
        post([]),
        post("queries"),
        post(None),
        post({"queries": []}),
        post({"queries": [""]}),
        post({"queries": ["   \t\n"]}),
        post({"queries": ["x" * 4097]}),
        post({"queries": ["q"] * 513}),
        post({"queries": ["Who painted the Mona Lisa?", "", "  "] * 854}),  # a Search-R1 step: 2,562, blanks too
        post({"queries": ["word " * 200_000]}),  # one 1 MB query: cut before tokenizing, answered like any other
        post({"queries": ["q"] * 32769}),  # more than --max_queries_in_flight in one request
        post({"queries": [["nested"]]}),
        post({"queries": [{"a": 1}]}),
        post({"queries": "a string, not a list"}),
        post({"queries": ["q"], "topk": 100, "return_scores": True}),
        post({"queries": ["q"] * 512, "topk": 100}),  # valid, but its response would exceed --max_response_mb
        post(b'{"queries": ["\\ud800 lone surrogate"]}'),
        post(b'{"queries": ["\\u0000 nul and \\u001b escape"]}'),
        post(b'{"queries": ["q"], "topk": NaN}'),
        post(b'{"queries": ["q"], "queries": ["duplicate key"]}'),
        post(b'{"queries": ['),
        post(b"\xff\xfe\x00{"),
        post(b""),
        post(b"[" * 10000 + b"]" * 10000),
        post(b'{"queries": ["' + b"x" * (40 << 20) + b'"]}'),  # over --max_request_mb (32 by default)
        post(ok, content_type=None),
        post(ok, content_type="text/plain"),
        post(ok, content_type="application/x-www-form-urlencoded"),
        post(ok, content_type="application/json; charset=latin-1"),
        post(ok, content_type="multipart/form-data; boundary=x"),
        ("GET", "/retrieve", {}, b""),
        ("PUT", "/retrieve", {"content-type": JSON}, json.dumps(ok).encode()),
        ("DELETE", "/retrieve", {}, b""),
        ("POST", "/health", {"content-type": JSON}, b"{}"),
        ("GET", "/nowhere", {}, b""),
    ]
    return requests


def random_json(rng: random.Random, depth: int = 0):
    """A random JSON value; long strings and long lists only near the top, so a value stays under a few MB."""
    kinds = ["str", "int", "float", "bool", "null", "list", "dict"] if depth < 2 else ["str", "int", "null"]
    kind = rng.choice(kinds)
    if kind == "str":
        alphabet = 'ab \t\n\u00e9\u4e2d\U0001f600\x00\x1f"\\'
        return "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 5, 50] + [5000] * (depth < 2))))
    if kind == "int":
        return rng.choice([0, 1, -1, 3, 100, 101, 2**31, -(2**63), 10**30])
    if kind == "float":
        return rng.choice([0.0, -0.0, 3.0, 2.5, 1e-300, 1e308])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.choice([0, 1, 3] + [600] * (depth == 0)))]
    return {rng.choice(["queries", "topk", "return_scores", "x"]): random_json(rng, depth + 1) for _ in range(3)}


def fuzzed_requests(count: int, seed: int) -> list[tuple[str, str, dict[str, str], bytes]]:
    rng = random.Random(seed)
    valid = {"queries": ["Who painted the Mona Lisa?", "Eiffel Tower"], "topk": 3, "return_scores": True}
    requests = []
    for _ in range(count):
        style = rng.random()
        if style < 0.6:  # a valid request with one part mutated
            body = dict(valid)
            field = rng.choice(["queries", "topk", "return_scores", "extra", "drop"])
            if field == "drop":
                body.pop(rng.choice(list(body)))
            elif field == "extra":
                body[rng.choice(["top_k", "query", "k", ""])] = random_json(rng)
            else:
                body[field] = random_json(rng)
            raw = json.dumps(body).encode()
            if rng.random() < 0.1:
                raw = raw[: rng.randrange(len(raw))]  # truncated
        elif style < 0.85:
            raw = json.dumps(random_json(rng)).encode()
        else:
            raw = rng.randbytes(rng.choice([1, 16, 300]))
        content_type = rng.choice([JSON] * 8 + ["text/plain", "", "application/problem+json"])
        requests.append(("POST", "/retrieve", {"content-type": content_type} if content_type else {}, raw))
    return requests


def check_bad_requests(url: str, args) -> dict:
    schemas = ResponseSchemas(httpx.get(f"{url}/openapi.json").json())
    hand_made = hand_made_requests()
    requests = hand_made + fuzzed_requests(args.fuzz, args.seed)
    server_errors, mismatches, errors, problems = 0, 0, 0, []
    statuses: dict[int, int] = {}
    with httpx.Client(timeout=120) as client:
        for method, path, headers, body in requests:
            try:
                response = client.request(method, f"{url}{path}", headers=headers, content=body)
            except httpx.HTTPError as err:
                errors += 1
                problems.append(f"{method} {path}: {type(err).__name__}")
                continue
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            server_errors += response.status_code >= 500
            problem = schemas.problem(
                method, path, response.status_code, response.headers.get("content-type", ""), response.content
            )
            if problem:
                mismatches += 1
                problems.append(problem)
    for problem in problems[:10]:
        print(f"    {problem}")
    return {
        "check": "bad requests",
        "what": f"{len(hand_made)} hand-made and {args.fuzz} fuzzed (seed {args.seed}) bad requests; "
        f"statuses {dict(sorted(statuses.items()))}; mismatch = status or body not in the OpenAPI document",
        "requests": len(requests),
        "errors": errors,
        "mismatches": mismatches,
        "server_errors": server_errors,
    }


# ---------------------------------------------------------------------------------------------- 3. connections


def check_connections(server: ServerProcess, args) -> dict:
    kinds = {"idle": b"", "half headers": HALF_HEADERS, "half body": HALF_BODY}
    sockets = {kind: [] for kind in kinds}
    for kind, first_bytes in kinds.items():
        for _ in range(args.connections):
            sockets[kind].append(open_connection(server.port, first_bytes))
    served = errors = 0
    deadline = time.monotonic() + args.timeout_request + 5
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:  # normal clients meanwhile
            try:
                ok = client.post(f"{server.url}/retrieve", json={"queries": ["Eiffel Tower"]}).status_code == 200
            except httpx.HTTPError:
                ok = False
            served += ok
            errors += not ok
            time.sleep(0.1)
    still = {kind: sum(still_open(sock) for sock in socks) for kind, socks in sockets.items()}
    for socks in sockets.values():
        for sock in socks:
            sock.close()
    return {
        "check": "connections",
        "what": f"{args.connections} idle + {args.connections} half-header + {args.connections} half-body "
        f"connections, still open {args.timeout_request + 5:g} s later: {still}; {served} requests served meanwhile",
        "requests": served + errors,
        "errors": errors + sum(still.values()),
        "mismatches": 0,
        "server_errors": 0,
    }


def check_descriptors(flags: list[str], args) -> dict:
    log_path = CACHE_DIR / "hostile_descriptors.log"
    with ServerProcess(flags, log_path=log_path, startup_timeout=900, open_file_limit=256) as server:
        idle = [open_connection(server.port) for _ in range(400)]
        while_full = {"503": 0, "reset": 0, "other": 0}
        with httpx.Client(timeout=30) as client:
            for _ in range(20):
                try:
                    status = client.post(f"{server.url}/retrieve", json={"queries": ["q"]}).status_code
                    while_full["503" if status == 503 else "other"] += 1
                except httpx.HTTPError:
                    while_full["reset"] += 1
            time.sleep(args.timeout_request + 2)  # the idle ones are closed by the server
            after = sum(
                client.post(f"{server.url}/retrieve", json={"queries": ["q"]}).status_code == 200 for _ in range(20)
            )
        logged = "refusing connections" in server.log_tail(100_000)
        crashed = health_status(server.url, timeout=30) != 200
        for sock in idle:
            sock.close()
    return {
        "check": "descriptors",
        "what": f"`ulimit -n 256`, 400 idle connections: 20 requests while full got {while_full} "
        f"(refusal logged: {'yes' if logged else 'NO'}); 20 requests after the idle ones timed out: {after} served",
        "requests": 40,
        "errors": while_full["other"] + (20 - after) + (not logged),
        "mismatches": 0,
        "server_errors": 0,
        "crashes": int(crashed),
    }


# ---------------------------------------------------------------------------------------------- 5-6. max size, stop


def check_max_size(url: str, questions: list[str], args) -> dict:
    result = measure_max_size_case(url, questions, args.max_size_clients, args.max_size_seconds)
    alone, beside = result["alone"], result["beside"]
    return {
        "check": "max-size",
        "what": f"{args.max_size_clients} single-query clients beside one client sending 512 x 4,096-character "
        "requests (each query at the full 256 tokens): single p99 "
        f"{beside['p99_ms'] / alone['p99_ms']:.1f}x its p99 alone and "
        f"{beside['p99_ms'] / beside['large_mean_ms']:.0%} of one max-size request's time "
        f"({beside['large_requests']} max-size requests answered)",
        "requests": alone["requests"] + beside["requests"] + beside["large_requests"],
        "errors": alone["errors"] + beside["errors"] + beside["large_errors"],
        "mismatches": 0,
        "server_errors": 0,
    }


def check_shutdown(server: ServerProcess, questions: list[str], args) -> dict:
    stalled = open_connection(server.port)
    stalled.sendall(HALF_BODY)
    payload = max_size_request(questions)
    threading.Thread(
        target=lambda: httpx.post(f"{server.url}/retrieve", json=payload, timeout=120), daemon=True
    ).start()
    time.sleep(1.0)  # the max-size request is being served
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(60)
        seconds = time.monotonic() - started
    except Exception:
        seconds = float("inf")
    stalled.close()
    return {
        "check": "shutdown",
        "what": f"SIGTERM with a half-sent body and a max-size request in flight: exited after {seconds:.1f} s "
        f"(--timeout_graceful_shutdown {args.timeout_graceful_shutdown:g} s plus the batch in progress)",
        "requests": 1,
        "errors": int(seconds > args.timeout_graceful_shutdown + 10),
        "mismatches": 0,
        "server_errors": 0,
    }


# ---------------------------------------------------------------------------------------------- main


def render(rows: list[dict], started: str, seconds: float) -> str:
    lines = [
        f"Measured by `python bench/retriever_hostile.py {' '.join(sys.argv[1:])}`".rstrip()
        + f" on {started} ({seconds / 60:.0f} minutes); {os.cpu_count()} CPU cores, no GPU; the real CLI server on "
        "the embedded 10k mini-Wikipedia (MiniLM, FAISS Flat), its defaults except `--timeout_request "
        f"{rows[0]['timeout_request']:g}`. The figures are counts (errors, mismatches, server errors, crashes), "
        "which do not depend on the machine's load; the only times are ratios or bounds from the same run. "
        "A crash is the server process gone or /health not 200 after the check.",
        "",
        "| check | what was sent and measured | requests | errors | mismatches | server errors (5xx) | crashes |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['check']} | {row['what']} | {row['requests']} | {row['errors']} | {row['mismatches']} "
            f"| {row['server_errors']} | {row['crashes']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000, help="concurrent requests compared with sequential")
    parser.add_argument("--distinct", type=int, default=400, help="distinct requests they are drawn from")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--fuzz", type=int, default=1000, help="fuzzed bad requests (plus the hand-made ones)")
    parser.add_argument("--connections", type=int, default=100, help="idle, half-header and half-body ones each")
    parser.add_argument("--timeout_request", type=float, default=10.0, help="the server's --timeout_request")
    parser.add_argument("--timeout_graceful_shutdown", type=float, default=5.0, help="the server's default")
    parser.add_argument("--max_size_clients", type=int, default=8)
    parser.add_argument("--max_size_seconds", type=float, default=30.0, help="per phase (alone, beside)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-results", action="store_true", help="write the table to bench/RESULTS.md")
    args = parser.parse_args(argv)

    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    began = time.perf_counter()
    assets = embedded_default.prepare()
    questions = load_questions()
    flags = embedded_default.server_flags(assets.model_dir, assets.index_path, assets.corpus_path)
    flags += ["--timeout_request", f"{args.timeout_request:g}"]
    flags += ["--timeout_graceful_shutdown", f"{args.timeout_graceful_shutdown:g}"]
    rows = []
    with ServerProcess(flags, log_path=CACHE_DIR / "hostile_server.log", startup_timeout=900) as server:
        for name, check in [
            ("concurrency", lambda: check_concurrency(server.url, questions, args)),
            ("bad requests", lambda: check_bad_requests(server.url, args)),
            ("connections", lambda: check_connections(server, args)),
            ("max-size", lambda: check_max_size(server.url, questions, args)),
        ]:
            print(f"{name} ...", flush=True)
            row = check()
            row["crashes"] = int(server.process.poll() is not None or health_status(server.url, timeout=30) != 200)
            rows.append(row)
            print(f"  {row}", flush=True)
        print("shutdown ...", flush=True)
        rows.append({**check_shutdown(server, questions, args), "crashes": 0})
        print(f"  {rows[-1]}", flush=True)
    print("descriptors ...", flush=True)
    rows.append(check_descriptors(flags, args))
    print(f"  {rows[-1]}", flush=True)
    rows[0]["timeout_request"] = args.timeout_request
    text = render(rows, started_at, time.perf_counter() - began)
    print("\n" + text)
    if args.write_results:
        write_section("Retriever reliability", text)
        print("wrote bench/RESULTS.md")
    total = sum(row[key] for row in rows for key in ("errors", "mismatches", "server_errors", "crashes"))
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
