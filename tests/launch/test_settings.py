"""Settings: each declared once in one table, read from SEARCH_R1_CONFIGS and the environment, checked with messages
that say where a bad value came from, printed by one command; and the slime-flag combinations the settings refuse."""

import os
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

import generate_with_search
from slime_search_r1.launch.__main__ import main as launch
from slime_search_r1.launch.checks import configs_from_source
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import read_environment, resolve_config, search_r1_configs, value_source
from slime_search_r1.settings.table import LAUNCH, PLUGIN, SETTINGS, WRAPPER, read_by
from slime_search_r1.slime_flags import check_slime_args
from support.slime_compat import subprocess_pythonpath

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = generate_with_search.SEARCH_R1_CONFIGS


def resolved(user=None, **env):
    return resolve_config(search_r1_configs(user or {}, env))


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
    assert config.local.search_url == ("http://10.0.0.5:9000/retrieve",)
    assert config.google.api_key == "secret-key"
    assert "secret-key" not in repr(config)
    assert config.max_turns == 4
    assert config.format_score == 0.0
    assert config.final_format_score == 0.0


def test_a_variable_beats_the_dict():
    assert resolved({"max_turns": 5}, SEARCH_R1_MAX_TURNS="2").max_turns == 2


@pytest.mark.parametrize(
    "key", ["max_turns", "topk", "search_attempts", "search_backend", "return_logprob", "format_score"]
)
def test_the_settings_a_slime_user_edits_are_in_search_r1_configs(key):
    assert key in generate_with_search.SEARCH_R1_CONFIGS


def test_the_plugin_dict_holds_no_setting_of_its_own():
    """Every default lives in the settings table only: the dict in generate_with_search.py is the user's."""
    assert configs_from_source(ROOT / "generate_with_search.py") == {}


def test_defaults():
    config = resolve_config(search_r1_configs({}, {}))
    assert config.llm_api_mode == "generate"
    assert config.search_backend == "local"
    assert config.return_logprob
    assert config.format_score == 0.2
    assert config.final_format_score == 0.1
    assert config.retrieval_score == 0.0
    assert config.tools == ["search"]
    assert config.local.search_url == ("http://127.0.0.1:8000/retrieve",)


def test_the_view_is_read_only_and_names_its_settings():
    config = resolved()
    with pytest.raises(AttributeError, match="read-only"):
        config.max_turns = 4
    with pytest.raises(AttributeError, match="no setting 'maxturns' here; there are llm_api_mode"):
        config.maxturns  # noqa: B018


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLM_API_MODE": "xml"}, r"^environment variable LLM_API_MODE='xml' is invalid; accepted: generate \| chat$"),
        ({"TRACK_LOG_PROBS": "maybe"}, r"TRACK_LOG_PROBS='maybe' is invalid; accepted: one of 1, true"),
        ({"SEARCH_R1_MAX_TURNS": "two"}, r"SEARCH_R1_MAX_TURNS='two' is invalid; accepted: an integer, 1 to 128"),
        ({"LOSS_MASK_MODE": "loose"}, r"accepted: strict \| simple"),
        ({"TOKEN_TRACKING_MODE": "radix"}, r"accepted: manual \| router_radix \| router_handler"),
        ({"SEARCH_R1_TOOLS": "search,browse"}, r"SEARCH_R1_TOOLS='search,browse' is invalid; .*'browse' unknown"),
    ],
)
def test_bad_environment_values_name_the_variable_and_the_choices(env, message):
    with pytest.raises(ConfigError, match=message):
        search_r1_configs({}, env)


def test_a_bad_value_from_a_variable_names_the_variable_not_the_dict():
    """The user set SEARCH_R1_MAX_TURNS=0 and never wrote the dict: the message says so."""
    with pytest.raises(ConfigError) as info:
        resolved(SEARCH_R1_MAX_TURNS="0")
    assert str(info.value) == "environment variable SEARCH_R1_MAX_TURNS='0' is out of range; accepted: 1 to 128"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"RETRIEVAL_SERVER_URL": "localhost:8000"},
            r"RETRIEVAL_SERVER_URL='localhost:8000' is invalid; .*not an http",
        ),
        ({"SEARCH_R1_FORMAT_SCORE": "1.5"}, r"^environment variable SEARCH_R1_FORMAT_SCORE='1.5' is out of range"),
    ],
)
def test_range_and_shape_errors_of_variables_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        resolved(**env)


