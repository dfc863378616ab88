"""Reading /retrieve and /access bodies (serving/bodies.py) and the answers of api.py, in-process: each request is
an ASGI scope and a receive() the test scripts, so every way a body goes wrong is tested without a server, a model
or a clock (test_retriever_server.py and test_retriever_pages.py send the same bodies to the real server)."""

import asyncio
import json

import orjson
import pytest
from pydantic import ValidationError
from starlette.requests import Request

from local_dense_retriever.serving.api import (
    build_access_model,
    build_request_model,
    error_response,
    json_response,
    too_large_response,
    validation_response,
)
from local_dense_retriever.serving.app import access_rules, retrieve_rules
from local_dense_retriever.serving.bodies import (
    BodyRules,
    RequestTooLarge,
    _read_body,
    client_left,
    is_json,
    read_request,
)
from local_dense_retriever.serving.config import ServerConfig

LIMITS = {"max_queries_in_flight": 6, "max_topk": 5, "max_request_mb": 0.0001}  # 104 bytes
CONFIG = ServerConfig(index_path=None, corpus_path="", **LIMITS)
RULES = retrieve_rules(CONFIG)
PAGE_RULES = access_rules(CONFIG)
JSON = "application/json"


class Client:
    """What the server's receive() hands out: the body in the given chunks, then (if the client left) a disconnect;
    after the body, one disconnect (or, for a late body, one after 50 turns of the event loop). Counts the messages
    read, and fails a read after the disconnect."""

    def __init__(self, *chunks: bytes, leaves: bool = False, stalls: bool = False):
        self.messages = [
            {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1 or leaves or stalls}
            for i, chunk in enumerate(chunks)
        ]
        if leaves:
            self.messages.append({"type": "http.disconnect"})
        self.stalls = stalls
        self.read = 0

    async def __call__(self) -> dict:
        self.read += 1
        if self.read <= len(self.messages):
            return self.messages[self.read - 1]
        if self.messages and self.messages[-1]["type"] == "http.disconnect" or self.read > len(self.messages) + 1:
            raise AssertionError("read on after the client left")
        if self.stalls:  # the rest of the body is late: it comes after 50 turns of the event loop, cut short
            for _ in range(50):
                await asyncio.sleep(0)
            return {"type": "http.disconnect"}
        return {"type": "http.disconnect"}


def request(client: Client, content_type: str | None = JSON, length: int | str | None = None) -> Request:
    headers = []
    if content_type is not None:
        headers.append((b"content-type", content_type.encode()))
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    scope = {"type": "http", "method": "POST", "path": "/retrieve", "headers": headers, "query_string": b""}
    return Request(scope, client)


def read(body: bytes | Client, rules: BodyRules = RULES, timeout: float = 30.0, **headers):
    client = body if isinstance(body, Client) else Client(body)
    return asyncio.run(read_request(request(client, **headers), rules, timeout))


def answer(response) -> tuple[int, dict, dict]:
    """Status, JSON body and headers (without content-length) of a response."""
    headers = {key: value for key, value in response.headers.items() if key != "content-length"}
    return response.status_code, json.loads(response.body), headers


JSON_HEADERS = {"content-type": "application/json"}
CLOSING = {"content-type": "application/json", "connection": "close"}


# ---- content type ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "accepted"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("  application/json  ;x=1", True),
        ("application/json; charset=utf-8; x=1", True),  # the media type is what comes before the first ;
        ("application/problem+json", True),
        ("application/vnd.api+JSON", True),
        (None, False),
        ("", False),
        ("text/plain", False),
        ("text/json", False),
        ("text/x+json", False),  # +json, but not an application/ type
        ("application/jsonx", False),
        ("application/json+xml", False),
        ("application/x-www-form-urlencoded", False),
        ("charset=utf-8; application/json", False),
    ],
)
def test_json_is_application_json_or_an_application_plus_json_type(content_type, accepted):
    assert is_json(content_type) is accepted


def test_a_body_sent_as_another_type_gets_a_415_naming_the_type_and_closes():
    assert answer(read(b'{"queries": ["q"]}', content_type="text/plain")) == (
        415,
        {"detail": "the body must be JSON sent with Content-Type: application/json (got 'text/plain')"},
        CLOSING,
    )


