"""The plugin's seams, open by name: how the model talks (protocols), where a turn's tokens come from (token
drivers), what it may call (tools), what answers a search (search backends), how an answer scores (answer
scores) and how a model family writes calls and thoughts (model families). Every built-in is declared once, below,
as the place its object lives; extensions register theirs here. What an entry must provide is declared beside its
registry for a protocol (TurnProtocol) and a token driver (TokenDriver), in tools/contract.py for a tool (Tool).

A setting names an entry of a seam. A built-in's module is imported the first time its entry is asked for, so that
naming or checking a setting imports no implementation (or slime). A new entry is one `register()` call in a file
of your own, imported through the `extensions` setting (SEARCH_R1_EXTENSIONS=my_module), so that generate(), the
launch check, the data script and evaluate.py see it alike:

    from slime_search_r1.registry import TOOLS
    TOOLS.register("calculator", CALCULATOR)                # then SEARCH_R1_TOOLS=search,calculator
"""

import importlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the contracts' types, named without importing an implementation (or slime)
    from slime.utils.types import Sample
    from slime_search_r1.episode import Action, EpisodeState, Reply, Turn
    from slime_search_r1.tokens.manual import Trajectory


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


class TurnProtocol(Protocol):
    """What the model writes and what it is shown (LLM_API_MODE: protocols/xml_tags.py, protocols/chat.py)."""

    records_conversation: bool  # the episode keeps its messages (state.conversation) for the reward
    prompt_text: str  # the prompt the episode conditions on
    messages: list[dict] | None  # the prompt as chat messages (None when the protocol has none)
    tool_schemas: list[dict] | None  # the tools the chat template shows (None likewise)
    sampling_params: dict  # slime's, plus what ends this protocol's turns
    cut_at_stops: tuple[str, ...]  # stop strings after which a turn is cut (for engines that run past them)

    def __init__(self, state: "EpisodeState", sampling_params: dict): ...

    def read(self, turn: "Turn", state: "EpisodeState") -> "Action":
        """What the model did in `turn`."""

    def reply(
        self,
        action: "Action",
        results: dict[str, str],
        turn: "Turn",
        state: "EpisodeState",
        force_answer: bool = False,
    ) -> "Reply":
        """What the model is shown next: the results of its calls (by call id), or what was wrong; with
        `force_answer` (force_answer=inject), followed by the protocol's instruction to answer now."""


PROTOCOLS = Registry(
    "protocol",
    "llm_api_mode",
    {
        "generate": "slime_search_r1.protocols.xml_tags:XmlProtocol",  # Search-R1's XML tags over /generate
        "chat": "slime_search_r1.protocols.chat:ChatProtocol",  # OpenAI tool calls through the chat template
    },
)


class TokenDriver(Protocol):
    """Where a turn's tokens come from (TOKEN_TRACKING_MODE: tokens/manual.py, tokens/legacy_router.py)."""

    context_length: int
    response_length: int
    trajectory: "Trajectory"  # what the driver writes the sample's response through
    resumable: bool  # a partial rollout's aborted episode can continue from its trajectory (written_turn, below)

    @classmethod
    async def prepare(cls, state: "EpisodeState") -> None:
        """Checks that can fail before the sample is touched (the router's endpoints)."""

    def __init__(self, state: "EpisodeState", trajectory: "Trajectory", protocol: TurnProtocol): ...

    async def generate(self, sampling_params: dict) -> "Turn":
        """The turn under way (after what it sampled before an abort, if anything)."""

    def written_turn(self) -> "Turn":
        """The turn under way as the trajectory holds it (a resumed episode reads it again)."""

    def add_observation(self, ids: list[int], short_ids: list[int] | None = None) -> None:
        """The environment's reply follows the turn; `short_ids` (split_trajectories, manual only): what contexts
        show in its place once a later turn has read it."""

    async def finish(self, status: "Sample.Status") -> None:
        """The trajectory is complete (a router driver fetches it now)."""


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
