"""What the server speaks: Search-R1's request and response shapes, strictly typed, and every error answer.

The OpenAPI document (/openapi.json, /docs) is generated from these; every response the server sends is one of them.
"""

from typing import Any, Literal

import orjson
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError


def build_request_model(max_queries: int, max_topk: int) -> type[BaseModel]:
    """Search-R1's request, strictly typed: no "3" or 3.0 for topk, no 1 for true, no unknown fields.

    Every list of strings is answered, as Search-R1's reference server answers it: `[]` (a step in which no sample
    searched), blank strings (a model that wrote `<search></search>`) and strings of any length (the encoder keeps
    --max_length tokens). The body's size and the queries in flight are what is limited.
    """

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")

        queries: list[StrictStr] = Field(
            max_length=max_queries,
            description=f"search queries, any strings (blank ones too), at most {max_queries} "
            "(--max_queries_in_flight); answered in order, one hit list each",
        )
        topk: int | None = Field(
            default=None,
            ge=1,
            le=max_topk,
            description="documents per query, an integer literal (3, not 3.0); omit for the server's --topk",
        )
        # Search-R1's request model defaults to False; its server then crashed on it. Here both shapes work.
        return_scores: bool = Field(
            default=False, description='false: hits are documents; true: hits are {"document", "score"}'
        )

    return RetrieveRequest


class Document(BaseModel):
    """A corpus line as stored: `contents` is always a string; other fields (usually `id`) are passed through."""

    model_config = ConfigDict(extra="allow")
    contents: str


class ScoredHit(BaseModel):
    document: Document
    score: float


class RetrieveResponse(BaseModel):
    result: list[list[Document]] | list[list[ScoredHit]] = Field(
        description="one list of hits per query, best first; scored hits when return_scores is true"
    )


class ErrorResponse(BaseModel):
    detail: str = Field(description="what was wrong, and what is accepted")


class FieldError(BaseModel):
    loc: list[str | int] = Field(description='where: ["body", field, index]')
    msg: str
    type: str


class ValidationErrorResponse(BaseModel):
    detail: str = Field(description="every problem, each with what is accepted there")
    errors: list[FieldError]


class HealthReady(BaseModel):
    status: Literal["ok"]
    retriever: str
    documents: int
    max_batch_size: int
    max_batch_tokens: int | None = Field(description="tokens per batch at most (null: not counted, BM25)")
    max_wait_ms: float
    batches: dict[str, Any] = Field(description="batch counts, what is queued and running, relative worker speeds")
    load_seconds: dict[str, float]
    cpu_threads: dict[str, Any] = Field(
        description="usable CPUs and where that came from, the OpenMP wait policy, and per batch size the thread "
        "count in use with its measured batch times"
    )
    in_flight: dict[str, int] = Field(
        description="queries (and /access URLs) being answered now, the --max_queries_in_flight limit, how many "
        "requests it turned away, and how many request bodies are still arriving"
    )
    pages: dict[str, Any] = Field(
        description='{"loaded": false} without --pages_path, else {"loaded": true, "pages": count, "path": file}'
    )
    config: dict[str, Any]


class HealthNotReady(BaseModel):
    status: Literal["loading", "failed"]
    detail: str = Field(description="the stage being loaded, or why loading failed")


def build_access_model(max_urls: int) -> type[BaseModel]:
    """ASearcher's access request, strictly typed: `{"urls": [...]}`, nothing else; any strings, `[]` included."""

    class AccessRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")

        urls: list[StrictStr] = Field(
            max_length=max_urls,
            description=f"page URLs, any strings, at most {max_urls} (--max_queries_in_flight); ASearcher's rewrite "
            "applies (index.php/ becomes index.php?title=)",
        )

    return AccessRequest


class Page(BaseModel):
    """A line of the pages file as stored: `url` is always a string; every other field (`contents`, ...) is kept."""

    model_config = ConfigDict(extra="allow")
    url: str


class AccessResponse(BaseModel):
    result: list[Page | None] = Field(description="one entry per URL, in order: its page, or null when none has it")


RETRIEVE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": RetrieveResponse, "description": "the hits of every query"},
    400: {"model": ErrorResponse, "description": "the body is not UTF-8 JSON, or the client left while sending it"},
    408: {"model": ErrorResponse, "description": "the body did not arrive within --timeout_request seconds"},
    413: {"model": ErrorResponse, "description": "the body is larger than --max_request_mb"},
    415: {"model": ErrorResponse, "description": "the Content-Type is not application/json"},
    422: {
        "model": ValidationErrorResponse,
        "description": "the JSON is not a valid request, or its response would exceed --max_response_mb",
    },
    500: {"model": ErrorResponse, "description": "retrieval or the corpus lookup failed (the message says where)"},
    503: {
        "model": ErrorResponse,
        "description": "the retriever is still loading, failed to load, or is stopping (a request still running "
        "when --timeout_graceful_shutdown ends is cancelled and answered so); or the queries in flight would exceed "
        "--max_queries_in_flight (retry after the Retry-After seconds)",
    },
}
ACCESS_RESPONSES: dict[int | str, dict[str, Any]] = {
    **RETRIEVE_RESPONSES,
    200: {"model": AccessResponse, "description": "the page of every URL, or null"},
    404: {"model": ErrorResponse, "description": "the server was started without --pages_path: no pages to access"},
    500: {"model": ErrorResponse, "description": "a line of the pages file is malformed (the message says which)"},
}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": HealthReady, "description": "model, index and corpus are loaded"},
    503: {"model": HealthNotReady, "description": "still loading (the stage), or loading failed (why)"},
}


def json_response(payload, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json", headers=headers)


def error_response(
    status_code: int, detail: str, close: bool = False, headers: dict[str, str] | None = None
) -> Response:
    # close: the rest of the body may still be on the wire, so this connection cannot carry another request
    headers = {**(headers or {}), **({"connection": "close"} if close else {})}
    return json_response({"detail": detail}, status_code, headers=headers or None)


def validation_response(err: ValidationError, accepted: dict[str, str], example: str) -> Response:
    """A 422 naming every problem of a body that is JSON but not a valid request, each with what is accepted."""
    problems, errors = [], []
    for error in err.errors(include_url=False):
        path = [str(part) for part in error["loc"]]
        where = ".".join(path) or "request body"
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown field (accepted fields: {', '.join(accepted)})")
        else:
            field = path[0] if path and path[0] in accepted else None
            hint = accepted[field] if field else f"a JSON object like {example}"
            problems.append(f"{where}: {error['msg']} (accepted: {hint})")
        errors.append({"loc": ["body", *error["loc"]], "msg": error["msg"], "type": error["type"]})
    return json_response({"detail": "; ".join(problems), "errors": errors}, status_code=422)


def too_large_response(detail: str) -> Response:
    """A 422 for a valid request whose answer would exceed --max_response_mb."""
    error = {"loc": ["body"], "msg": detail, "type": "response_too_large"}
    return json_response({"detail": detail, "errors": [error]}, status_code=422)
