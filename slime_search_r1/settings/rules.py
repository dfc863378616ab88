"""Rules between settings: combinations that each setting accepts alone but that cannot work together. Each rule gets
the resolved view and raises ConfigError naming the settings and what is accepted; resolve_config runs every rule,
extensions' included (register_rule)."""

from collections.abc import Callable

from slime_search_r1.registry import reward_names
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.view import SearchR1Config

RULES: list[Callable[[SearchR1Config], None]] = []

# The fewest tokens a page chunk may hold: below this a chunk is mostly its "[part i of n]" frame.
MIN_PAGE_CHUNK_TOKENS = 16
# Tokens a chunk's observation may take beyond page_chunk_tokens: its frame, the hint to read on and the protocol's
# tags or template (tools/access.py); the response budget must hold a chunk with them.
PAGE_CHUNK_FRAME_TOKENS = 64


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
