import asyncio
import copy
from argparse import Namespace

import pytest
from transformers import AutoTokenizer

import generate_with_search
from async_http import close_loop_sessions
from slime.rollout.sglang_rollout import reset_generate_state
from support.fake_retriever import FakeRetriever
from support.fake_router import FakeSlimeRouter
from support.fake_sglang import FakeSGLangEngine, ScriptedPolicy
from support.loopback import serve_in_thread
from support.qwen_tokenizer import qwen25_tokenizer_dir
from xml_actions import search_r1_prompt


@pytest.fixture(scope="session")
def tokenizer_dir():
    return str(qwen25_tokenizer_dir())


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def chat_prompt(tokenizer, question: str) -> str:
    """The prompt string slime builds with --apply-chat-template from Search-R1's parquet."""
    messages = [{"role": "user", "content": search_r1_prompt(question)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def slime_sampling_params(max_new_tokens: int) -> dict:
    """slime's default per-sample sampling params (GenerateState.sampling_params)."""
    return dict(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=max_new_tokens,
        stop=None,
        stop_token_ids=None,
        skip_special_tokens=False,
        no_stop_trim=True,
        spaces_between_special_tokens=False,
    )


@pytest.fixture(autouse=True)
def fresh_generate_state():
    reset_generate_state()
    yield
    reset_generate_state()


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
def search_config(retriever):
    """SEARCH_R1_CONFIGS pointed at the loopback retriever, restored whole after the test."""
    config = generate_with_search.SEARCH_R1_CONFIGS
    saved = copy.deepcopy(config)
    config["local"] = {**config["local"], "search_url": retriever.url}
    config.update(search_backend="local", search_timeout=2.0, search_max_retries=3)
    yield config
    config.clear()
    config.update(saved)


@pytest.fixture
def make_args(tokenizer_dir, engine):
    def make(**overrides) -> Namespace:
        host, port = engine.url.removeprefix("http://").split(":")
        values = dict(
            hf_checkpoint=tokenizer_dir,
            sglang_router_ip=host,
            sglang_router_port=int(port),
            rollout_max_response_len=1024,
            rollout_max_context_len=None,
            partial_rollout=False,
            rollout_top_p=1.0,
            rollout_temperature=1.0,
            n_samples_per_prompt=1,
            use_tis=False,
            reward_key=None,
            eval_reward_key=None,
        )
        values.update(overrides)
        return Namespace(**values)

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
        host, port = router.url.removeprefix("http://").split(":")
        return make_args(sglang_router_ip=host, sglang_router_port=int(port), **overrides)

    return make
