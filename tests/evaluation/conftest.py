import pytest

from support.fake_judge import FakeJudge
from support.loopback import serve_in_thread


@pytest.fixture
def judge_server():
    """The loopback stand-in of an OpenAI-compatible judge endpoint; `url` is its /v1 base."""
    judge = FakeJudge()
    with serve_in_thread(judge.app) as url:
        judge.url = url + "/v1"
        try:
            yield judge
        finally:
            judge.release.set()  # a held request returns before the server stops