def test_a_body_without_a_content_type_gets_a_415_that_says_it_is_missing():
    client = Client(b'{"queries": ["q"]}')
    assert answer(read(client, content_type=None)) == (
        415,
        {"detail": "the request has no Content-Type header; send the JSON body with Content-Type: application/json"},
        CLOSING,
    )
    assert client.read == 0  # refused before the body is read


# ---- size -----------------------------------------------------------------------------------------------------------


def test_the_limit_is_the_flag_in_bytes():
    assert (RULES.max_bytes, RULES.limit) == (104, "--max_request_mb 0.0001")


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read():
    client = Client(b"x")
    assert answer(read(client, length=105)) == (
        413,
        {
            "detail": "the body is 105 bytes, over the server's --max_request_mb 0.0001 (104 bytes): send fewer or "
            "shorter queries"
        },
        CLOSING,
    )
    assert client.read == 0


def test_a_body_of_exactly_the_limit_is_read():
    body = b'{"queries": ["' + b"x" * 87 + b'"]}'
    assert len(body) == RULES.max_bytes
    parsed = read(Client(body[:50], body[50:]), length=len(body))
    assert parsed.queries == ["x" * 87] and parsed.topk is None and parsed.return_scores is False


def test_a_streamed_body_over_the_limit_is_cut_off_as_soon_as_it_passes_it():
    client = Client(b"x" * 100, b"x" * 5, b"never read")
    assert answer(read(client, length="not a number")) == (
        413,
        {
            "detail": "the body is over 104 bytes, over the server's --max_request_mb 0.0001 (104 bytes): send fewer "
            "or shorter queries"
        },
        CLOSING,
    )
    assert client.read == 2


def test_the_body_is_read_in_order_up_to_the_limit():
    chunks = [b"ab", b"", b"cd", b"e"]
    assert asyncio.run(_read_body(request(Client(*chunks), length=5), 5)) == b"abcde"
    with pytest.raises(RequestTooLarge, match="^the body is over 4 bytes$"):
        asyncio.run(_read_body(request(Client(*chunks)), 4))
    with pytest.raises(RequestTooLarge, match="^the body is 5 bytes$"):
        asyncio.run(_read_body(request(Client(*chunks), length=5), 4))
    with pytest.raises(RequestTooLarge, match="^the body is over 5 bytes$"):  # a length that understates it
        asyncio.run(_read_body(request(Client(b"abcdef"), length=2), 5))


# ---- a body that does not arrive ------------------------------------------------------------------------------------


def test_a_body_that_does_not_arrive_within_the_timeout_gets_a_408():
    """timeout 0: the read is cut at once; without the timeout the late client would get a 400 instead."""
    client = Client(b'{"queries": ', stalls=True)
    assert answer(read(client, timeout=0.0)) == (408, {"detail": "the body did not arrive within 0 s"}, CLOSING)


def test_a_timeout_is_shown_as_the_flag_was_given():
    client = Client(b"{", stalls=True)
    assert answer(read(client, timeout=-2.5))[1] == {"detail": "the body did not arrive within -2.5 s"}


def test_a_client_that_leaves_while_sending_gets_a_400_and_the_connection_closes():
    assert answer(read(Client(b'{"queries": ', leaves=True))) == (
        400,
        {"detail": "the client disconnected before sending the whole body"},
        CLOSING,
    )


def test_client_left_returns_at_the_disconnect_and_not_before():
    client = Client(b"", b"", leaves=True)
    asyncio.run(client_left(request(client)))
    assert client.read == 3


# ---- validation -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b'{"queries": [', b'\xff\xfe{"queries": ["q"]}', b""], ids=["cut", "utf16", "empty"])
def test_a_body_that_is_not_utf8_json_gets_a_400_that_keeps_the_connection(body):
    status, payload, headers = answer(read(body))
    assert status == 400 and headers == JSON_HEADERS
    assert payload["detail"].startswith("the body is not valid UTF-8 JSON: ")
    assert payload["detail"].removeprefix("the body is not valid UTF-8 JSON: ").startswith(("EOF", "Invalid JSON"))


def test_a_valid_body_is_parsed_strictly():
    parsed = read(b'{"queries": ["a", "", " b "], "topk": 5, "return_scores": true}')
    assert (parsed.queries, parsed.topk, parsed.return_scores) == (["a", "", " b "], 5, True)
    assert read(b'{"queries": []}').queries == []
    assert read(b'{"urls": ["u"]}', PAGE_RULES).urls == ["u"]


