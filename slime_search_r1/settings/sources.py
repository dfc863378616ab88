"""Where each value comes from: the setting's default, then SEARCH_R1_CONFIGS (the dict in generate_with_search.py,
which holds only what the user changes), then the setting's environment variable; and the checked view they resolve
to.

    SEARCH_R1_CONFIGS = search_r1_configs({"max_turns": 4})      # every other setting keeps its default

search_r1_configs() imports the `extensions` (files that register tools, search backends, token-tracking modes or
settings of their own), fills in the defaults and applies the environment variables, remembering which value came
from which variable; resolve_config() checks every value, runs the rules between settings (rules.py) and returns the
view (config.max_turns, config.local.search_url). An error names where the bad value came from (the variable, or the
dict key), the value and what is accepted. The launch scripts' settings are read from the environment alone
(read_environment). Nothing here imports slime or an implementation: the launch runs it before any GPU is spent.
"""

import copy
import difflib
import importlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from slime_search_r1.settings.kinds import ConfigError, Refused
from slime_search_r1.settings.rules import RULES
from slime_search_r1.settings.table import DESCRIBE_VARIABLE, PLUGIN, SETTINGS, Setting, read_by
from slime_search_r1.settings.view import SearchR1Config, Section


class SearchR1Configs(dict):
    """SEARCH_R1_CONFIGS: a plain nested dict, plus `sources`: the settings an environment variable set, so that a
    message about one names the variable (as long as its value is still the one the variable gave), and `given`:
    the keys the user's dict held."""

    sources: dict[str, tuple[str, str, Any]]  # key -> (variable, text as given, value read from it)
    given: frozenset[str]


def search_r1_configs(user: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> SearchR1Configs:
    """SEARCH_R1_CONFIGS: the user's settings (a deep copy), the extensions imported, every other setting at its
    default, then the environment variables applied on top."""
    environ = os.environ if environ is None else environ
    configs = SearchR1Configs(copy.deepcopy(dict(user)))
    configs.sources = {}
    configs.given = frozenset(key for key, value in configs.items() if not isinstance(value, Mapping)) | frozenset(
        f"{key}.{inner}" for key, value in configs.items() if isinstance(value, Mapping) for inner in value
    )
    extensions = SETTINGS["extensions"]
    if environ.get(extensions.env):  # first: the modules it names may declare the other variables
        text = environ[extensions.env]
        configs["extensions"] = _from_env(extensions, text)
        configs.sources[extensions.key] = (extensions.env, text, configs["extensions"])
    found, names = _lookup(configs, extensions.path)
    if found:
        import_extensions(_checked(extensions, names), _where(configs, extensions))
    _check_keys(configs)  # before defaults go into sections: "local" must be a dict
    _check_variables(environ)  # after the extensions: they may declare variables of their own
    for setting in read_by(PLUGIN):
        if not _lookup(configs, setting.path)[0]:
            _store(configs, setting.path, None if callable(setting.default) else copy.deepcopy(setting.default))
        text = environ.get(setting.env) if setting.env else None
        if text:  # an empty variable is unset
            value = _from_env(setting, text)
            _store(configs, setting.path, value)
            configs.sources[setting.key] = (setting.env, text, value)
    return configs


def _check_variables(environ: Mapping[str, str]) -> None:
    """A SEARCH_R1_* variable that no setting reads (a misspelled or removed name) is refused: it would otherwise
    leave its setting at the default without a word."""
    prefix = "SEARCH_R1_"
    # by the name without the prefix, which would make every name close to every other
    known = {s.env.removeprefix(prefix): s.env for s in SETTINGS.values() if s.env and s.env.startswith(prefix)}
    accepted = {*known.values(), DESCRIBE_VARIABLE}
    unknown = sorted(name for name in environ if name.startswith(prefix) and name not in accepted)
    if unknown:
        close = difflib.get_close_matches(unknown[0].removeprefix(prefix), known, n=1)
        hint = f" (did you mean {known[close[0]]}?)" if close else ""
        raise ConfigError(
            f"environment variable {unknown[0]} is no setting{hint}; the SEARCH_R1_* settings are "
            f"{', '.join(sorted(known.values()))} (python -m slime_search_r1.launch --list shows every setting)"
        )


def resolve_config(configs: Mapping[str, Any]) -> SearchR1Config:
    """Check SEARCH_R1_CONFIGS and return the view; raises ConfigError on the first bad value."""
    extensions = SETTINGS["extensions"]
    names = _checked(extensions, _lookup(configs, extensions.path)[1] or [])
    import_extensions(names, _where(configs, extensions))
    _check_keys(configs)
    settings = read_by(PLUGIN)
    values: dict[str, Any] = {}
    derived = []
    for setting in settings:
        found, value = _lookup(configs, setting.path)
        if not found:
            value = None if callable(setting.default) else setting.default
        value = _checked(setting, value)
        if value is None and callable(setting.default):
            derived.append(setting)
        values[setting.key] = value
    for setting in derived:
        values[setting.key] = setting.default(values)
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, _, name = key.rpartition(".")
        (sections.setdefault(section, {}) if section else top)[name] = value
    for section, inner in sections.items():
        hidden = frozenset(s.path[1] for s in settings if s.secret and s.path[0] == section)
        top[section] = Section(inner, hidden)
    config = SearchR1Config(top, frozenset(s.key for s in settings if s.secret and len(s.path) == 1))
    for rule in RULES:
        rule(config)
    return config


def read_environment(settings: Iterable[Setting], environ: Mapping[str, str]) -> tuple[Section, dict[str, str]]:
    """Settings that only an environment variable sets (the launch scripts'), read the same way: a read-only view of
    the values, and where each came from. A callable default is computed from the values before it."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in settings:
        key = setting.key
        text = environ.get(setting.env or "", "")
        if text.strip():
            values[key], sources[key] = _from_env(setting, text), f"environment variable {setting.env}"
        elif callable(setting.default):
            values[key], sources[key] = setting.default(values), "default, derived from the others"
        else:
            values[key], sources[key] = copy.deepcopy(setting.default), "default"
    return Section(values), sources


def value_source(configs: Mapping, setting: Setting) -> str:
    """Where a setting's value came from, in the order they apply: the default, then SEARCH_R1_CONFIGS (the dict
    in generate_with_search.py), then the setting's environment variable (an empty variable is unset)."""
    where = _where(configs, setting)
    found, value = _lookup(configs, setting.path)
    default = None if callable(setting.default) else setting.default
    if where.startswith("environment") or setting.key in getattr(configs, "given", ()) or value != default:
        return where
    return "default, derived from the others" if callable(setting.default) else "default"


