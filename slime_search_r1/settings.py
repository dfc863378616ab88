"""What the user set: every setting declared once, read from SEARCH_R1_CONFIGS and the environment, checked, and
handed to the rollout as a read-only view.

A setting is one row of SETTINGS: its key in SEARCH_R1_CONFIGS ("max_turns", or "local.search_url" inside the
"local" section), its default, what it accepts, and the environment variable that overrides it. The dict in
generate_with_search.py holds only what the user changes:

    SEARCH_R1_CONFIGS = search_r1_configs({"max_turns": 4})      # every other setting keeps its default

search_r1_configs() imports the `extensions` (files that register tools, search backends, token-tracking modes or
settings of their own), fills in the defaults and applies the environment variables, remembering which value
came from which variable; resolve_config() checks every value and returns the view (config.max_turns,
config.local.search_url). An error names where the bad value came from (the variable, or the dict key), the value
and what is accepted. Nothing here imports slime or an implementation: the launch check runs it before any GPU
is spent (`python -m slime_search_r1.launch_check --list` prints every setting).
"""

import copy
import importlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from slime_search_r1.registry import PROTOCOLS, SEARCH_BACKENDS, TOKEN_DRIVERS, TOOLS, reward_names

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting that cannot work; the message says where it came from, its value and what is accepted."""


class Refused(ValueError):
    """A value a kind does not accept: `problem` ("invalid", "out of range") and what is accepted."""

    def __init__(self, accepted: str, problem: str = "invalid"):
        super().__init__(f"{problem}; accepted: {accepted}")
        self.accepted, self.problem = accepted, problem


# ---- what a setting accepts -------------------------------------------------------------------------------------
# Each kind checks a value written in SEARCH_R1_CONFIGS (check) and reads one from an environment variable
# (from_env); both raise Refused.


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...] | Callable[[], tuple[str, ...]]  # a callable: the names a registry holds now

    def names(self) -> tuple[str, ...]:
        return self.options() if callable(self.options) else self.options

    def check(self, value: Any) -> str:
        if value not in self.names():
            raise Refused(" | ".join(self.names()))
        return value

    def from_env(self, text: str) -> str:
        wanted = text.strip().lower()  # choices are case-insensitive in the environment
        return self.check(next((name for name in self.names() if name.lower() == wanted), text))


@dataclass(frozen=True)
class Flag:
    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise Refused("True or False")
        return value

    def from_env(self, text: str) -> bool:
        lowered = text.strip().lower()
        if lowered in _TRUE + _FALSE:
            return lowered in _TRUE
        raise Refused(f"one of {', '.join(_TRUE + _FALSE)}")


@dataclass(frozen=True)
class Integer:
    low: int
    high: int | None = None
    optional: bool = False  # None allowed: the setting is off

    def bounds(self) -> str:
        bounds = f">= {self.low}" if self.high is None else f"{self.low} to {self.high}"
        return f"{bounds}, or None" if self.optional else bounds

    def check(self, value: Any) -> int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(f"an integer, {self.bounds()}")
        if value < self.low or (self.high is not None and value > self.high):
            raise Refused(self.bounds(), "out of range")
        return value

    def from_env(self, text: str) -> int | None:
        if self.optional and text.strip().lower() == "none":
            return None
        try:
            value = int(text.strip())
        except ValueError:
            raise Refused(f"an integer, {self.bounds()}") from None
        return self.check(value)


@dataclass(frozen=True)
class Number:
    low: float
    high: float | None = None
    optional: bool = False  # None allowed: the setting's default is derived from other settings

    def bounds(self) -> str:
        bounds = f">= {self.low}" if self.high is None else f"{self.low} to {self.high}"
        return f"{bounds}, or None" if self.optional else bounds

    def check(self, value: Any) -> float | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refused(f"a number, {self.bounds()}")
        if not self.low <= value <= (self.high if self.high is not None else float("inf")):  # also refuses nan
            raise Refused(self.bounds(), "out of range")
        return float(value)

    def from_env(self, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise Refused(f"a number, {self.bounds()}") from None
        return self.check(value)


@dataclass(frozen=True)
class Text:
    optional: bool = False  # None (or "") allowed

    def check(self, value: Any) -> str | None:
        if self.optional and (value is None or value == ""):
            return None
        if not isinstance(value, str) or not value.strip():
            raise Refused("a non-empty string, or None" if self.optional else "a non-empty string")
        return value.strip()

    def from_env(self, text: str) -> str | None:
        return self.check(text)


@dataclass(frozen=True)
class Urls:
    """One or more http(s) URLs (a list, or comma-separated); a bare http://host:port gets `path`."""

    path: str

    def check(self, value: Any) -> tuple[str, ...]:
        accepted = f"http://host:port[{self.path}], several as a list or separated by commas"
        parts = value.split(",") if isinstance(value, str) else value
        if not isinstance(parts, list | tuple) or not all(isinstance(part, str) for part in parts):
            raise Refused(accepted)
        urls = []
        for part in (p.strip() for p in parts):
            if not part:
                continue
            split = urlsplit(part)
            if split.scheme not in ("http", "https") or not split.netloc:
                raise Refused(f"{accepted} ({part!r} is not an http(s) URL)")
            urls.append(part.rstrip("/") + self.path if split.path in ("", "/") else part)
        if not urls:
            raise Refused(accepted)
        return tuple(urls)

    def from_env(self, text: str) -> tuple[str, ...]:
        return self.check(text)


