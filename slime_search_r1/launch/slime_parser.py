"""train.py's flags read by slime's own parser before any GPU is spent, so a mistyped flag stops the launch.

slime's parse_args (slime/utils/arguments.py) reads the command in two parsers: SGLang's (slime's
add_sglang_arguments: SGLang's ServerArgs behind --sglang-, sglang_router's RouterArgs behind --router-) and
Megatron's parse_args with slime's own flags added by get_slime_extra_args_provider(). Megatron's is called with
ignore_unknown_args=True, so slime itself trains past a mistyped flag at its default without a word. Here the same
parts are built from slime's own functions, from SLIME_DIR (else an installed slime) and MEGATRON_PATH, and nothing
is parsed from sys.argv, validated or initialised: Megatron's parse_args is stopped inside the provider slime hands
it, once the flags are added. Every flag of the command must be one of theirs, with a value of their type.

A part that cannot be built is named with the reason, and the flags that could be its own are listed as not
checked; one of them within a letter or two of a known flag still stops the launch (a typo, not a flag of the
missing part). Without slime at all only the flags the launch reads itself are known; one the user appends within a
letter or two of one of them, or of the rest of the command, stops the launch as a typo.
"""

import argparse
import contextlib
import difflib
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from slime_search_r1.settings.kinds import ConfigError

# Packages slime's argument modules import at the top that declare no flag of slime's own: an empty module stands in
# for one that is missing, and the part of the parser it declares (None: no flags) is reported as not built.
SGLANG, MEGATRON = "SGLang", "Megatron"  # the parts of slime's parser besides slime's own flags
STAND_INS = {"sglang": SGLANG, "sglang_router": SGLANG, "wandb": None, "ray": None}
SGLANG_PREFIXES = ("--sglang-", "--router-")
# Above this similarity (difflib's ratio, without the leading "--") an unchecked flag is taken for a typo of a known
# one: one letter dropped or doubled in a flag of ten or more letters.
TYPO_RATIO = 0.9
_STOOD_IN: dict[str, set[str]] = {}  # a module imported with stand-ins -> the packages stood in


class _Built(Exception):
    """Raised by the provider given to Megatron's parse_args once the parser is complete: nothing is parsed."""


@dataclass
class SlimeParser:
    parsers: list[argparse.ArgumentParser]  # slime's (with Megatron's when built) and SGLang's when built
    source: str  # where slime was imported from
    missing: dict[str, str] = field(default_factory=dict)  # a part not built -> why

    def known(self) -> set[str]:
        return {flag for parser in self.parsers for flag in parser._option_string_actions if flag.startswith("--")}


@contextlib.contextmanager
def _on_path(*folders: str) -> Iterator[None]:
    saved = list(sys.path)
    sys.path[:0] = [folder for folder in folders if folder and Path(folder).is_dir()]
    try:
        yield
    finally:
        sys.path[:] = saved


def _import_with_stand_ins(name: str) -> tuple[types.ModuleType, set[str]]:
    """Import `name`, an empty module standing in for each missing package of STAND_INS (taken out of sys.modules
    again afterwards, so nothing else mistakes it for the package); returns the module and the packages stood in
    (remembered for a module imported before)."""
    if name in sys.modules:
        return sys.modules[name], _STOOD_IN.get(name, set())
    added: list[str] = []
    try:
        while True:
            try:
                module = __import__(name, fromlist=["_"])
                _STOOD_IN[name] = {package.split(".")[0] for package in added}
                return module, _STOOD_IN[name]
            except ModuleNotFoundError as exc:
                if not exc.name or exc.name.split(".")[0] not in STAND_INS or exc.name in sys.modules:
                    raise
                module = types.ModuleType(exc.name)
                module.__path__ = []  # a package, so its submodules can stand in too
                module.__getattr__ = lambda attr, package=exc.name: _placeholder(package, attr)
                sys.modules[exc.name] = module
                added.append(exc.name)
    finally:
        for package in added:
            sys.modules.pop(package, None)


def _placeholder(package: str, attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return type(attr, (), {"__module__": package})


def is_checkout(slime_dir: str) -> bool:
    return (Path(slime_dir) / "slime" / "utils" / "arguments.py").is_file()


def build(slime_dir: str, megatron_path: str) -> SlimeParser | str:
    """slime's parser, as complete as what is importable allows; a string says why slime's own could not be built."""
    # Megatron and SGLang may print while they import: to stderr, so a dry run's stdout stays the commands
    with _on_path(slime_dir if is_checkout(slime_dir) else "", megatron_path), contextlib.redirect_stdout(sys.stderr):
        try:
            arguments, stood_in = _import_with_stand_ins("slime.utils.arguments")
            provider = arguments.get_slime_extra_args_provider()
        except Exception as exc:  # any import failure of slime's module: the launch goes on with its own list
            return f"{type(exc).__name__}: {exc}"
        parts: dict[str, list[str]] = {}
        for package in sorted(stood_in):
            if STAND_INS[package]:
                parts.setdefault(STAND_INS[package], []).append(package)
        missing = {part: f"{' and '.join(packages)} not importable" for part, packages in parts.items()}
        source = str(Path(arguments.__file__).parents[2])
        main = _with_megatron(provider, missing)
        parsers = [main]
        if SGLANG not in missing:
            sglang = _parser()
            try:
                sys.modules["slime.backends.sglang_utils.arguments"].add_sglang_arguments(sglang)
                parsers.append(sglang)
            except Exception as exc:
                missing[SGLANG] = f"{type(exc).__name__}: {exc}"
        pre_parse = getattr(arguments, "_pre_parse_mode", None)  # the flags slime reads before its two parsers
        if pre_parse:
            early = _parser()
            saved, sys.argv = sys.argv, sys.argv[:1]
            try:
                for dest in vars(pre_parse()):
                    early.add_argument("--" + dest.replace("_", "-"), nargs="?")
            finally:
                sys.argv = saved
            parsers.append(early)
    return SlimeParser(parsers, source, missing)


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)