RETRIEVE_ACCEPTS = {
    "queries": "a list of at most 6 strings (--max_queries_in_flight), blank or long ones too",
    "topk": "a JSON integer from 1 to 5 (not a string, 3.0 or true), or omitted for the server default 3",
    "return_scores": "true or false (JSON booleans, not strings or numbers)",
}


@pytest.mark.parametrize(
    ("body", "detail", "errors"),
    [
        (b"{}", f"queries: Field required (accepted: {RETRIEVE_ACCEPTS['queries']})", [(["queries"], "missing")]),
        (
            b'{"queries": ["q"], "topk": 0}',
            f"topk: Input should be greater than or equal to 1 (accepted: {RETRIEVE_ACCEPTS['topk']})",
            [(["topk"], "greater_than_equal")],
        ),
        (
            b'{"queries": ["q"], "topk": 6}',
            f"topk: Input should be less than or equal to 5 (accepted: {RETRIEVE_ACCEPTS['topk']})",
            [(["topk"], "less_than_equal")],
        ),
        (
            b'{"queries": ["q"], "topk": 3.0}',
            f"topk: Input should be a valid integer (accepted: {RETRIEVE_ACCEPTS['topk']})",
            [(["topk"], "int_type")],
        ),
        (
            b'{"queries": ["q"], "topk": "3"}',
            f"topk: Input should be a valid integer (accepted: {RETRIEVE_ACCEPTS['topk']})",
            [(["topk"], "int_type")],
        ),
        (
            b'{"queries": ["q"], "return_scores": 1}',
            f"return_scores: Input should be a valid boolean (accepted: {RETRIEVE_ACCEPTS['return_scores']})",
            [(["return_scores"], "bool_type")],
        ),
        (
            b'{"queries": ["q"] , "top_k": 7}',
            "top_k: unknown field (accepted fields: queries, topk, return_scores)",
            [(["top_k"], "extra_forbidden")],
        ),
        (
            b'{"queries": ["q", "q", "q", "q", "q", "q", "q"]}',
            f"queries: List should have at most 6 items after validation, not 7 (accepted: "
            f"{RETRIEVE_ACCEPTS['queries']})",
            [(["queries"], "too_long")],
        ),
        (
            b'{"queries": ["fine", 3, null]}',
            f"queries.1: Input should be a valid string (accepted: {RETRIEVE_ACCEPTS['queries']}); "
            f"queries.2: Input should be a valid string (accepted: {RETRIEVE_ACCEPTS['queries']})",
            [(["queries", 1], "string_type"), (["queries", 2], "string_type")],
        ),
        (
            b"[1, 2]",
            'request body: Input should be an object (accepted: a JSON object like {"queries": ["..."], "topk": 3})',
            [([], "model_type")],
        ),
    ],
    ids=[
        "missing",
        "topk-0",
        "topk-6",
        "topk-float",
        "topk-string",
        "scores-int",
        "unknown",
        "too-many",
        "items",
        "array",
    ],  # fmt: skip
)
def test_an_invalid_request_gets_a_422_naming_each_problem_and_what_is_accepted(body, detail, errors):
    status, payload, headers = answer(read(body))
    assert (status, headers) == (422, JSON_HEADERS)
    assert payload["detail"] == detail
    assert [(error["loc"], error["type"]) for error in payload["errors"]] == [
        (["body", *loc], kind) for loc, kind in errors
    ]
    assert set(payload) == {"detail", "errors"} and all(set(e) == {"loc", "msg", "type"} for e in payload["errors"])
    assert payload["detail"].split("; ")[0].startswith(f"{'.'.join(map(str, errors[0][0])) or 'request body'}: ")
    if errors[0][1] != "extra_forbidden":
        assert payload["errors"][0]["msg"] in payload["detail"]


def test_an_invalid_access_request_names_what_is_accepted():
    status, payload, _ = answer(read(b'{"urls": "https://a/", "topk": 3}', PAGE_RULES))
    assert status == 422
    assert payload["detail"] == (
        "urls: Input should be a valid array (accepted: a list of at most 6 strings (--max_queries_in_flight)); "
        "topk: unknown field (accepted fields: urls)"
    )