def test_a_bad_value_in_the_dict_names_the_key():
    with pytest.raises(ConfigError, match=r"^SEARCH_R1_CONFIGS\['max_turns'\]=0 is out of range; accepted: 1 to 128$"):
        resolved({"max_turns": 0})
    with pytest.raises(ConfigError, match=r"SEARCH_R1_CONFIGS\['return_logprob'\]='yes' is invalid; .*True or False"):
        resolved({"return_logprob": "yes"})
    with pytest.raises(ConfigError, match=r"SEARCH_R1_CONFIGS\['local'\]\['search_url'\]='x' is invalid"):
        resolved({"local": {"search_url": "x"}})


def test_a_value_changed_after_a_variable_set_it_is_blamed_on_the_dict():
    configs = search_r1_configs({}, {"SEARCH_R1_TOPK": "4"})
    configs["topk"] = 0  # e.g. a script edits the dict after import
    with pytest.raises(ConfigError, match=r"^SEARCH_R1_CONFIGS\['topk'\]=0 is out of range"):
        resolve_config(configs)


def test_generate_with_router_handler_is_rejected():
    with pytest.raises(ConfigError, match="router_handler' is NOT compatible with llm_api_mode='generate'"):
        resolved(TOKEN_TRACKING_MODE="router_handler")


def test_google_backend_needs_a_key_and_the_key_is_never_shown():
    with pytest.raises(ConfigError, match="GOOGLE_API_KEY"):
        resolved(SEARCH_BACKEND="google")
    with pytest.raises(ConfigError) as info:
        search_r1_configs({}, {"GOOGLE_API_KEY": "   "})
    assert "<hidden>" in str(info.value)


def test_several_retrieval_servers():
    config = resolved(RETRIEVAL_SERVER_URL="http://a:8000, http://b:8001/retrieve,")
    assert config.local.search_url == ("http://a:8000/retrieve", "http://b:8001/retrieve")
    assert resolved({"local": {"search_url": ["http://a:8000"]}}).local.search_url == ("http://a:8000/retrieve",)
    with pytest.raises(ConfigError, match="accepted: http://host:port"):
        resolved(RETRIEVAL_SERVER_URL=" , ")


def test_a_search_r1_variable_no_setting_reads_is_refused_with_the_closest_name():
    """A misspelled (or removed) SEARCH_R1_* name would leave its setting at the default without a word."""
    with pytest.raises(ConfigError, match=r"SEARCH_R1_REWRAD is no setting \(did you mean SEARCH_R1_REWARD\?\)"):
        search_r1_configs({}, {"SEARCH_R1_REWRAD": "f1"})
    with pytest.raises(
        ConfigError, match=r"SEARCH_R1_DROP_FAILED_SAMPLES is no setting; the SEARCH_R1_\* settings are "
    ):
        search_r1_configs({}, {"SEARCH_R1_DROP_FAILED_SAMPLES": "0"})
    # the wrapper's question to the launch is no setting, and is accepted
    configs = search_r1_configs({}, {"SEARCH_R1_DESCRIBE_TRAINING": "/tmp/answer.json", "SEARCH_R1_REWARD": "f1"})
    assert configs["reward"] == "f1"


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
    with pytest.raises(ConfigError, match="--partial-rollout resumes an aborted episode from the tokens it wrote"):
        check(Namespace(partial_rollout=True), resolved(TOKEN_TRACKING_MODE="router_radix"))
    check(Namespace(partial_rollout=True, mask_offpolicy_in_partial_rollout=True), resolved())  # manual: resumes
    check(Namespace(use_tis=True, rollout_top_p=0.9), resolved())  # strict + log probs: fine


def test_chat_with_router_radix_is_warned_about():
    warnings = check_slime_args(Namespace(), resolved(LLM_API_MODE="chat", TOKEN_TRACKING_MODE="router_radix"))
    assert any("sends rendered text, not messages" in warning for warning in warnings)


def test_a_key_the_plugin_does_not_read_is_refused_with_the_accepted_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'topK'; accepted: llm_api_mode, token_tracking_mode"):
        resolve_config({**DEFAULTS, "topK": 5})
    with pytest.raises(ConfigError, match=r"unknown key 'local.searchurl'"):
        resolve_config({**DEFAULTS, "local": {**DEFAULTS["local"], "searchurl": "http://x"}})
    with pytest.raises(ConfigError, match=r"unknown key 'topK'"):
        search_r1_configs({"topK": 5}, {})  # already when the dict is built, at import


def test_a_section_must_be_a_dict():
    with pytest.raises(ConfigError, match=r"SEARCH_R1_CONFIGS\['local'\] must be a dict of settings, got str"):
        search_r1_configs({"local": "http://127.0.0.1:8000"}, {})