def import_extensions(names: list[str], where: str) -> None:
    """Import the extension modules (idempotent); each registers what it adds when imported."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing module and a module that fails on import alike stop the launch
            raise ConfigError(
                f"{where}: cannot import the extension module {name!r}: {type(exc).__name__}: {exc}"
            ) from None


def _lookup(configs: Mapping, path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = configs
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _store(configs: dict, path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        configs = configs.setdefault(part, {})
    configs[path[-1]] = value


def _shown(setting: Setting, value: Any) -> str:
    return "<hidden>" if setting.secret and value else repr(value)


def _from_env(setting: Setting, text: str) -> Any:
    try:
        return setting.kind.from_env(text)
    except Refused as exc:
        shown = "<hidden>" if setting.secret else repr(text)
        raise ConfigError(f"environment variable {setting.env}={shown} is {exc}") from None


def _where(configs: Mapping, setting: Setting) -> str:
    """Where the current value of `setting` came from: its environment variable, or the dict key."""
    source = getattr(configs, "sources", {}).get(setting.key)
    if source is not None and _lookup(configs, setting.path)[1] == source[2]:
        return f"environment variable {source[0]}"
    return _dict_key(setting)


def _dict_key(setting: Setting) -> str:
    return "SEARCH_R1_CONFIGS[" + "][".join(repr(part) for part in setting.path) + "]"


def _checked(setting: Setting, value: Any) -> Any:
    try:
        return setting.kind.check(value)
    except Refused as exc:
        # Only the dict's values are refused here: a variable's text was checked as it was read (_from_env names
        # the variable), and checking a value again gives the same value.
        raise ConfigError(f"{_dict_key(setting)}={_shown(setting, value)} is {exc}") from None


def _check_keys(configs: Mapping) -> None:
    """A key no plugin setting has is a typo: say so rather than ignore it."""
    keys = dict.fromkeys(setting.key for setting in read_by(PLUGIN))  # in the list's order, for the message
    sections = {key.split(".")[0] for key in keys if "." in key}
    for key, value in configs.items():
        if key in sections:
            if not isinstance(value, Mapping):
                raise ConfigError(f"SEARCH_R1_CONFIGS[{key!r}] must be a dict of settings, got {type(value).__name__}")
            unknown = [f"{key}.{inner}" for inner in value if f"{key}.{inner}" not in keys]
        else:
            unknown = [] if key in keys else [key]
        if unknown:
            raise ConfigError(
                f"SEARCH_R1_CONFIGS has an unknown key {unknown[0]!r}; accepted: {', '.join(keys)} "
                "(a section's keys as section.key)"
            )