@dataclass(frozen=True)
class Names:
    """A list of names (comma-separated in the environment), each one of `options`, none twice."""

    options: tuple[str, ...] | Callable[[], tuple[str, ...]] | None  # None: any Python module name
    at_least: int = 0

    def check(self, value: Any) -> list[str]:
        names = self.options() if callable(self.options) else self.options
        what = "Python module names" if names is None else f"names from {', '.join(names)}"
        accepted = f"a list of {what}" + (f", at least {self.at_least}" if self.at_least else "")
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise Refused(accepted)
        items = [item.strip() for item in value]
        unknown = [item for item in items if (item not in names if names is not None else not _is_module(item))]
        if unknown or len(items) < self.at_least or len(set(items)) < len(items):
            unknown_names = f" ({', '.join(map(repr, unknown))} unknown)" if unknown else ""
            raise Refused(f"{accepted}, each once{unknown_names}")
        return items

    def from_env(self, text: str) -> list[str]:
        return self.check([part for part in text.split(",") if part.strip()])


def _is_module(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name))


# ---- the settings -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    key: str  # "max_turns", or "section.key" for one inside a section ("local.search_url")
    default: Any  # or a callable of the other resolved settings (a default derived from them)
    kind: Choice | Flag | Integer | Number | Text | Urls | Names
    env: str | None = None  # the environment variable that overrides SEARCH_R1_CONFIGS
    doc: str = ""
    secret: bool = False  # never shown: not in messages, not in the view's repr

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


SETTINGS: dict[str, Setting] = {}
# Settings and variables that were renamed: using the old name is an error naming the new one, never ignored.
RENAMED_KEYS = {"search_max_retries": "search_attempts"}
RENAMED_VARIABLES = {"SEARCH_R1_SEARCH_RETRIES": "SEARCH_R1_SEARCH_ATTEMPTS (it counts attempts, the first included)"}


def register_setting(setting: Setting) -> None:
    """A new setting (an extension's own, e.g. "bing.api_key"): one call, and it is read, checked and overridable."""
    if setting.key in SETTINGS:
        raise ValueError(f"the setting {setting.key!r} is declared already")
    if setting.env and any(other.env == setting.env for other in SETTINGS.values()):
        raise ValueError(f"the environment variable {setting.env} already overrides another setting")
    if len(setting.path) > 2:
        raise ValueError(f"a setting key is 'name' or 'section.name', got {setting.key!r}")
    SETTINGS[setting.key] = setting


