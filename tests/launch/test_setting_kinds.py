"""What each kind of setting accepts and the exact line it refuses with, the read-only view, registering settings
and rules, and the extensions variable: the messages a user reads when a launch stops."""

import pytest

from slime_search_r1.settings import sources as reading
from slime_search_r1.settings.kinds import (
    Choice,
    ConfigError,
    Flag,
    Integer,
    Names,
    Number,
    Refused,
    ShellWords,
    Text,
    Urls,
)
from slime_search_r1.settings.rules import RULES, register_rule
from slime_search_r1.settings.sources import read_environment, resolve_config, search_r1_configs, value_source
from slime_search_r1.settings.table import LAUNCH, SETTINGS, Setting, read_by, register_setting
from slime_search_r1.settings.view import Section


@pytest.fixture
def own_settings():
    """What the test registers (settings, rules) is gone after it."""
    settings, rules = dict(SETTINGS), list(RULES)
    yield
    SETTINGS.clear()
    SETTINGS.update(settings)
    RULES[:] = rules


def refusal(kind, value, from_env=False) -> str:
    with pytest.raises(Refused) as info:
        kind.from_env(value) if from_env else kind.check(value)
    return str(info.value)


def test_a_choice_from_the_environment_ignores_case_and_spaces():
    kind = Choice(("generate", "Chat"))
    assert kind.from_env(" CHAT ") == "Chat"
    assert kind.from_env("Generate") == "generate"
    assert refusal(kind, "xml", from_env=True) == "invalid; accepted: generate | Chat"


def test_a_flag_is_a_bool_in_the_dict():
    assert Flag().check(False) is False
    assert refusal(Flag(), 1) == "invalid; accepted: True or False"


def test_integers_accept_both_bounds_and_say_which_they_are():
    kind = Integer(1, 64)
    assert (kind.check(1), kind.check(64)) == (1, 64)
    assert refusal(kind, 65) == "out of range; accepted: 1 to 64"
    assert refusal(kind, 0) == "out of range; accepted: 1 to 64"
    assert refusal(kind, "3") == "invalid; accepted: an integer, 1 to 64"
    assert refusal(kind, True) == "invalid; accepted: an integer, 1 to 64"
    assert refusal(Integer(16), 15) == "out of range; accepted: >= 16"
    assert refusal(Integer(0, optional=True), -1) == "out of range; accepted: >= 0, or None"
    assert Integer(0, optional=True).from_env(" None ") is None


def test_numbers_accept_both_bounds_and_refuse_nan_and_none():
    kind = Number(0.0, 1.0)
    assert (kind.check(0), kind.check(1.0)) == (0.0, 1.0)
    assert Number(0.1).check(5) == 5.0  # no upper bound
    assert refusal(kind, 1.5) == "out of range; accepted: 0.0 to 1.0"
    assert refusal(kind, float("nan")) == "out of range; accepted: 0.0 to 1.0"
    assert refusal(kind, None) == "invalid; accepted: a number, 0.0 to 1.0"
    assert refusal(kind, False) == "invalid; accepted: a number, 0.0 to 1.0"
    assert refusal(kind, "half", from_env=True) == "invalid; accepted: a number, 0.0 to 1.0"
    assert refusal(Number(0.1), 0.0) == "out of range; accepted: >= 0.1"
    optional = Number(0.0, 1.0, optional=True)
    assert optional.check(None) is None and optional.check(0.5) == 0.5
    assert refusal(optional, 2) == "out of range; accepted: 0.0 to 1.0, or None"


def test_text_is_stripped_and_optional_text_may_be_empty():
    assert Text().check("  actor ") == "actor"
    assert Text(optional=True).check("") is None
    assert Text(optional=True).check(None) is None
    assert refusal(Text(), " ") == "invalid; accepted: a non-empty string"
    assert refusal(Text(optional=True), 3) == "invalid; accepted: a non-empty string, or None"