def test_a_problem_outside_the_accepted_fields_shows_the_example():
    """A field of a nested model is not one the message describes: the example is the hint."""
    try:
        RULES.model.model_validate({"queries": 3})
    except ValidationError as err:
        error = err
    response = validation_response(error, {"other": "x"}, "EXAMPLE")
    assert (
        json.loads(response.body)["detail"]
        == "queries: Input should be a valid list (accepted: a JSON object like EXAMPLE)"
    )


# ---- the request models and their OpenAPI schema --------------------------------------------------------------------


def test_the_retrieve_model_is_search_r1s_request_strictly_typed_with_its_limits():
    model = build_request_model(6, 5)
    assert model.model_json_schema() == {
        "additionalProperties": False,
        "properties": {
            "queries": {
                "description": "search queries, any strings (blank ones too), at most 6 (--max_queries_in_flight); "
                "answered in order, one hit list each",
                "items": {"type": "string"},
                "maxItems": 6,
                "title": "Queries",
                "type": "array",
            },
            "topk": {
                "anyOf": [{"maximum": 5, "minimum": 1, "type": "integer"}, {"type": "null"}],
                "default": None,
                "description": "documents per query, an integer literal (3, not 3.0); omit for the server's --topk",
                "title": "Topk",
            },
            "return_scores": {
                "default": False,
                "description": 'false: hits are documents; true: hits are {"document", "score"}',
                "title": "Return Scores",
                "type": "boolean",
            },
        },
        "required": ["queries"],
        "title": "RetrieveRequest",
        "type": "object",
    }
    for loose in ({"queries": ["q"], "topk": True}, {"queries": ["q"], "return_scores": "true"}, {"queries": [b"q"]}):
        with pytest.raises(ValidationError):  # strict in Python as well as in JSON
            model.model_validate(loose)
    assert model.model_validate({"queries": ["q"], "topk": None}).topk is None


def test_the_access_model_is_asearchers_request_strictly_typed_with_its_limit():
    model = build_access_model(4)
    assert model.model_json_schema() == {
        "additionalProperties": False,
        "properties": {
            "urls": {
                "description": "page URLs, any strings, at most 4 (--max_queries_in_flight); ASearcher's rewrite "
                "applies (index.php/ becomes index.php?title=)",
                "items": {"type": "string"},
                "maxItems": 4,
                "title": "Urls",
                "type": "array",
            }
        },
        "required": ["urls"],
        "title": "AccessRequest",
        "type": "object",
    }
    for loose in ({"urls": [1]}, {"urls": ("https://a/",)}, {"urls": [b"https://a/"]}):
        with pytest.raises(ValidationError):  # strict in Python as well as in JSON
            model.model_validate(loose)


# ---- the answers ----------------------------------------------------------------------------------------------------


def test_a_json_response_is_orjson_with_its_status_and_headers():
    response = json_response({"result": [[{"contents": "é", "score": 0.5}]]}, 201, headers={"x-a": "1"})
    assert response.body == orjson.dumps({"result": [[{"contents": "é", "score": 0.5}]]})
    assert answer(response) == (201, {"result": [[{"contents": "é", "score": 0.5}]]}, {**JSON_HEADERS, "x-a": "1"})
    assert answer(json_response([]))[0] == 200


def test_an_error_response_closes_the_connection_only_when_asked_and_keeps_its_headers():
    assert answer(error_response(503, "busy")) == (503, {"detail": "busy"}, JSON_HEADERS)
    assert answer(error_response(503, "busy", headers={"retry-after": "1"})) == (
        503,
        {"detail": "busy"},
        {**JSON_HEADERS, "retry-after": "1"},
    )
    assert answer(error_response(408, "late", close=True, headers={"retry-after": "1"})) == (
        408,
        {"detail": "late"},
        {**CLOSING, "retry-after": "1"},
    )


def test_a_response_too_large_is_a_422_in_the_validation_shape():
    assert answer(too_large_response("20 queries x topk 50 would hold 1000 documents")) == (
        422,
        {
            "detail": "20 queries x topk 50 would hold 1000 documents",
            "errors": [
                {
                    "loc": ["body"],
                    "msg": "20 queries x topk 50 would hold 1000 documents",
                    "type": "response_too_large",
                }
            ],
        },
        JSON_HEADERS,
    )
