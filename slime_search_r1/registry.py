"""The plugin's seams, open by name: how the model talks (protocols), where a turn's tokens come from (token
drivers), what it may call (tools) and what answers a search (search backends).

A setting names an entry of a seam. The built-in entries are only named here; their objects are imported where they
are used (loop.py: protocols, token drivers and tools; tools/search.py: search backends), so that naming or checking
a setting imports no implementation (or slime). A new entry is one `register()` call in a file of your own, imported
through the `extensions` setting (SEARCH_R1_EXTENSIONS=my_module), so that generate() and the launch check see it
alike:

    from slime_search_r1.registry import SEARCH_BACKENDS
    SEARCH_BACKENDS.register("bing", bing_search)          # then SEARCH_BACKEND=bing
"""

from collections.abc import Mapping
from typing import Any, TypeVar

Entry = TypeVar("Entry")


class Registry:
    """The names one seam answers to: its built-ins (named here, their objects imported by the code that uses them)
    and the entries registered by name (an extension's, or one that replaces a built-in)."""

    def __init__(self, seam: str, setting: str, builtins: tuple[str, ...]):
        self.seam = seam  # what an entry is, for messages ("search backend")
        self.setting = setting  # the setting that names entries ("search_backend")
        self.builtins = builtins
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

    def get(self, name: str, builtins: Mapping[str, Entry]) -> Entry:
        """The entry registered as `name`, else the built-in of that name from `builtins` (the caller's imports);
        KeyError names the registered ones."""
        if name in self._entries:
            return self._entries[name]
        if name not in self.builtins:
            raise KeyError(f"no {self.seam} named {name!r}; registered: {', '.join(self.names())}")
        return builtins[name]


# The built-ins of each seam, by name: loop.py and tools/search.py hold their objects under the same names.
PROTOCOLS = Registry(
    "protocol",
    "llm_api_mode",
    ("generate", "chat"),  # Search-R1's XML tags over /generate; OpenAI tool calls through the chat template
)
TOKEN_DRIVERS = Registry("token-tracking mode", "token_tracking_mode", ("manual", "router_radix", "router_handler"))
TOOLS = Registry(
    "tool",
    "tools",
    ("search", "access"),  # Search-R1's <search> query </search>; ASearcher's <access> URL </access> (off by default)
)
SEARCH_BACKENDS = Registry(
    "search backend",
    "search_backend",
    ("local", "google"),  # local_dense_retriever/ (or Search-R1's server); serper.dev
)
