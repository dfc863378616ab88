import asyncio
import copy
import os
from argparse import Namespace

import pytest
from hypothesis import settings
from transformers import AutoTokenizer

from support import slime_compat  # first: SLIME_SRC=/path/to/slime puts real slime in the stand-in's place

import generate_with_search
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.episode import ENGINE_VERSIONS
from slime_search_r1.tokens.engine_rules import LEARNED_LIMITS
from support.fake_judge import FakeJudge
from support.fake_retriever import FakeRetriever
from support.fake_router import FakeSlimeRouter
from support.fake_sglang import FakeSGLangEngine, ScriptedPolicy
from support.loopback import serve_in_thread
from support.qwen_tokenizer import qwen25_tokenizer_dir
from support.slime_rollout import router_address, slime_args

# Property tests draw the same examples on every run and every machine, so a verdict never depends on the draw:
# "ci" (the default) derandomizes and keeps no example database (a failure found once is not replayed only on the
# machine that found it). HYPOTHESIS_PROFILE=explore draws fresh random examples and keeps them, to search further
# (with FIDELITY_EXAMPLES=500 for the episode properties).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tokenizer_dir():
    return str(qwen25_tokenizer_dir())


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(autouse=True)
def fresh_generate_state():
    """slime's GenerateState and http client, the newest weight version the engines showed and the limits their
    refusals stated are per process: each test starts a run of its own."""
    slime_compat.reset_generate_state()
    ENGINE_VERSIONS.forget()
    LEARNED_LIMITS.forget()
    yield
    slime_compat.reset_generate_state()
    slime_compat.reset_http_client()
    ENGINE_VERSIONS.forget()
    LEARNED_LIMITS.forget()


@pytest.fixture(autouse=True)
async def close_search_sessions():
    yield
    await close_loop_sessions()
    await asyncio.sleep(0)


@pytest.fixture
def policy():
    return ScriptedPolicy()


@pytest.fixture
def engine(tokenizer, policy):
    engine = FakeSGLangEngine(tokenizer, policy)
    with serve_in_thread(engine.app) as url:
        engine.url = url
        yield engine


@pytest.fixture
def retriever():
    retriever = FakeRetriever()
    with serve_in_thread(retriever.app) as url:
        retriever.url = url
        yield retriever


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


@pytest.fixture
def search_config(retriever):
    """SEARCH_R1_CONFIGS pointed at the loopback retriever, restored whole after the test."""
    config = generate_with_search.SEARCH_R1_CONFIGS
    saved = copy.deepcopy(config)
    config["local"] = {**config["local"], "search_url": retriever.url}
    config.update(search_backend="local", search_timeout=2.0, search_attempts=3)
    yield config
    config.clear()
    config.update(saved)


@pytest.fixture
def make_args(tokenizer_dir, engine):
    def make(**overrides) -> Namespace:
        return slime_args(tokenizer_dir, engine.url, **overrides)

    return make


@pytest.fixture
def router(tokenizer, engine):
    """The old slime router (radix-tree middleware) in front of the loopback engine."""
    router = FakeSlimeRouter(tokenizer, engine.url)
    with serve_in_thread(router.app) as url:
        router.url = url
        yield router


@pytest.fixture
def router_args(make_args, router):
    """slime args whose router address is the stand-in router."""

    def make(**overrides):
        return make_args(**router_address(router.url), **overrides)

    return make


@pytest.fixture(scope="session")
def viewer_dumps(tmp_path_factory, tokenizer, tokenizer_dir):
    """slime's rollout, evaluation and train dumps of real episodes (XML and chat), made once per session."""
    from support.viewer_dumps import make_dumps

    return make_dumps(tmp_path_factory.mktemp("dump_details"), tokenizer, tokenizer_dir)