for _setting in (
    # ---- modes
    Setting("llm_api_mode", "generate", Choice(PROTOCOLS.names), "LLM_API_MODE",
            "generate: Search-R1's XML tags over /generate; chat: OpenAI tool calls"),
    Setting("token_tracking_mode", "manual", Choice(TOKEN_DRIVERS.names), "TOKEN_TRACKING_MODE",
            "where the trajectory's tokens come from: manual (token in, token out), or the old slime router's cache"),
    Setting("loss_mask_mode", "strict", Choice(("strict", "simple")), "LOSS_MASK_MODE",
            "strict: observations masked out of the loss; simple: trained too (placeholder log probs 0.0)"),
    Setting("return_logprob", True, Flag(), "TRACK_LOG_PROBS",
            "engine log probs in rollout_log_probs (TIS needs them)"),
    Setting("engine_transport", "aiohttp", Choice(("aiohttp", "slime")), "SEARCH_R1_ENGINE_TRANSPORT",
            "engine calls over aiohttp, or slime's post() (used anyway with --use-distributed-post)"),
    Setting("engine_model", "actor", Text(), "SEARCH_R1_ENGINE_MODEL",
            "the policy's name in --sglang-config (slime's get_model_url); else slime's default router"),
    # ---- rollout
    Setting("max_turns", 3, Integer(1, 128), "SEARCH_R1_MAX_TURNS",
            "model turns per sample; a tool call on the last turn is not run"),
    # ---- long horizon (README: "Fully asynchronous, long horizon")
    Setting("force_answer", "off", Choice(("off", "final_turn", "inject")), "SEARCH_R1_FORCE_ANSWER",
            "off; final_turn: one more turn after max_turns, its tool calls not run (Search-R1); inject: an "
            "instruction to answer now before the last turn (or below force_answer_reserve), outside the loss"),
    Setting("force_answer_reserve", 0, Integer(0), "SEARCH_R1_FORCE_ANSWER_RESERVE",
            "inject: also when fewer response tokens than this are left after a reply (0: before the last turn only)"),
    Setting("split_trajectories", False, Flag(), "SEARCH_R1_SPLIT_TRAJECTORIES",
            "an episode whose context stops being a prefix of what was trained becomes several samples (one "
            "rollout_id, the episode's reward on each); needed by page chunks"),
    Setting("max_context_length", 16384, Integer(1), "SEARCH_R1_MAX_CONTEXT_LENGTH",
            "prompt + response tokens (slime's --rollout-max-context-len caps it too)"),
    Setting("max_obs_tokens", 500, Integer(16), "SEARCH_R1_MAX_OBS_TOKENS",
            "tokens of one search result (Search-R1's max_obs_length)"),
    Setting("max_version_lag", None, Integer(0, optional=True), "SEARCH_R1_MAX_VERSION_LAG",
            "loss mask 0 on generated tokens more than this many weight versions behind the episode's last; "
            "None: off"),
    # ---- tools and search
    Setting("tools", ["search"], Names(TOOLS.names, at_least=1), "SEARCH_R1_TOOLS",
            "the tools the model may call: search, and access to read a page of the results"),
    Setting("max_page_tokens", 1024, Integer(16), "SEARCH_R1_MAX_PAGE_TOKENS",
            "tokens of one page the access tool shows (the response budget must hold them)"),
    Setting("page_chunk_tokens", 0, Integer(0), "SEARCH_R1_PAGE_CHUNK_TOKENS",
            "0: off; else access shows a page in chunks of this many tokens, the next one each time the model "
            "accesses it again, and a chunk read is cut to its short form in later contexts (ASearcher)"),
    Setting("max_page_chunks", 10, Integer(1, 1000), "SEARCH_R1_MAX_PAGE_CHUNKS",
            "chunks of one page at most (ASearcher: 10); the rest of the page is never shown"),
    Setting("page_short_tokens", 32, Integer(0), "SEARCH_R1_PAGE_SHORT_TOKENS",
            "tokens of a chunk's text its short form keeps, in the contexts after the turn that read it"),
    Setting("topk", 3, Integer(1, 100), "SEARCH_R1_TOPK", "passages per search"),
    Setting("search_concurrency", 256, Integer(1), "SEARCH_R1_SEARCH_CONCURRENCY",
            "searches in flight per rollout process"),
    Setting("search_backend", "local", Choice(SEARCH_BACKENDS.names), "SEARCH_BACKEND",
            "local retrieval server, or Google through serper.dev"),
    Setting("search_timeout", 30.0, Number(0.1), "SEARCH_R1_SEARCH_TIMEOUT", "seconds per attempt"),
    Setting("search_attempts", 3, Integer(1, 20), "SEARCH_R1_SEARCH_ATTEMPTS",
            "tries per call, the first included, on connection errors, timeouts, 5xx and 429 (Retry-After obeyed)"),
    Setting("drop_failed_samples", True, Flag(), "SEARCH_R1_DROP_FAILED_SAMPLES",
            "remove_sample on FAILED samples (a tool still failing after its retries)"),
    Setting("local.search_url", ("http://127.0.0.1:8000/retrieve",), Urls("/retrieve"), "RETRIEVAL_SERVER_URL",
            "local retrieval server(s); load is spread over all"),
    Setting("local.proxy", None, Text(optional=True), None, "HTTP proxy for the local servers"),
    Setting("google.api_key", None, Text(optional=True), "GOOGLE_API_KEY", "serper.dev key", secret=True),
    Setting("google.snippet_only", True, Flag(), "GOOGLE_SNIPPET_ONLY",
            "snippets, or the result pages fetched and cut to the snippet's paragraphs"),
    Setting("google.proxy", None, Text(optional=True), None, "HTTP proxy for serper.dev and the pages"),
    Setting("google.search_url", "https://google.serper.dev/search", Text(), "GOOGLE_SEARCH_URL", "serper endpoint"),
    Setting("google.fetch_concurrency", 8, Integer(1), None, "pages fetched at once when snippet_only is False"),
    # ---- reward
    Setting("format_score", 0.2, Number(0.0, 1.0), "SEARCH_R1_FORMAT_SCORE",
            "Search-R1's structure bonus; 0 gives pure exact match"),
    Setting("final_format_score", lambda values: values["format_score"] / 2, Number(0.0, 1.0, optional=True), None,
            "a wrong answer in a bad format; None: half of format_score (Search-R1 v0.3 pairs 0.2 with 0.1)"),
    Setting("retrieval_score", 0.0, Number(0.0, 1.0), None, "bonus when a gold answer appears in a retrieved block"),
    Setting("reward", "em", Choice(reward_names), "SEARCH_R1_REWARD",
            "the answer score the reward is built on: em, f1, cover_em, or judge (an LLM judge, judge.* settings)"),
    Setting("judge.url", None, Text(optional=True), "SEARCH_R1_JUDGE_URL",
            "the judge's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1 (SEARCH_R1_REWARD=judge)"),
    Setting("judge.model", None, Text(optional=True), "SEARCH_R1_JUDGE_MODEL", "the model name the judge serves"),
    Setting("judge.api_key", None, Text(optional=True), "JUDGE_API_KEY",
            "sent as a bearer token when set; never logged", secret=True),
    Setting("judge.prompt", None, Text(optional=True), "SEARCH_R1_JUDGE_PROMPT",
            "a judge prompt file with {question}, {gold_answers} and {prediction}; None: scoring/judge_prompt.txt"),
    Setting("judge.concurrency", 32, Integer(1), None, "judge requests in flight per rollout process"),
    Setting("judge.timeout", 60.0, Number(0.1), None, "seconds per judge request"),
    Setting("judge.attempts", 4, Integer(1, 20), None, "tries per answer, the first included, before it is marked"),
    Setting("judge.max_tokens", 1024, Integer(1), None,
            "max_tokens of the judge's reply; one cut off there is marked invalid (a reasoning judge needs room)"),
    # ---- extending
    Setting("extensions", [], Names(None), "SEARCH_R1_EXTENSIONS",
            "modules imported first: they register tools, search backends, token-tracking modes or settings"),
):  # fmt: skip
    register_setting(_setting)


