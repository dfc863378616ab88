"""Running run_qwen2.5_3B.sh's launcher in the tests: through the script (a subprocess), or in this process with the
script's own flag arrays (fast), and reading what a dry run prints."""

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from slime_search_r1.launch.command import SCRIPT_PATHS
from slime_search_r1.settings.table import SETTINGS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "run_qwen2.5_3B.sh"


def clean_env(**overrides) -> dict[str, str]:
    """The caller's environment without any variable the launch reads, plus `overrides`."""
    variables = {s.env for s in SETTINGS.values() if s.env}
    drop = variables | set(SCRIPT_PATHS) | {"WANDB_KEY", "WANDB_API_KEY", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(overrides)
    return env


@dataclass
class DryRun:
    stdout: str
    stderr: str

    def __post_init__(self):
        lines = self.stdout.splitlines()
        start = lines.index("# Ray runtime env (written to a private file at run time; secrets shown as <hidden>):")
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("# Ray head"))
        self.runtime_env = json.loads("\n".join(lines[start + 1 : end]))["env_vars"]
        self.head = shlex.split(lines[end + 1])
        job = lines.index("# training job:")
        self.submit = shlex.split(lines[job + 1])
        self.after = lines[job + 2 :]  # the viewer and checkpoint commands
        self.entry = self.submit[self.submit.index("--") + 1 :][:2]
        self.train_args = self.submit[self.submit.index("--") + 3 :]
        self.sources = {}  # "llm_api_mode", "NUM_GPUS" or "HF_CHECKPOINT" -> (value as printed, where it came from)
        for line in lines[:start]:
            if line.startswith("#   "):
                left, source = line[4:].rsplit("  <- ", 1)
                name, value = left.rstrip().split("=", 1)
                self.sources[name.strip()] = (value.strip(), source)

    def has(self, flag: str) -> bool:
        return flag in self.train_args

    def value(self, flag: str) -> str:
        """The value slime's parser keeps: the last one."""
        assert flag in self.train_args, f"{flag} is not in the command"
        return self.train_args[len(self.train_args) - 1 - self.train_args[::-1].index(flag) + 1]


@functools.cache
def script_argv(script: Path = SCRIPT) -> tuple[str, ...]:
    """What the script hands to python -m slime_search_r1.launch (PLUGIN, --, then its flag arrays), read with a
    PYTHON_BIN that prints its arguments."""
    shim = Path(tempfile.mkdtemp()) / "print_argv"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@"\n')
    shim.chmod(0o755)
    result = subprocess.run(["bash", str(script)], env=clean_env(PYTHON_BIN=str(shim)), capture_output=True,
                            text=True, check=True)  # fmt: skip
    argv = json.loads(result.stdout)
    assert argv[:2] == ["-m", "slime_search_r1.launch"], argv
    return tuple(argv[2:])


def dry_run_here(monkeypatch, capsys, *args: str, **env) -> DryRun:
    """A dry run of the script's flags in this process (python -m slime_search_r1.launch's main), with `args`
    as the script's own arguments and `env` as the whole environment."""
    code, stdout, stderr = launch_here(monkeypatch, capsys, "--dry-run", *args, **env)
    assert code == 0, stderr
    return DryRun(stdout, stderr)


def launch_here(monkeypatch, capsys, *args: str, **env) -> tuple[int, str, str]:
    """python -m slime_search_r1.launch's main in this process: its exit code, stdout and stderr."""
    from slime_search_r1.launch.__main__ import main

    environment = clean_env(**env)
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    plugin, *rest = script_argv()
    split = rest.index("--")
    capsys.readouterr()
    code = main([plugin, *rest[:split], *args, *rest[split:]])
    out = capsys.readouterr()
    return code, out.out, out.err


def run_script(*args: str, script: Path = SCRIPT, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=clean_env(**env), capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def dry_run_script(*args: str, script: Path = SCRIPT, **env) -> DryRun:
    result = run_script("--dry-run", *args, script=script, **env)
    assert result.returncode == 0, result.stderr
    return DryRun(result.stdout, result.stderr)


def every_flag_run(**env) -> DryRun:
    """A launch command with every optional group switched on: the script's commented flags, uncommented."""
    lines = re.findall(r"^\s+# (--[a-z][^#\n]*)", SCRIPT.read_text(), re.M)  # in the arrays, indented
    optional = [word for line in lines for word in shlex.split(line)]
    return dry_run_script(*optional, **env)


def edited_copy(folder: Path, entries: str) -> Path:
    """A copy of the plugin's folder (links, but its own generate_with_search.py, whose SEARCH_R1_CONFIGS holds
    `entries`, as a user edits it); returns the folder."""
    folder.mkdir(exist_ok=True)
    for path in REPO.iterdir():
        if path.name not in ("generate_with_search.py", ".git", ".venv") and not (folder / path.name).exists():
            (folder / path.name).symlink_to(path)
    source = (REPO / "generate_with_search.py").read_text()
    opening = "SEARCH_R1_CONFIGS = search_r1_configs(\n    {\n"
    assert opening in source
    (folder / "generate_with_search.py").write_text(source.replace(opening, opening + entries))
    return folder