def test_urls_get_the_endpoint_path_once_and_skip_empty_parts():
    kind = Urls("/retrieve")
    assert kind.check("http://a:1") == ("http://a:1/retrieve",)
    assert kind.check("https://a:1/") == ("https://a:1/retrieve",)
    assert kind.check("http://a:1/custom") == ("http://a:1/custom",)
    assert kind.check("http://a:1,, http://b:2") == ("http://a:1/retrieve", "http://b:2/retrieve")
    accepted = "http://host:port[/retrieve], several as a list or separated by commas"
    assert refusal(kind, "ftp://a:1") == f"invalid; accepted: {accepted} ('ftp://a:1' is not an http(s) URL)"
    assert refusal(kind, "http://") == f"invalid; accepted: {accepted} ('http://' is not an http(s) URL)"
    assert refusal(kind, " , ") == f"invalid; accepted: {accepted}"
    assert refusal(kind, 8000) == f"invalid; accepted: {accepted}"
    assert refusal(kind, ["http://a:1", 8000]) == f"invalid; accepted: {accepted}"


def test_names_are_known_listed_once_and_at_least_as_many_as_needed():
    kind = Names(("search", "access"), at_least=1)
    assert kind.check([" search", "access "]) == ["search", "access"]
    accepted = "a list of names from search, access, at least 1"
    assert refusal(kind, []) == f"invalid; accepted: {accepted}, each once"
    assert refusal(kind, ["search", "search"]) == f"invalid; accepted: {accepted}, each once"
    assert refusal(kind, ["browse"]) == f"invalid; accepted: {accepted}, each once ('browse' unknown)"
    assert refusal(kind, "search") == f"invalid; accepted: {accepted}"
    assert refusal(kind, ["search", 1]) == f"invalid; accepted: {accepted}"
    assert Names(("a",)).check([]) == []
    assert refusal(Names(("a", "b")), ["a", "a"]) == "invalid; accepted: a list of names from a, b, each once"


def test_module_names_are_python_dotted_names():
    kind = Names(None)
    assert kind.check(["Ext", "my_pkg.sub_1"]) == ["Ext", "my_pkg.sub_1"]
    assert kind.from_env("a.b, c") == ["a.b", "c"]
    assert refusal(kind, ["1st", "a-b"]) == (
        "invalid; accepted: a list of Python module names, each once ('1st', 'a-b' unknown)"
    )


def test_the_view_hides_secrets_and_names_what_it_holds():
    view = Section({"model": "judge-7b", "api_key": "sk-123"}, frozenset({"api_key"}))
    assert repr(view) == "Section(model='judge-7b', api_key=<hidden>)"
    with pytest.raises(AttributeError) as info:
        view.url  # noqa: B018
    assert str(info.value) == "no setting 'url' here; there are model, api_key"


def test_the_resolved_view_hides_exactly_the_secret_settings():
    config = resolve_config(search_r1_configs({"google": {"api_key": "sk-g"}}, {"JUDGE_API_KEY": "sk-j"}))
    assert "sk-g" not in repr(config.google) and "api_key=<hidden>" in repr(config.google)
    assert "sk-j" not in repr(config.judge) and "api_key=<hidden>" in repr(config.judge)
    assert "search_url=('http://127.0.0.1:8000/retrieve',)" in repr(config.local)  # not a secret: shown
    assert "max_turns=3" in repr(config)


def test_a_secret_from_the_environment_is_hidden_in_its_message(own_settings):
    register_setting(Setting("vault.token", None, Integer(1, 10, optional=True), "TEST_VAULT_TOKEN", secret=True))
    with pytest.raises(ConfigError) as info:
        search_r1_configs({}, {"TEST_VAULT_TOKEN": "abc"})
    assert (
        str(info.value)
        == "environment variable TEST_VAULT_TOKEN=<hidden> is invalid; accepted: an integer, 1 to 10, or None"
    )
    with pytest.raises(ConfigError) as info:
        resolve_config(search_r1_configs({"vault": {"token": 11}}, {}))
    assert (
        str(info.value) == "SEARCH_R1_CONFIGS['vault']['token']=<hidden> is out of range; accepted: 1 to 10, or None"
    )


def test_registering_a_setting_makes_it_read_checked_and_overridable(own_settings):
    setting = Setting("bing.market", "en-US", Text(), "TEST_BING_MARKET")
    register_setting(setting)
    assert SETTINGS["bing.market"] is setting
    assert resolve_config(search_r1_configs({}, {"TEST_BING_MARKET": "de-DE"})).bing.market == "de-DE"
    with pytest.raises(ValueError, match=r"^the setting 'bing.market' is declared already$"):
        register_setting(Setting("bing.market", "x", Text()))
    with pytest.raises(ValueError, match=r"^the environment variable TEST_BING_MARKET already overrides another"):
        register_setting(Setting("bing.region", "x", Text(), "TEST_BING_MARKET"))
    with pytest.raises(ValueError, match=r"^a setting key is 'name' or 'section.name', got 'a.b.c'$"):
        register_setting(Setting("a.b.c", 1, Integer(0)))
    register_setting(Setting("bing.safe", True, Flag()))  # no variable: may share None with others