def _with_megatron(provider, missing: dict[str, str]) -> argparse.ArgumentParser:
    """Megatron's parser with slime's flags added, as slime's megatron_parse_args builds it; slime's alone (and
    Megatron named in `missing`) when megatron.training.arguments cannot be imported."""
    built: list[argparse.ArgumentParser] = []

    def capture(parser):
        built.append(provider(parser))
        raise _Built

    try:
        from megatron.training.arguments import parse_args

        parse_args(extra_args_provider=capture, ignore_unknown_args=True)
    except _Built:
        return built[0]
    except Exception as exc:
        missing[MEGATRON] = f"{type(exc).__name__}: {exc}"
        return provider(_parser())
    missing[MEGATRON] = "megatron.training.arguments.parse_args never called its extra_args_provider"
    return provider(_parser())


def flags_of(args: Iterable[str]) -> list[str]:
    """The flags of a command line (--name or --name=value), in order, each once."""
    return list(dict.fromkeys(arg.split("=", 1)[0] for arg in args if arg.startswith("--") and len(arg) > 2))


def closest(flag: str, known: Iterable[str], cutoff: float) -> str | None:
    names = {name[2:]: name for name in known}
    match = difflib.get_close_matches(flag[2:], names, n=1, cutoff=cutoff)
    return names[match[0]] if match else None


def _refuse(message: str):
    raise ConfigError(f"train.py's flags: {message}")


def check_command(train_args: list[str], user_args: list[str], slime: SlimeParser | str, launch_flags: set[str],
                  slime_dir: str) -> list[str]:  # fmt: skip
    """Every flag of train.py's command known to a part of slime's parser that was built, with a value of its type;
    a flag a part that was not built might hold is not checked, unless it is within a letter or two of a known flag
    (of slime's parser or the launch's; for a flag the user appended, of the rest of the command too): a typo.
    `slime` is the parser, or why it could not be built. Returns the warning naming what was not checked; raises
    ConfigError on an unknown flag (with the closest known one) or a bad value."""
    if isinstance(slime, SlimeParser):
        for parser in slime.parsers:
            parser.error = _refuse  # argparse's error() prints the usage and exits; here it is one line
            try:
                parser.parse_known_args(train_args)
            except argparse.ArgumentError as exc:
                _refuse(str(exc))
        exact, missing = slime.known(), slime.missing
        where = f"slime's own parser, slime from {slime.source}"
    else:
        exact, missing = set(), {"slime": slime}
        where = f"slime is not importable from SLIME_DIR={slime_dir} ({slime})"
    hint = ("run the launch with a Python that has slime's packages (PYTHON_BIN)" if is_checkout(slime_dir) else
            "set SLIME_DIR to a slime checkout to check every flag with slime's own parser")  # fmt: skip
    command = set(flags_of(train_args[: len(train_args) - len(user_args)]))
    refused, unchecked = [], []
    for flag in flags_of(train_args):
        if flag in exact or (not exact and flag in launch_flags):
            continue
        owner = "slime" if not exact else SGLANG if flag.startswith(SGLANG_PREFIXES) else MEGATRON
        if owner not in missing:  # the part that would hold it was built: unknown to slime's train.py
            match = closest(flag, exact, 0.6)
            refused.append(flag + (f" (did you mean {match}?)" if match else ""))
            continue
        pool = exact | launch_flags | (command if flag not in command else set())
        match = closest(flag, pool - {flag}, TYPO_RATIO)
        (refused if match else unchecked).append(f"{flag} (did you mean {match}?)" if match else flag)
    built = " or ".join(["slime", *(part for part in (SGLANG, MEGATRON) if part not in missing)])
    if refused and exact:
        _refuse(f"{', '.join(refused)}: not a flag of {built} ({where}); slime's train.py ignores a flag it does "
                "not know and trains at the default")  # fmt: skip
    if refused:
        _refuse(f"{', '.join(refused)}: not a flag the launch knows, and that close to one is a typo; {where}: "
                f"{hint}")  # fmt: skip
    if not unchecked:
        return []
    why = "; ".join(f"{part} not built ({reason})" for part, reason in missing.items()) if exact else where
    known = "slime's own parser checked the rest" if exact else "only the launch's own flags are known"
    return [f"train.py's flags: {why}: {known}, so these are not checked: {', '.join(unchecked)} ({hint})"]