# ---- SEARCH_R1_CONFIGS ------------------------------------------------------------------------------------------


class SearchR1Configs(dict):
    """SEARCH_R1_CONFIGS: a plain nested dict, plus `sources`: the settings an environment variable set, so that a
    message about one names the variable (as long as its value is still the one the variable gave), and `given`:
    the keys the user's dict held."""

    sources: dict[str, tuple[str, str, Any]]  # key -> (variable, text as given, value read from it)
    given: frozenset[str]


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


def import_extensions(names: list[str], where: str) -> None:
    """Import the extension modules (idempotent); each registers what it adds when imported."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing module and a module that fails on import alike stop the launch
            raise ConfigError(
                f"{where}: cannot import the extension module {name!r}: {type(exc).__name__}: {exc}"
            ) from None


def search_r1_configs(user: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> SearchR1Configs:
    """SEARCH_R1_CONFIGS: the user's settings (a deep copy), the extensions imported, every other setting at its
    default, then the environment variables applied on top."""
    environ = os.environ if environ is None else environ
    for old, new in RENAMED_VARIABLES.items():
        if environ.get(old):
            raise ConfigError(f"environment variable {old} was renamed; set {new}")
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
    for setting in SETTINGS.values():
        if not _lookup(configs, setting.path)[0]:
            _store(configs, setting.path, None if callable(setting.default) else copy.deepcopy(setting.default))
        text = environ.get(setting.env) if setting.env else None
        if text:  # an empty variable is unset
            value = _from_env(setting, text)
            _store(configs, setting.path, value)
            configs.sources[setting.key] = (setting.env, text, value)
    return configs


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


def value_source(configs: Mapping, setting: Setting) -> str:
    """Where a setting's value came from, in the order they apply: the default, then SEARCH_R1_CONFIGS (the dict
    in generate_with_search.py), then the setting's environment variable (an empty variable is unset)."""
    where = _where(configs, setting)
    found, value = _lookup(configs, setting.path)
    default = None if callable(setting.default) else setting.default
    if where.startswith("environment") or setting.key in getattr(configs, "given", ()) or value != default:
        return where
    return "default, derived from the others" if callable(setting.default) else "default"


