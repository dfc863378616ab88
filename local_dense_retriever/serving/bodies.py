"""Reading a request's JSON body: its content type, its size and deadline, a client that leaves, and validation
against the endpoint's model. Each way it can go wrong has its own answer (api.py), sent before any work is done."""

import asyncio
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from local_dense_retriever.serving.api import error_response, validation_response


class RequestTooLarge(Exception):
    pass


@dataclass(frozen=True)
class BodyRules:
    """What one endpoint accepts."""

    model: type[BaseModel]
    max_bytes: int  # no valid request is larger
    limit: str  # the flag that sets max_bytes and its value, for the 413's message
    accepted: dict[str, str]  # field -> what it accepts, for the 422's message
    example: str  # a valid body, for the 422's message


def is_json(content_type: str | None) -> bool:
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (media_type.startswith("application/") and media_type.endswith("+json"))


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"the body is {int(declared)} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_request(request: Request, rules: BodyRules, timeout: float) -> BaseModel | Response:
    """The validated body, or the error response to send instead."""
    content_type = request.headers.get("content-type")
    if not is_json(content_type):
        return error_response(
            415,
            f"the body must be JSON sent with Content-Type: application/json (got {content_type!r})"
            if content_type
            else "the request has no Content-Type header; send the JSON body with Content-Type: application/json",
            close=True,
        )
    try:
        body = await asyncio.wait_for(_read_body(request, rules.max_bytes), timeout)
    except RequestTooLarge as err:
        detail = f"{err}, over the server's {rules.limit} ({rules.max_bytes} bytes): send fewer or shorter queries"
        return error_response(413, detail, close=True)
    except asyncio.TimeoutError:
        return error_response(408, f"the body did not arrive within {timeout:g} s", close=True)
    except ClientDisconnect:
        return error_response(400, "the client disconnected before sending the whole body", close=True)
    try:
        return rules.model.model_validate_json(body)
    except ValidationError as err:
        if err.errors()[0]["type"] == "json_invalid":
            return error_response(400, f"the body is not valid UTF-8 JSON: {err.errors()[0]['msg']}")
        return validation_response(err, rules.accepted, rules.example)


async def client_left(request: Request) -> None:
    """Returns when the client closes the connection (the body is read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
