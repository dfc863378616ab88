"""The plugin's seams, open by name: how the model talks (protocols), where a turn's tokens come from (token
drivers), what it may call (tools), what answers a search (search backends), how an answer scores (answer
scores) and how a model family writes calls and thoughts (model families). Every built-in is declared once, below,
as the place its object lives; extensions register theirs here.

A setting names an entry of a seam. A built-in's module is imported the first time its entry is asked for, so that
naming or checking a setting imports no implementation (or slime). A new entry is one `register()` call in a file
of your own, imported through the `extensions` setting (SEARCH_R1_EXTENSIONS=my_module), so that generate(), the
launch check, the data script and evaluate.py see it alike:

    from slime_search_r1.registry import TOOLS
    TOOLS.register("calculator", CALCULATOR)                # then SEARCH_R1_TOOLS=search,calculator
"""

import importlib
from typing import Any


class Registry:
    """The entries one seam answers to, by name: its built-ins (where each lives, "module:attribute", imported on
    first use) and the entries registered at run time (an extension's, or one that replaces a built-in)."""

    def __init__(self, seam: str, setting: str, builtins: dict[str, str]):
        self.seam = seam  # what an entry is, for messages ("search backend")
        self.setting = setting  # the setting that names entries ("search_backend")
        self.builtins = dict(builtins)  # name -> "module:attribute"
        self._entries: dict[str, Any] = {}  # registered

    def register(self, name: str, entry: Any, *, replace: bool = False) -> None:
        """Make `entry` available as `name` (replacing a built-in of that name only when asked)."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"a {self.seam} needs a non-empty name without surrounding spaces, got {name!r}")
        if name in self and not replace:
            raise ValueError(f"a {self.seam} named {name!r} is registered already (pass replace=True to replace it)")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove the entry registered as `name` (a built-in it replaced answers again)."""
        del self._entries[name]

    def names(self) -> tuple[str, ...]:
        return (*self.builtins, *(name for name in self._entries if name not in self.builtins))

    def __contains__(self, name: object) -> bool:
        return name in self.builtins or name in self._entries

    def get(self, name: str) -> Any:
        """The entry registered as `name`, else the built-in of that name; KeyError names the known ones."""
        if name in self._entries:
            return self._entries[name]
        if name not in self.builtins:
            raise KeyError(f"no {self.seam} named {name!r}; registered: {', '.join(self.names())}")
        module, _, attribute = self.builtins[name].partition(":")
        return getattr(importlib.import_module(module), attribute)


PROTOCOLS = Registry(
    "protocol",
    "llm_api_mode",
    {
        "generate": "slime_search_r1.protocols.xml_tags:XmlProtocol",  # Search-R1's XML tags over /generate
        "chat": "slime_search_r1.protocols.chat:ChatProtocol",  # OpenAI tool calls through the chat template
    },
)
TOKEN_DRIVERS = Registry(
    "token-tracking mode",
    "token_tracking_mode",
    {
        "manual": "slime_search_r1.tokens.manual:ManualDriver",  # token in, token out, any SGLang
        "router_radix": "slime_search_r1.tokens.legacy_router:RouterRadixDriver",  # the old slime router's cache
        "router_handler": "slime_search_r1.tokens.legacy_router:RouterHandlerDriver",
    },
)
TOOLS = Registry(
    "tool",
    "tools",
    {
        "search": "slime_search_r1.tools.search:SEARCH",  # Search-R1's <search> query </search>
        "access": "slime_search_r1.tools.access:ACCESS",  # ASearcher's <access> URL </access> (off by default)
    },
)
SEARCH_BACKENDS = Registry(
    "search backend",
    "search_backend",
    {
        "local": "slime_search_r1.tools.search:local_search",  # local_dense_retriever/ (or Search-R1's server)
        "google": "slime_search_r1.search.google:search",  # serper.dev
    },
)
# (prediction or None, gold answers) -> a score in [0, 1]; the reward is built on one of them, or on the judge's
# verdict (JUDGE), and evaluate.py reports every one.
ANSWER_SCORES = Registry(
    "answer score",
    "reward",
    {
        "em": "slime_search_r1.scoring.answers:exact_match",  # Search-R1's exact match
        "f1": "slime_search_r1.scoring.answers:f1_score",  # SQuAD's token F1
        "cover_em": "slime_search_r1.scoring.answers:cover_exact_match",  # a gold answer inside the prediction
    },
)
# How a checkpoint's model writes tool calls and thoughts (families/): the model_family setting names one, or "auto"
# takes the first, in this order, whose rule places the checkpoint's chat template (families/detection.py). Each file
# names the SGLang 0.5.23 rule it follows (srt/parser/template_detection.py).
MODEL_FAMILIES = Registry(
    "model family",
    "model_family",
    {
        "qwen35": "slime_search_r1.families.qwen35:QWEN35",  # Qwen3.5/3.6: <function=...> calls, prompt-opened thought
        "qwen3_coder": "slime_search_r1.families.qwen3_coder:QWEN3_CODER",  # <function=...> calls, no thoughts
        "qwen3": "slime_search_r1.families.qwen3:QWEN3",  # JSON calls, enable_thinking toggles the model's thoughts
        "qwen3_thinking": "slime_search_r1.families.qwen3_thinking:QWEN3_THINKING",  # JSON calls, prompt-opened
        "llama3": "slime_search_r1.families.llama3:LLAMA3",  # bare JSON {"name", "parameters"}, <|eot_id|>
        "qwen25": "slime_search_r1.families.qwen25:QWEN25",  # JSON calls in <tool_call>, no thoughts
    },
)
JUDGE = "judge"  # the reward built on an LLM judge's verdict (scoring/judge.py), beside the answer scores


def reward_names() -> tuple[str, ...]:
    """What the reward may be built on: every answer score, then the judge."""
    return (*ANSWER_SCORES.names(), JUDGE)