def read_environment(settings: Iterable[Setting], environ: Mapping[str, str]) -> tuple["Section", dict[str, str]]:
    """Settings that only an environment variable sets (the launch scripts' own, launch/knobs.py), read the same
    way: a read-only view of the values, and where each came from. A callable default is computed from the values
    before it."""
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


def _checked(setting: Setting, value: Any) -> Any:
    try:
        return setting.kind.check(value)
    except Refused as exc:
        # Only the dict's values are refused here: a variable's text was checked as it was read (_from_env names
        # the variable), and checking a value again gives the same value.
        raise ConfigError(f"{_dict_key(setting)}={_shown(setting, value)} is {exc}") from None


def _check_keys(configs: Mapping) -> None:
    """A key no setting has is a typo or an old name: say so rather than ignore it."""
    sections = {setting.path[0] for setting in SETTINGS.values() if len(setting.path) == 2}
    for key, value in configs.items():
        if key in RENAMED_KEYS:
            raise ConfigError(f"SEARCH_R1_CONFIGS[{key!r}] was renamed {RENAMED_KEYS[key]!r}")
        if key in sections:
            if not isinstance(value, Mapping):
                raise ConfigError(f"SEARCH_R1_CONFIGS[{key!r}] must be a dict of settings, got {type(value).__name__}")
            unknown = [f"{key}.{inner}" for inner in value if f"{key}.{inner}" not in SETTINGS]
        else:
            unknown = [] if key in SETTINGS else [key]
        if unknown:
            raise ConfigError(
                f"SEARCH_R1_CONFIGS has an unknown key {unknown[0]!r}; accepted: {', '.join(SETTINGS)} "
                "(a section's keys as section.key)"
            )


