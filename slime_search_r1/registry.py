"""The plugin's seams, open by name: how the model talks (protocols), where a turn's tokens come from (token
drivers), what it may call (tools) and what answers a search (search backends).

Each seam is a Registry: a setting names an entry, and a new entry is one `register()` call in a file of your own,
imported through the `extensions` setting (SEARCH_R1_EXTENSIONS=my_module), so that generate() and the launch
check see it alike. Built-in entries are registered by their "module:attribute" path and imported on first use:
naming or checking a setting never imports an implementation (or slime).

    from slime_search_r1.registry import SEARCH_BACKENDS
    SEARCH_BACKENDS.register("bing", bing_search)          # then SEARCH_BACKEND=bing
"""

import importlib
from typing import Any


class Registry:
    """Named implementations of one seam; an entry is the object itself or its "module:attribute" path."""

    def __init__(self, seam: str, setting: str, builtins: dict[str, str]):
        self.seam = seam  # what an entry is, for messages ("search backend")
        self.setting = setting  # the setting that names entries ("search_backend")
        self._entries: dict[str, Any] = dict(builtins)

    def register(self, name: str, entry: Any, *, replace: bool = False) -> None:
        """Make `entry` (an object or a "module:attribute" path) available as `name`."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"a {self.seam} needs a non-empty name without surrounding spaces, got {name!r}")
        if name in self._entries and not replace:
            raise ValueError(f"a {self.seam} named {name!r} is registered already (pass replace=True to replace it)")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        del self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> Any:
        """The entry, imported on first use; KeyError names the registered ones."""
        if name not in self._entries:
            raise KeyError(f"no {self.seam} named {name!r}; registered: {', '.join(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry


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
        "manual": "slime_search_r1.tokens.manual:ManualDriver",
        "router_radix": "slime_search_r1.tokens.legacy_router:RouterRadixDriver",
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
        "local": "slime_search_r1.search.local:search",  # local_dense_retriever/ (or Search-R1's server)
        "google": "slime_search_r1.search.google:search",  # serper.dev
    },
)
