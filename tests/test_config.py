"""SEARCH_R1_CONFIGS: environment overrides, validation messages, and slime-flag combinations."""

import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

import generate_with_search
from slime_search_r1.config import (
    ConfigError,
    apply_env_overrides,
    check_slime_args,
    normalize_retrieval_urls,
    resolve_config,
)
from support.slime_compat import subprocess_pythonpath

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = generate_with_search.SEARCH_R1_CONFIGS


def resolved(**env):
    return resolve_config(apply_env_overrides(DEFAULTS, env))


def test_seed_variables_override_the_dict():
    config = resolved(
        LLM_API_MODE="chat",
        SEARCH_BACKEND="google",
        TOKEN_TRACKING_MODE="router_handler",
        TRACK_LOG_PROBS="false",
        LOSS_MASK_MODE="simple",
        RETRIEVAL_SERVER_URL="http://10.0.0.5:9000",
        GOOGLE_API_KEY="secret-key",
        SEARCH_R1_MAX_TURNS="4",
        SEARCH_R1_FORMAT_SCORE="0",
    )
    assert (config.llm_api_mode, config.search_backend, config.token_tracking_mode) == (
        "chat",
        "google",
        "router_handler",
    )
    assert config.return_logprob is False
    assert config.train_observations
    assert config.local.urls == ("http://10.0.0.5:9000/retrieve",)
    assert config.google.api_key == "secret-key"
    assert "secret-key" not in repr(config)
    assert config.max_turns == 4
    assert config.format_score == 0.0
    assert config.final_format_score == 0.0


@pytest.mark.parametrize(
    "key", ["max_turns", "topk", "search_concurrency", "search_backend", "return_logprob", "format_score"]
)
def test_the_settings_a_slime_user_edits_are_in_search_r1_configs(key):
    assert key in generate_with_search.SEARCH_R1_CONFIGS


def test_defaults():
    config = resolve_config(DEFAULTS)
    assert config.llm_api_mode == "generate"
    assert config.search_backend == "local"
    assert config.return_logprob
    assert config.format_score == 0.2
    assert config.final_format_score == 0.1
    assert config.retrieval_score == 0.0
    assert config.local.urls == ("http://127.0.0.1:8000/retrieve",)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLM_API_MODE": "xml"}, r"LLM_API_MODE='xml' is invalid; accepted: generate \| chat"),
        ({"TRACK_LOG_PROBS": "maybe"}, r"TRACK_LOG_PROBS='maybe' is invalid; accepted: one of 1, true"),
        ({"SEARCH_R1_MAX_TURNS": "two"}, r"SEARCH_R1_MAX_TURNS='two' is invalid; accepted: an integer"),
        ({"LOSS_MASK_MODE": "loose"}, r"accepted: strict \| simple"),
        ({"TOKEN_TRACKING_MODE": "radix"}, r"accepted: manual \| router_radix \| router_handler"),
    ],
)
def test_bad_environment_values_name_the_variable_and_the_choices(env, message):
    with pytest.raises(ConfigError, match=message):
        apply_env_overrides(DEFAULTS, env)


def test_bad_values_in_the_dict_are_named():
    with pytest.raises(ConfigError, match=r"\['max_turns'\]=0 is out of range; accepted: between 1 and 64"):
        resolved(SEARCH_R1_MAX_TURNS="0")
    with pytest.raises(ConfigError, match=r"RETRIEVAL_SERVER_URL.*not an http\(s\) URL"):
        resolved(RETRIEVAL_SERVER_URL="localhost:8000")
    with pytest.raises(ConfigError, match=r"\['format_score'\]=1.5 is out of range"):
        resolved(SEARCH_R1_FORMAT_SCORE="1.5")
    with pytest.raises(ConfigError, match="return_logprob.*accepted: True or False"):
        resolve_config({**DEFAULTS, "return_logprob": "yes"})


