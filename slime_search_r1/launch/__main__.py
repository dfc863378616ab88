"""python -m slime_search_r1.launch PLUGIN [--dry-run] [--help] [--list] [train.py flags] -- <the script's slime flags>
python -m slime_search_r1.launch --list                 # every setting: key, variable, default, accepted, who reads it

What run_qwen2.5_3B.sh calls once its flag arrays are written: resolve every value (command.py), check it (with the
memory plan of a retrieval server sharing the node: retriever_memory.py), then print the commands (a dry run,
printed.py) or run them (ray_job.py). Errors and warnings go to stderr, one line each, naming the setting or flag; a
missing path is a warning in a dry run and an error in a real run. With SEARCH_R1_DESCRIBE_TRAINING=FILE it only
writes train.py's flags and what they hold on each GPU to FILE (for the tmux wrapper) and exits.
"""

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from slime_search_r1.launch import printed, ray_job
from slime_search_r1.launch.checks import PLUGIN, configs_from_source
from slime_search_r1.launch.command import Launch, missing_paths, resolve_launch
from slime_search_r1.launch.retriever_memory import declared_training
from slime_search_r1.settings.kinds import ConfigError
from slime_search_r1.settings.sources import search_r1_configs
from slime_search_r1.settings.table import DESCRIBE_VARIABLE, listing

USAGE = """usage: bash run_qwen2.5_3B.sh [--dry-run | --help | --list] [more train.py flags: the last of a flag wins]

The slime flags are the script's arrays (optional ones commented, as in slime's examples). --dry-run checks every
value and flag as generate() would at its first sample, prints each value with where it came from, then the commands
instead of running them; every flag is read by slime's own parser when slime is importable. MODEL=qwen3-4b (or
another family --list names) trains that model: slime's scripts/models file, its checkpoints, its template kwargs.
The settings (the plugin's: SEARCH_R1_CONFIGS in generate_with_search.py or their environment variables; the launch
scripts': environment variables) are listed by --list, or by python -m slime_search_r1.launch --list.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--list"]:
        return list_settings(PLUGIN)
    plugin, rest = Path(argv[0]), argv[1:]
    split = len(rest) - rest[::-1].index("--") - 1 if "--" in rest else len(rest)  # the script's flags come last
    user_args, script_args = rest[:split], rest[split + 1 :]
    if {"-h", "--help"} & set(user_args):
        print(USAGE, end="")
        return 0
    if "--list" in user_args:
        return list_settings(plugin)
    dry_run = "--dry-run" in user_args
    user_args = [arg for arg in user_args if arg != "--dry-run"]
    describe_to = os.environ.get(DESCRIBE_VARIABLE)
    try:
        launch = resolve_launch(plugin, script_args, user_args, os.environ, dry_run or bool(describe_to))
        if describe_to:  # the tmux wrapper asks what training holds on the GPUs, before anything starts
            Path(describe_to).write_text(json.dumps(describe(launch)))
            return 0
        missing = missing_paths(launch)
        if len(missing) == 1 and not dry_run:
            raise ConfigError(f"{missing[0]} (set the variable or flag that names it: see --list)")
        if missing and not dry_run:
            raise ConfigError(f"{len(missing)} paths are missing (set the variable or flag that names each: see "
                              "--list):\n  - " + "\n  - ".join(missing))  # fmt: skip
        for warning in [*launch.warnings, *missing]:
            print(f"{ray_job.PROG}: warning: {warning}", file=sys.stderr)
        if dry_run:
            sys.stdout.write(printed.dry_run(launch))
            return 0
        for line in launch.memory.lines if launch.memory else []:
            ray_job.info(line)
        return ray_job.run(launch)
    except (ConfigError, OSError, SyntaxError) as exc:
        print(f"{ray_job.PROG}: error: {exc}", file=sys.stderr)
        return 1


def list_settings(plugin: Path) -> int:
    """Every setting, the ones the extensions named by `plugin` (or SEARCH_R1_EXTENSIONS) declare included."""
    try:
        search_r1_configs(configs_from_source(plugin), os.environ)
    except (ConfigError, OSError, SyntaxError) as exc:
        print(f"{ray_job.PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(listing())
    return 0


def describe(launch: Launch) -> dict:
    """What the wrapper reads (DESCRIBE_VARIABLE): train.py's flags and what they hold on each GPU."""
    return {"train_args": launch.train_args, "training": asdict(declared_training(launch.flags))}


if __name__ == "__main__":
    sys.exit(main())