# ---- the view the rollout reads ---------------------------------------------------------------------------------


class Section:
    """Read-only settings: `view.max_turns`, `view.local.search_url`. Secrets never appear in the repr. The values
    are plain attributes, so reading one runs no code of this module."""

    def __init__(self, values: dict[str, Any], hidden: frozenset[str] = frozenset()):
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_hidden", hidden)

    def __getattr__(self, name: str) -> Any:  # only for a name that is not a setting
        raise AttributeError(f"no setting {name!r} here; there are {', '.join(self._values)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only; change SEARCH_R1_CONFIGS (or the environment) instead")

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'<hidden>' if k in self._hidden else repr(v)}" for k, v in self._values.items())
        return f"{type(self).__name__}({shown})"


class SearchR1Config(Section):
    """Every setting, checked (resolve_config builds it); `train_observations`: LOSS_MASK_MODE=simple."""

    def __init__(self, values: dict[str, Any], hidden: frozenset[str] = frozenset()):
        super().__init__(values, hidden)
        object.__setattr__(self, "train_observations", values["loss_mask_mode"] == "simple")


# Rules between settings: each gets the view and raises ConfigError (extensions may add theirs).
RULES: list[Callable[[SearchR1Config], None]] = []


def register_rule(rule: Callable[[SearchR1Config], None]) -> Callable[[SearchR1Config], None]:
    RULES.append(rule)
    return rule


@register_rule
def _router_handler_needs_messages(config: SearchR1Config) -> None:
    if config.llm_api_mode == "generate" and config.token_tracking_mode == "router_handler":
        raise ConfigError(
            "Invalid configuration: token_tracking_mode='router_handler' is NOT compatible with "
            "llm_api_mode='generate' (it needs chat messages); use TOKEN_TRACKING_MODE=manual or router_radix, "
            "or LLM_API_MODE=chat"
        )


@register_rule
def _google_needs_a_key(config: SearchR1Config) -> None:
    if config.search_backend == "google" and not config.google.api_key:
        raise ConfigError(
            "search_backend='google' needs a serper.dev key: set GOOGLE_API_KEY (or SEARCH_R1_CONFIGS['google']"
            "['api_key']), or use SEARCH_BACKEND=local"
        )


@register_rule
def _access_reads_the_local_retrievers_pages(config: SearchR1Config) -> None:
    if "access" in config.tools and config.search_backend != "local":
        raise ConfigError(
            f"the access tool reads pages from the local retriever's POST /access (--pages_path), but "
            f"search_backend={config.search_backend!r} shows URLs it does not hold; use SEARCH_BACKEND=local with "
            "access, or leave access out of SEARCH_R1_TOOLS"
        )


@register_rule
def _version_lag_needs_recorded_versions(config: SearchR1Config) -> None:
    if config.max_version_lag is not None and config.token_tracking_mode in ("router_radix", "router_handler"):
        raise ConfigError(
            f"max_version_lag={config.max_version_lag} masks tokens by the weight version that sampled them, which "
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} does not record (its tokens come from the router's "
            "cache); use TOKEN_TRACKING_MODE=manual, or leave SEARCH_R1_MAX_VERSION_LAG unset"
        )


@register_rule
def _wrong_answer_cannot_beat_valid_format(config: SearchR1Config) -> None:
    if config.final_format_score > config.format_score:
        raise ConfigError("final_format_score must not exceed format_score (a wrong answer cannot beat valid format)")


# The fewest tokens a page chunk may hold: below this a chunk is mostly its "[part i of n]" frame.
MIN_PAGE_CHUNK_TOKENS = 16
# Tokens a chunk's observation may take beyond page_chunk_tokens: its frame, the hint to read on and the protocol's
# tags or template (tools/access.py); the response budget must hold a chunk with them.
PAGE_CHUNK_FRAME_TOKENS = 64