def test_a_registered_rule_runs_on_every_resolve(own_settings):

    def no_more_than_two_turns(config):
        if config.max_turns > 2:
            raise ConfigError("this deployment allows 2 turns")

    assert register_rule(no_more_than_two_turns) is no_more_than_two_turns
    assert resolve_config(search_r1_configs({"max_turns": 2}, {})).max_turns == 2
    with pytest.raises(ConfigError, match="^this deployment allows 2 turns$"):
        resolve_config(search_r1_configs({}, {}))


def test_the_extensions_variable_is_read_first_and_named_when_an_import_fails():
    configs = search_r1_configs({}, {"SEARCH_R1_EXTENSIONS": "json, email.utils"})
    assert configs["extensions"] == ["json", "email.utils"]
    assert value_source(configs, SETTINGS["extensions"]) == "environment variable SEARCH_R1_EXTENSIONS"
    assert resolve_config(configs).extensions == ["json", "email.utils"]
    with pytest.raises(ConfigError) as info:
        search_r1_configs({}, {"SEARCH_R1_EXTENSIONS": "no_such_extension_module"})
    assert str(info.value) == (
        "environment variable SEARCH_R1_EXTENSIONS: cannot import the extension module 'no_such_extension_module': "
        "ModuleNotFoundError: No module named 'no_such_extension_module'"
    )


def test_a_plain_dict_is_resolved_with_its_extensions_imported_and_named():
    assert resolve_config({}).max_turns == 3  # every setting at its default
    with pytest.raises(ConfigError) as info:
        resolve_config({"extensions": ["no_such_extension_module"]})
    assert str(info.value).startswith(
        "SEARCH_R1_CONFIGS['extensions']: cannot import the extension module 'no_such_extension_module': "
        "ModuleNotFoundError"
    )


def test_the_user_dict_is_copied_not_shared():
    user = {"tools": ["search"], "local": {"search_url": "http://a:1"}}
    configs = search_r1_configs(user, {"RETRIEVAL_SERVER_URL": "http://b:2", "SEARCH_R1_TOOLS": "search,access"})
    assert user == {"tools": ["search"], "local": {"search_url": "http://a:1"}}
    assert configs["local"]["search_url"] == ("http://b:2/retrieve",)


def test_defaults_are_copied_into_each_configs():
    first = search_r1_configs({}, {})
    first["tools"].append("access")
    assert search_r1_configs({}, {})["tools"] == ["search"]


def test_a_section_value_given_in_the_dict_is_named_as_given():
    configs = search_r1_configs({"local": {"search_url": "http://127.0.0.1:8000/retrieve"}}, {})
    assert value_source(configs, SETTINGS["local.search_url"]) == "SEARCH_R1_CONFIGS['local']['search_url']"
    assert value_source(configs, SETTINGS["topk"]) == "default"


def test_an_unknown_key_message_ends_by_saying_how_section_keys_are_written():
    with pytest.raises(ConfigError, match=r"; accepted: .* \(a section's keys as section\.key\)$"):
        search_r1_configs({"local": {"serach_url": "http://a:1"}}, {})


def test_a_variable_set_to_the_default_value_is_still_named_as_the_source():
    configs = search_r1_configs({}, {"SEARCH_R1_MAX_TURNS": str(SETTINGS["max_turns"].default)})
    assert value_source(configs, SETTINGS["max_turns"]) == "environment variable SEARCH_R1_MAX_TURNS"
    assert value_source(search_r1_configs({}, {}), SETTINGS["max_turns"]) == "default"
    changed = search_r1_configs({}, {})
    changed["max_turns"] = SETTINGS["max_turns"].default + 1  # set after reading, not in the user's dict
    assert value_source(changed, SETTINGS["max_turns"]) == "SEARCH_R1_CONFIGS['max_turns']"