def test_generate_with_router_handler_is_rejected():
    with pytest.raises(ConfigError, match="router_handler' is NOT compatible with llm_api_mode='generate'"):
        resolved(TOKEN_TRACKING_MODE="router_handler")


def test_google_backend_needs_a_key_and_the_key_is_never_shown():
    with pytest.raises(ConfigError, match="GOOGLE_API_KEY"):
        resolved(SEARCH_BACKEND="google")
    with pytest.raises(ConfigError) as info:
        apply_env_overrides(DEFAULTS, {"GOOGLE_API_KEY": "   "})
    assert "<hidden>" in str(info.value)


def test_several_retrieval_servers():
    assert normalize_retrieval_urls("http://a:8000, http://b:8001/retrieve,") == (
        "http://a:8000/retrieve",
        "http://b:8001/retrieve",
    )
    with pytest.raises(ValueError, match="no URL given"):
        normalize_retrieval_urls(" , ")


def test_a_bad_variable_stops_the_import_with_its_message():
    env = {**os.environ, "PYTHONPATH": subprocess_pythonpath(), "LOSS_MASK_MODE": "everything"}
    result = subprocess.run(
        [sys.executable, "-c", "import generate_with_search"], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode != 0
    assert "LOSS_MASK_MODE='everything' is invalid; accepted: strict | simple" in result.stderr


def test_slime_flag_combinations_that_would_train_on_wrong_numbers():
    check = check_slime_args
    simple = resolved(LOSS_MASK_MODE="simple")
    with pytest.raises(ConfigError, match="--use-tis"):
        check(Namespace(use_tis=True, rollout_top_p=1.0), simple)
    with pytest.raises(ConfigError, match="--rollout-top-p"):
        check(Namespace(use_tis=False, rollout_top_p=0.9), resolved(TRACK_LOG_PROBS="0"))
    with pytest.raises(ConfigError, match="--use-rollout-logprobs would treat as real"):
        check(Namespace(use_rollout_logprobs=True), simple)
    with pytest.raises(ConfigError, match="--use-tis needs the engine's log probs"):
        check(Namespace(use_tis=True), resolved(TRACK_LOG_PROBS="false"))
    with pytest.raises(ConfigError, match="TOKEN_TRACKING_MODE=manual"):
        check(Namespace(rollout_top_p=0.9), resolved(TOKEN_TRACKING_MODE="router_radix"))
    with pytest.raises(ConfigError, match="routing-replay"):
        check(Namespace(use_rollout_routing_replay=True), resolved())
    with pytest.raises(ConfigError, match="--get-mismatch-metrics needs the engine's log probs"):
        check(Namespace(get_mismatch_metrics=True), resolved(TRACK_LOG_PROBS="false"))
    with pytest.raises(ConfigError, match="--partial-rollout is not supported"):
        check(Namespace(partial_rollout=True), resolved())
    check(Namespace(use_tis=True, rollout_top_p=0.9), resolved())  # strict + log probs: fine


def test_a_key_the_plugin_does_not_read_is_refused_with_the_accepted_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'topK'; accepted: llm_api_mode, token_tracking_mode"):
        resolve_config({**DEFAULTS, "topK": 5})
    with pytest.raises(ConfigError, match=r"unknown key 'local.searchurl'"):
        resolve_config({**DEFAULTS, "local": {**DEFAULTS["local"], "searchurl": "http://x"}})


def test_renamed_settings_name_their_new_name():
    with pytest.raises(ConfigError, match=r"SEARCH_R1_CONFIGS\['search_max_retries'\] was renamed 'search_attempts'"):
        resolve_config({**DEFAULTS, "search_max_retries": 3})
    with pytest.raises(ConfigError, match="SEARCH_R1_SEARCH_RETRIES was renamed; set SEARCH_R1_SEARCH_ATTEMPTS"):
        resolved(SEARCH_R1_SEARCH_RETRIES="3")