@register_rule
def _split_needs_the_manual_driver(config: SearchR1Config) -> None:
    if config.split_trajectories and config.token_tracking_mode != "manual":
        raise ConfigError(
            f"SEARCH_R1_SPLIT_TRAJECTORIES=true builds each sample from the contexts the engine was sent, but "
            f"TOKEN_TRACKING_MODE={config.token_tracking_mode} takes the trajectory from the router's cache at the "
            "end of the episode; accepted: TOKEN_TRACKING_MODE=manual with split trajectories"
        )


@register_rule
def _page_chunks_fit_and_need_a_split(config: SearchR1Config) -> None:
    chunk = config.page_chunk_tokens
    if not chunk:
        return
    if chunk < MIN_PAGE_CHUNK_TOKENS:
        raise ConfigError(
            f"SEARCH_R1_PAGE_CHUNK_TOKENS={chunk} is out of range; accepted: 0 (off) or {MIN_PAGE_CHUNK_TOKENS} to "
            f"{config.max_context_length - 1} (below SEARCH_R1_MAX_CONTEXT_LENGTH)"
        )
    context = config.max_context_length
    if chunk >= context:
        raise ConfigError(
            f"SEARCH_R1_PAGE_CHUNK_TOKENS={chunk} cannot fit SEARCH_R1_MAX_CONTEXT_LENGTH={context}; accepted: "
            f"0 (off) or {MIN_PAGE_CHUNK_TOKENS} to {context - 1}"
        )
    if config.page_short_tokens >= chunk:
        raise ConfigError(
            f"SEARCH_R1_PAGE_SHORT_TOKENS={config.page_short_tokens} would not shorten a chunk of "
            f"SEARCH_R1_PAGE_CHUNK_TOKENS={chunk}; accepted: 0 to {chunk - 1}"
        )
    if "access" not in config.tools:
        raise ConfigError(
            f"SEARCH_R1_PAGE_CHUNK_TOKENS={chunk} reads the access tool's pages in chunks, but access is not "
            "enabled; accepted: SEARCH_R1_TOOLS=search,access with page chunks, or SEARCH_R1_PAGE_CHUNK_TOKENS=0"
        )
    if not config.split_trajectories:
        raise ConfigError(
            f"SEARCH_R1_PAGE_CHUNK_TOKENS={chunk} cuts each chunk read to its short form in later contexts, so "
            "those contexts are no longer a prefix of what was trained; accepted: SEARCH_R1_SPLIT_TRAJECTORIES=true "
            "with page chunks, or SEARCH_R1_PAGE_CHUNK_TOKENS=0"
        )


@register_rule
def _judge_settings_work(config: SearchR1Config) -> None:
    judge = config.judge
    if judge.url and not judge.model:
        raise ConfigError(
            "SEARCH_R1_JUDGE_URL names a judge but SEARCH_R1_JUDGE_MODEL is not set; accepted: the model name that "
            "endpoint serves (SEARCH_R1_JUDGE_MODEL, or SEARCH_R1_CONFIGS['judge']['model'])"
        )
    if config.reward == "judge" and not judge.url:
        raise ConfigError(
            "SEARCH_R1_REWARD=judge needs a judge endpoint; accepted: SEARCH_R1_JUDGE_URL (an OpenAI-compatible "
            "http(s) URL) with SEARCH_R1_JUDGE_MODEL, or another reward: " + " | ".join(reward_names())
        )


def resolve_config(configs: Mapping[str, Any]) -> SearchR1Config:
    """Check SEARCH_R1_CONFIGS and return the view; raises ConfigError on the first bad value."""
    extensions = SETTINGS["extensions"]
    names = _checked(extensions, _lookup(configs, extensions.path)[1] or [])
    import_extensions(names, _where(configs, extensions))
    _check_keys(configs)
    values: dict[str, Any] = {}
    derived = []
    for setting in SETTINGS.values():
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
        hidden = frozenset(s.path[1] for s in SETTINGS.values() if s.secret and s.path[0] == section)
        top[section] = Section(inner, hidden)
    config = SearchR1Config(top, frozenset(s.key for s in SETTINGS.values() if s.secret and len(s.path) == 1))
    for rule in RULES:
        rule(config)
    return config