def test_every_variable_belongs_to_one_setting():
    variables = [s.env for s in SETTINGS.values() if s.env]
    assert len(variables) == len(set(variables))
    assert {reader for s in SETTINGS.values() for reader in s.read_by} == {PLUGIN, LAUNCH, WRAPPER}


def test_one_table_of_at_most_sixty_one_settings_each_read_by_someone():
    """The plugin's and both scripts' settings are rows of one table; a slime flag is not one (the script's arrays
    hold those), nor is a value nobody changes (a constant where it is used)."""
    assert len(SETTINGS) <= 61
    assert all(s.read_by for s in SETTINGS.values())
    assert not any(s.env in {"USE_TIS", "USE_WANDB", "DUMP_DIR", "EVAL_PROMPT_DATA"} for s in SETTINGS.values())


def test_one_command_lists_every_setting_with_what_it_accepts(capsys):
    assert launch(["--list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "key\tvariable\tdefault\taccepted\tread by\twhat it sets"
    listed = {row.split("\t")[1] for row in rows[1:]}
    assert listed == {s.env or "-" for s in SETTINGS.values()}
    assert len(rows) == len(SETTINGS) + 1
    assert "max_turns\tSEARCH_R1_MAX_TURNS\t3\tinteger, 1 to 128\tplugin\t" in "\n".join(rows)
    assert "-\tGPU_MEMORY_GIB\tNone\tnumber, >= 0.1, or None\tlaunch, wrapper\t" in "\n".join(rows)


def test_each_value_says_where_it_came_from_in_the_documented_order():
    """defaults < SEARCH_R1_CONFIGS < environment variables."""
    configs = search_r1_configs({"max_turns": 4, "local": {"search_url": "http://a:1"}}, {"SEARCH_R1_TOPK": "5"})
    sources = {key: value_source(configs, setting) for key, setting in SETTINGS.items()}
    assert sources["max_turns"] == "SEARCH_R1_CONFIGS['max_turns']"
    assert sources["local.search_url"] == "SEARCH_R1_CONFIGS['local']['search_url']"
    assert sources["topk"] == "environment variable SEARCH_R1_TOPK"
    assert sources["format_score"] == "default"
    assert sources["final_format_score"] == "default, derived from the others"
    assert value_source(search_r1_configs({"topk": 3}, {}), SETTINGS["topk"]) == "SEARCH_R1_CONFIGS['topk']"
    both = search_r1_configs({"topk": 4}, {"SEARCH_R1_TOPK": "5", "SEARCH_R1_MAX_TURNS": ""})  # empty: unset
    assert both["topk"] == 5 and value_source(both, SETTINGS["topk"]) == "environment variable SEARCH_R1_TOPK"
    assert value_source(both, SETTINGS["max_turns"]) == "default"


def test_launch_settings_are_read_like_the_plugins():
    environ = {"NUM_GPUS": "4", "ACTOR_GPUS": " ", "SKIP_PLUGIN_CHECK": "on"}
    knobs, sources = read_environment(read_by(LAUNCH), environ)
    assert (knobs.num_gpus, knobs.actor_gpus, knobs.skip_plugin_check) == (4, 2, True)
    assert sources["num_gpus"] == "environment variable NUM_GPUS"
    assert sources["actor_gpus"] == "default, derived from the others"  # a blank variable is unset
    with pytest.raises(
        ConfigError, match=r"^environment variable SKIP_PLUGIN_CHECK='maybe' is invalid; accepted: one"
    ):
        read_environment(read_by(LAUNCH), {"SKIP_PLUGIN_CHECK": "maybe"})
    with pytest.raises(ConfigError, match=r"^environment variable RETRIEVER_CPUS='0-x' is invalid; accepted: a CPU"):
        read_environment(read_by(WRAPPER), {"RETRIEVER_CPUS": "0-x"})


@pytest.mark.parametrize("page", ["docs/settings.md", "docs/settings_zh.md"])
def test_every_launch_variable_is_on_the_settings_page(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    knobs = [*read_by(LAUNCH), *read_by(WRAPPER)]
    assert [s.env for s in knobs if not re.search(rf"`{s.env}[`=]", text)] == []  # `NAME` or `NAME=value`


@pytest.mark.parametrize("page", ["docs/settings.md", "docs/settings_zh.md"])
def test_every_variable_is_in_the_settings_pages_table(page):
    table = (ROOT / page).read_text(encoding="utf-8")
    missing = [s.env for s in read_by(PLUGIN) if s.env and f"| `{s.env}` |" not in table]
    assert missing == []