def test_without_an_environment_given_the_process_environment_is_read(monkeypatch):
    monkeypatch.setenv("SEARCH_R1_MAX_TURNS", "7")
    assert search_r1_configs({})["max_turns"] == 7


def test_secrets_are_hidden_by_key_at_the_top_and_in_their_own_section_only(own_settings):
    register_setting(Setting("test_token", None, Text(optional=True), "TEST_TOKEN", secret=True))
    register_setting(Setting("vault.passphrase", None, Text(optional=True), secret=True))
    register_setting(Setting("notes.passphrase", None, Text(optional=True)))  # same name, not a secret
    config = resolve_config(search_r1_configs({"vault": {"passphrase": "p-1"}, "notes": {"passphrase": "p-2"}},
                                              {"TEST_TOKEN": "t-0"}))  # fmt: skip
    assert (config.test_token, config.vault.passphrase, config.notes.passphrase) == ("t-0", "p-1", "p-2")
    assert "test_token=<hidden>" in repr(config) and "t-0" not in repr(config)
    assert repr(config.vault) == "Section(passphrase=<hidden>)"
    assert repr(config.notes) == "Section(passphrase='p-2')"


def test_where_a_value_came_from_in_a_plain_dict():
    assert value_source({"max_turns": 3}, SETTINGS["max_turns"]) == "default"
    assert value_source({"max_turns": 4}, SETTINGS["max_turns"]) == "SEARCH_R1_CONFIGS['max_turns']"


def test_nested_defaults_are_deep_copies(own_settings):
    nested = Setting("test_nested", {"a": ["x"]}, Text(), "TEST_NESTED")
    register_setting(nested)
    search_r1_configs({}, {})["test_nested"]["a"].append("y")
    read_environment([nested], {})[0].test_nested["a"].append("z")
    assert nested.default == {"a": ["x"]}


def test_a_bare_host_gets_the_path_without_losing_its_own_last_letters():
    configs = search_r1_configs({}, {"RETRIEVAL_SERVER_URL": "http://retrieverX/, http://searchXX"})
    assert configs["local"]["search_url"] == ("http://retrieverX/retrieve", "http://searchXX/retrieve")


def test_a_launch_knob_left_unset_reads_its_default_as_a_copy():
    values, sources = read_environment(read_by(LAUNCH), {})
    assert sources["num_gpus"] == "default" and values.num_gpus == 8
    listed = Setting("models", ["a"], Names(None), "TEST_MODELS")
    unbound = Setting("plain", 1, Integer(0))  # no variable: nothing in the environment can set it
    values, sources = read_environment([listed, unbound], {"XXXX": "5", "TEST_MODELS": " "})
    assert (values.models, values.plain, sources) == (["a"], 1, {"models": "default", "plain": "default"})
    values.models.append("b")
    assert listed.default == ["a"]


def test_an_extension_from_the_variable_that_fails_at_resolve_names_the_variable(monkeypatch):
    configs = search_r1_configs({}, {"SEARCH_R1_EXTENSIONS": "json"})

    def gone(name):
        raise ImportError(f"{name} was removed")

    monkeypatch.setattr(reading.importlib, "import_module", gone)
    with pytest.raises(ConfigError, match=r"^environment variable SEARCH_R1_EXTENSIONS: cannot import .*'json'"):
        resolve_config(configs)


def test_a_launch_setting_is_not_a_key_of_search_r1_configs():
    """One table holds both, but the dict takes the plugin's only: NUM_GPUS is the launch's, read from the
    environment, and never reaches the job's view."""
    with pytest.raises(ConfigError, match=r"^SEARCH_R1_CONFIGS has an unknown key 'num_gpus'; accepted: llm_api_mode"):
        search_r1_configs({"num_gpus": 4}, {})
    config = resolve_config(search_r1_configs({}, {"NUM_GPUS": "4"}))
    with pytest.raises(AttributeError, match="no setting 'num_gpus' here"):
        config.num_gpus  # noqa: B018


def test_shell_words_must_split_as_a_shell_splits_them():
    kind = ShellWords()
    assert kind.from_env(" --index_path '/a b/c.index' ") == "--index_path '/a b/c.index'"
    assert kind.check("  ") is None and kind.check(None) is None
    assert refusal(kind, "--index_path 'x", from_env=True) == (
        "invalid; accepted: flags as a shell splits them (No closing quotation)"
    )
