"""schemathesis hooks for the retriever's schema fuzz (loaded through SCHEMATHESIS_HOOKS).

JSON Schema counts 2.0 as an integer, so a generator may send `"topk": 2.0` as a valid request. The server, like
pydantic's strict mode and Go's encoding/json, wants an integer literal there and answers 422 (a test checks
that 3.0 is refused). So valid cases write integral floats as integers; nothing else is changed.
"""

import schemathesis


def _integers_as_literals(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _integers_as_literals(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integers_as_literals(item) for item in value]
    return value


@schemathesis.hook
def map_body(context, body):
    return _integers_as_literals(body)
