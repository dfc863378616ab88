"""Which family a checkpoint is: the `model_family` setting, or ("auto") the first family in MODEL_FAMILIES' order
whose rule places the checkpoint's chat template; a template no rule places is refused, naming the setting.

The template is read as a chat server reads it: the tokenizer's chat_template (with tools, a template named
"tool_use" where the tokenizer has several), from a loaded tokenizer at a sample, from the checkpoint's files at
launch (tokenizer_config.json's "chat_template", or chat_template.jinja beside it).
"""

import json
from functools import lru_cache
from pathlib import Path

from slime_search_r1.families import ASSISTANT_HEADERS, CallsRead, ModelFamily
from slime_search_r1.registry import MODEL_FAMILIES
from slime_search_r1.settings.kinds import ConfigError

AUTO = "auto"
SETTING = "SEARCH_R1_MODEL_FAMILY"


def template_source(chat_template: object) -> str | None:
    """The template text a chat server applies with tools: a string, or of a named set the "tool_use" one, else the
    "default" one."""
    if isinstance(chat_template, str):
        return chat_template
    named = {}
    if isinstance(chat_template, dict):
        named = chat_template
    elif isinstance(chat_template, list):
        named = {item.get("name"): item.get("template") for item in chat_template if isinstance(item, dict)}
    return named.get("tool_use") or named.get("default")


def checkpoint_template(checkpoint: str) -> str | None:
    """The chat template saved with a checkpoint folder (chat_template.jinja first, as transformers loads it)."""
    folder = Path(checkpoint)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if config.is_file():
        return template_source(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    return None


def families() -> list[ModelFamily]:
    return [MODEL_FAMILIES.get(name) for name in MODEL_FAMILIES.names()]


def detect_family(template: str) -> ModelFamily | None:
    """The first family (MODEL_FAMILIES' order) whose rule places `template`, or None."""
    return next((family for family in families() if family.matches(template)), None)


def resolve_family(setting: str, template: str | None, where: str = "the checkpoint's chat template") -> ModelFamily:
    """The family the setting names, or the one `template` is placed in; ConfigError says why none is."""
    if setting != AUTO:
        return MODEL_FAMILIES.get(setting)
    return _placed(template, where)


@lru_cache(maxsize=16)
def _placed(template: str | None, where: str) -> ModelFamily:
    if not template:
        raise ConfigError(
            f"{SETTING}=auto reads the model family from {where}, and there is none; accepted: a checkpoint whose "
            f"tokenizer has a chat template, or {SETTING}=" + " | ".join(MODEL_FAMILIES.names())
        )
    family = detect_family(template)
    if family is None:
        raise ConfigError(
            f"{SETTING}=auto cannot place {where}: it writes neither JSON calls in <tool_call> (qwen25, qwen3, "
            "qwen3_thinking), <function=...><parameter=...> calls (qwen3_coder, qwen35) nor Llama's "
            '<|start_header_id|> with "parameters" (llama3); set the family yourself: '
            f"{SETTING}=" + " | ".join(MODEL_FAMILIES.names())
        )
    return family


def tokenizer_family(setting: str, tokenizer) -> ModelFamily:
    return resolve_family(setting, template_source(getattr(tokenizer, "chat_template", None)))


def check_family_tracking(family: ModelFamily, token_tracking_mode: str) -> None:
    """router_handler has the router render the conversation again, server side: with a template that rewrites
    earlier assistant turns (drops their thoughts) the tokens it returns are not the ones the model wrote."""
    if token_tracking_mode == "router_handler" and family.rewrites_history:
        raise ConfigError(
            f"TOKEN_TRACKING_MODE=router_handler re-renders the conversation with the chat template, and the "
            f"{family.name} family's template ({family.models}) rewrites earlier assistant turns (it drops their "
            "thoughts), so the trajectory would not be the tokens the model wrote; accepted: "
            "TOKEN_TRACKING_MODE=manual or router_radix with this family"
        )


def check_checkpoint_family(setting: str, llm_api_mode: str, token_tracking_mode: str, checkpoint: str | None) -> None:
    """At launch: the checkpoint's family placed (chat mode reads calls in its format) and its template fit for the
    token-tracking mode. A checkpoint folder that is not there is left to the launch's missing-path check."""
    if llm_api_mode != "chat":
        check_xml_template(checkpoint)
        if setting == AUTO:
            return
    if setting == AUTO:
        if not checkpoint or not Path(checkpoint).is_dir():
            return
        family = resolve_family(setting, checkpoint_template(checkpoint), f"the chat template of {checkpoint}")
    else:
        family = MODEL_FAMILIES.get(setting)
    check_family_tracking(family, token_tracking_mode)


def check_xml_template(checkpoint: str | None) -> None:
    """XML mode's format rule reads the response after the prompt's last assistant header (qa_em_format.py, as
    Search-R1's does): a chat template that writes none of the known ones would make every response format-invalid,
    its format bonus lost in silence, so it is refused at launch."""
    template = checkpoint_template(checkpoint) if checkpoint and Path(checkpoint).is_dir() else None
    if template and not any(header in template for header in ASSISTANT_HEADERS):
        raise ConfigError(
            f"LLM_API_MODE=generate reads each response after the prompt's assistant header, and the chat template "
            f"of {checkpoint} writes none it knows, so every response would fail Search-R1's format rule; accepted: "
            "a template that opens the assistant turn with " + " or ".join(repr(h) for h in ASSISTANT_HEADERS)
        )


def foreign_calls(family: ModelFamily, text: str, tool_schemas: list[dict]) -> ModelFamily | None:
    """Another family whose reader finds calls (and nothing it cannot read) in `text`, where `family`'s found none."""
    for other in families():
        if other.read_calls is family.read_calls:
            continue
        read: CallsRead = other.read_calls(text, tool_schemas)
        if read.calls and not read.unparsable:
            return other
    return None
