"""What a setting accepts. Each kind checks a value written in SEARCH_R1_CONFIGS (check) and reads one from an
environment variable (from_env); both raise Refused, which says what is accepted, and the caller turns it into a
ConfigError that also says where the value came from."""

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting that cannot work; the message says where it came from, its value and what is accepted."""


class Refused(ValueError):
    """A value a kind does not accept: `problem` ("invalid", "out of range") and what is accepted."""

    def __init__(self, accepted: str, problem: str = "invalid"):
        super().__init__(f"{problem}; accepted: {accepted}")
        self.accepted, self.problem = accepted, problem


def _bounds(low, high, optional: bool) -> str:
    bounds = f">= {low}" if high is None else f"{low} to {high}"
    return f"{bounds}, or None" if optional else bounds


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...] | Callable[[], tuple[str, ...]]  # a callable: the names a registry holds now

    def names(self) -> tuple[str, ...]:
        return self.options() if callable(self.options) else self.options

    def accepted(self) -> str:
        return " | ".join(self.names())

    def check(self, value: Any) -> str:
        if value not in self.names():
            raise Refused(self.accepted())
        return value

    def from_env(self, text: str) -> str:
        wanted = text.strip().lower()  # choices are case-insensitive in the environment
        return self.check(next((name for name in self.names() if name.lower() == wanted), text))


@dataclass(frozen=True)
class Flag:
    def accepted(self) -> str:
        return "true or false"

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

    def accepted(self) -> str:
        return f"integer, {_bounds(self.low, self.high, self.optional)}"

    def check(self, value: Any) -> int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(f"an {self.accepted()}")
        if value < self.low or (self.high is not None and value > self.high):
            raise Refused(_bounds(self.low, self.high, self.optional), "out of range")
        return value

    def from_env(self, text: str) -> int | None:
        if self.optional and text.strip().lower() == "none":
            return None
        try:
            value = int(text.strip())
        except ValueError:
            raise Refused(f"an {self.accepted()}") from None
        return self.check(value)


@dataclass(frozen=True)
class Number:
    low: float
    high: float | None = None
    optional: bool = False  # None allowed: the setting's default is derived from other settings

    def accepted(self) -> str:
        return f"number, {_bounds(self.low, self.high, self.optional)}"

    def check(self, value: Any) -> float | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refused(f"a {self.accepted()}")
        if not self.low <= value <= (self.high if self.high is not None else float("inf")):  # also refuses nan
            raise Refused(_bounds(self.low, self.high, self.optional), "out of range")
        return float(value)

    def from_env(self, text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise Refused(f"a {self.accepted()}") from None
        return self.check(value)


@dataclass(frozen=True)
class Text:
    optional: bool = False  # None (or "") allowed

    def accepted(self) -> str:
        return "a non-empty string, or None" if self.optional else "a non-empty string"

    def check(self, value: Any) -> str | None:
        if self.optional and (value is None or value == ""):
            return None
        if not isinstance(value, str) or not value.strip():
            raise Refused(self.accepted())
        return value.strip()

    def from_env(self, text: str) -> str | None:
        return self.check(text)


@dataclass(frozen=True)
class ShellWords:
    """Command-line flags in one string, split as a shell would (quotes hold a value with spaces); unset is None."""

    def accepted(self) -> str:
        return "flags as a shell splits them"

    def check(self, value: Any) -> str | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        try:
            shlex.split(value)
        except (ValueError, AttributeError) as exc:
            raise Refused(f"{self.accepted()} ({exc})") from None
        return value.strip()

    def from_env(self, text: str) -> str | None:
        return self.check(text)


@dataclass(frozen=True)
class Urls:
    """One or more http(s) URLs (a list, or comma-separated); a bare http://host:port gets `path`."""

    path: str

    def accepted(self) -> str:
        return f"http://host:port[{self.path}], several as a list or separated by commas"

    def check(self, value: Any) -> tuple[str, ...]:
        parts = value.split(",") if isinstance(value, str) else value
        if not isinstance(parts, list | tuple) or not all(isinstance(part, str) for part in parts):
            raise Refused(self.accepted())
        urls = []
        for part in (p.strip() for p in parts):
            if not part:
                continue
            split = urlsplit(part)
            if split.scheme not in ("http", "https") or not split.netloc:
                raise Refused(f"{self.accepted()} ({part!r} is not an http(s) URL)")
            urls.append(part.rstrip("/") + self.path if split.path in ("", "/") else part)
        if not urls:
            raise Refused(self.accepted())
        return tuple(urls)

    def from_env(self, text: str) -> tuple[str, ...]:
        return self.check(text)


@dataclass(frozen=True)
class Names:
    """A list of names (comma-separated in the environment), each one of `options`, none twice."""

    options: tuple[str, ...] | Callable[[], tuple[str, ...]] | None  # None: any Python module name
    at_least: int = 0

    def accepted(self) -> str:
        names = self.options() if callable(self.options) else self.options
        what = "Python module names" if names is None else f"names from {', '.join(names)}"
        return f"a list of {what}" + (f", at least {self.at_least}" if self.at_least else "")

    def check(self, value: Any) -> list[str]:
        names = self.options() if callable(self.options) else self.options
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            raise Refused(self.accepted())
        items = [item.strip() for item in value]
        unknown = [item for item in items if (item not in names if names is not None else not _is_module(item))]
        if unknown or len(items) < self.at_least or len(set(items)) < len(items):
            unknown_names = f" ({', '.join(map(repr, unknown))} unknown)" if unknown else ""
            raise Refused(f"{self.accepted()}, each once{unknown_names}")
        return items

    def from_env(self, text: str) -> list[str]:
        return self.check([part for part in text.split(",") if part.strip()])


def _is_module(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name))


@dataclass(frozen=True)
class IdList:
    """A list of CPU or GPU ids as taskset -c takes CPUs (0-7, 0,2,4-6)."""

    what: str = "a CPU list for taskset -c"

    def accepted(self) -> str:
        return f"{self.what} like 0-7 or 0,2,4-6"

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", value.strip()):
            raise Refused(self.accepted())
        return value.strip()

    def from_env(self, text: str) -> str:
        return self.check(text)


def expand_ids(text: str) -> list[int]:
    """0,2,4-6 -> [0, 2, 4, 5, 6] (an IdList's value)."""
    ids = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids += [i for i in range(int(low), int(high or low) + 1) if i not in ids]
    return ids
