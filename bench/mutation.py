"""Mutation score of the modules that decide what is trained and what a client gets: mutmut changes one
operator, constant or call at a time in the reward, the loop and its budget, token tracking, group advantages, the
settings, the retriever's batcher and the /retrieve and /access bodies, and runs only the test files that cover
that module (and, inside them, only the tests that reach the changed function). A mutant that no test notices is a
bug the suite would let through, unless it changes no behaviour: those are listed, each with why, in
bench/mutation_equivalents.toml and left out of the score.

    python bench/mutation.py                     # every target; writes `## Mutation score` in bench/RESULTS.md
    python bench/mutation.py --targets advantages,settings --no_write

Not part of the test suite (`make mutation`). Each target runs in its own copy of the working tree in the system's
temporary directory (mutmut writes its mutated copy, mutants/, there), so the repository is left alone except for
RESULTS.md. Killed counts mutants a test failed on or that ran past mutmut's time limit (an endless loop); survived
counts mutants every covering test passed with, and those in a function none of the chosen tests reaches.
Target: >= 90% of the non-equivalent mutants killed on every target.
"""

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import results_md  # noqa: E402

EQUIVALENTS = REPO / "bench" / "mutation_equivalents.toml"
# Each target's last result (its mutants, which run measured it), so a run of some targets keeps the others' rows.
RECORD = REPO / "bench" / "mutation_results.json"
TITLE = "Mutation score"
TARGET_SCORE = 0.90
# mutmut's exit codes (mutmut/stats.py): the worker's pytest exit code, or mutmut's own marks
KILLED_CODES = {1, 3}
TIMEOUT_CODES = {36, -24, 24, 152, 255}
SURVIVED_CODES = {0}
NO_TESTS_CODES = {5, 33}


# Lines left alone: what goes to the log changes neither what is trained nor what a client gets.
NOT_MUTATED = (r"^\s*(logger|logging)\.(debug|info|warning|error|exception)\(", r"^\s*_warn_once\(")


@dataclass(frozen=True)
class Target:
    name: str
    what: str  # what a user relies on it for
    files: tuple[str, ...]  # the modules mutated
    tests: tuple[str, ...]  # the test files that cover them (pytest arguments: files, node ids, -k)
    only: tuple[str, ...] = ()  # mutant-name globs, where a file holds more than this target's code
    # mutmut stops a mutant's tests after (their measured seconds + 1) x this (its default, 15, makes each mutant
    # that hangs a test cost ~20 s); lower it only where the tests are in-process and fail fast on their own, and
    # keep a margin for a correct run under load, so that slowness alone is never counted as a kill
    timeout_multiplier: float = 15.0


TARGETS = (
    Target(
        "reward",
        "EM with Search-R1's format rules, chat conversations, the normalisation, the answer score, reward_func",
        (
            "qa_em_format.py",
            "slime_search_r1/protocols/chat_reward.py",
            "slime_search_r1/scoring/answers.py",
            "slime_search_r1/scoring/rewards.py",
            "generate_with_search.py",
        ),
        ("tests/training/test_reward_table.py", "tests/training/test_rewards.py", "tests/evaluation/test_scores.py"),
        only=(
            "qa_em_format.*",
            "slime_search_r1.protocols.chat_reward.*",
            "slime_search_r1.scoring.answers.*",
            "slime_search_r1.scoring.rewards.*",
            "generate_with_search.x_reward_func__mutmut_*",
        ),
    ),
    Target(
        "loop",
        "the episode loop and its budget: when an episode ends and how long its response is",
        ("slime_search_r1/loop.py",),
        ("tests/rollout/test_loop_units.py",),
    ),
    Target(
        "tokens",
        "token tracking: the trajectory, loss mask and log probs written turn by turn, where turns end, resumed "
        "turns, the engine's answers read, the lengths it accepts",
        (
            "slime_search_r1/tokens/manual.py",
            "slime_search_r1/tokens/engine.py",
            "slime_search_r1/tokens/engine_rules.py",
        ),
        (
            "tests/rollout/test_token_trajectory.py",
            "tests/rollout/test_turn_end.py",
            "tests/rollout/test_engine_call.py",
            "tests/rollout/test_engine_limits.py",
        ),
    ),
    Target(
        "router-tokens",
        "the old slime router's token cache (TOKEN_TRACKING_MODE=router_radix, router_handler)",
        ("slime_search_r1/tokens/legacy_router.py",),
        ("tests/rollout/test_router_tracking.py",),
    ),
    Target(
        "advantages",
        "group-normalised rewards with removed samples left out",
        ("slime_search_r1/training/advantages.py",),
        ("tests/training/test_group_advantages.py",),
    ),
    Target(
        "settings",
        "SEARCH_R1_CONFIGS, its environment variables, their precedence and checks",
        (
            "slime_search_r1/settings/kinds.py",
            "slime_search_r1/settings/table.py",
            "slime_search_r1/settings/sources.py",
            "slime_search_r1/settings/rules.py",
            "slime_search_r1/settings/view.py",
        ),
        ("tests/launch/test_settings.py", "tests/launch/test_setting_kinds.py"),
    ),
    Target(
        "batcher",
        "the retriever's dynamic batcher: which queries share a batch, who waits, errors and shutdown",
        ("local_dense_retriever/serving/batcher.py", "local_dense_retriever/serving/batch_shares.py"),
        ("tests/retriever/test_retriever_batcher.py",),
        timeout_multiplier=6.0,
    ),
    Target(
        "bodies",
        "the /retrieve and /access request bodies: content type, size, deadline, validation and their answers",
        ("local_dense_retriever/serving/bodies.py", "local_dense_retriever/serving/api.py"),
        ("tests/retriever/test_retriever_bodies.py",),
        timeout_multiplier=6.0,
    ),
)


@dataclass
class Mutant:
    name: str  # mutmut's, e.g. slime_search_r1.settings.x_resolve_config__mutmut_3
    file: str
    status: str  # killed, timeout, survived, no tests
    diff: str = ""
    why_equivalent: str | None = None

    @property
    def function(self) -> str:
        return function_of(self.name)


@dataclass
class Outcome:
    target: Target
    mutants: list[Mutant] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    run: str = ""  # the UTC start of the run that measured it (a key of Record.runs)

    def count(self, *statuses: str) -> int:
        return sum(m.status in statuses and m.why_equivalent is None for m in self.mutants)

    @property
    def equivalent(self) -> int:
        return sum(m.why_equivalent is not None for m in self.mutants)

    @property
    def killed(self) -> int:
        return self.count("killed", "timeout")

    @property
    def survivors(self) -> list[Mutant]:
        return [m for m in self.mutants if m.status in ("survived", "no tests") and m.why_equivalent is None]

    @property
    def score(self) -> float:
        scored = self.killed + len(self.survivors)
        return self.killed / scored if scored else 1.0


def function_of(mutant_name: str) -> str:
    """`module.x_func__mutmut_3` -> `func`; `module.xǁClassǁmethod__mutmut_3` -> `Class.method`."""
    last = mutant_name.rsplit("__mutmut_", 1)[0]
    if "ǁ" in last:
        _, cls, method = last.split("ǁ")[-3:]
        return f"{cls}.{method}"
    return last.rsplit(".", 1)[-1].removeprefix("x_")


def changed_lines(diff: str) -> str:
    """The lines a mutant removes and adds (the signature equivalents are matched on: stable when lines move)."""
    lines = [
        line[0] + " " + line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return "\n".join(lines)


def load_equivalents(path: Path = EQUIVALENTS) -> list[dict]:
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text())["equivalent"]
    for entry in entries:
        missing = {"file", "function", "change", "why"} - entry.keys()
        if missing:
            raise SystemExit(f"{path.name}: an entry lacks {sorted(missing)}: {entry}")
    return entries


def equivalence_reason(mutant: Mutant, equivalents: list[dict]) -> str | None:
    signature = changed_lines(mutant.diff)
    for entry in equivalents:
        if (
            entry["file"] == mutant.file
            and entry["function"] == mutant.function
            and changed_lines(entry["change"]) == signature
        ):
            return entry["why"]
    return None


def working_tree_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [name for name in listed.split("\0") if name and (REPO / name).is_file() and name != ".venv"]


def prepare_copy(target: Target, workdir: Path) -> None:
    """A copy of the working tree with mutmut's configuration for this target appended to its pyproject.toml."""
    files = working_tree_files()
    for name in files:
        destination = workdir / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, destination)
    top_level = sorted({name.split("/", 1)[0] for name in files} - {"pyproject.toml"})
    config = {
        "source_paths": list(target.files),
        "also_copy": top_level,  # the whole tree goes into mutants/, where the tests import from
        "pytest_add_cli_args_test_selection": list(target.tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
        "do_not_mutate_patterns": list(NOT_MUTATED),
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {toml_list(value)}" for key, value in config.items()]
    lines.append(f"timeout_multiplier = {float(target.timeout_multiplier)!r}")
    with open(workdir / "pyproject.toml", "a") as out:
        out.write("\n".join(lines) + "\n")


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"' for value in values) + "]"


def status_of(code: int | None) -> str:
    if code in KILLED_CODES:
        return "killed"
    if code in TIMEOUT_CODES:
        return "timeout"
    if code in SURVIVED_CODES:
        return "survived"
    if code in NO_TESTS_CODES:
        return "no tests"
    return f"not run (exit code {code})"


def read_results(target: Target, workdir: Path) -> list[Mutant]:
    mutants = []
    for file in target.files:
        meta = json.loads((workdir / "mutants" / (file + ".meta")).read_text())
        for name, code in sorted(meta["exit_code_by_key"].items()):
            if target.only and not any(fnmatch.fnmatch(name, pattern) for pattern in target.only):
                continue
            mutants.append(Mutant(name=name, file=file, status=status_of(code)))
    return mutants


def mutmut(workdir: Path, *arguments: str, log=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mutmut", *arguments]
    return subprocess.run(
        command, cwd=workdir, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )


def run_target(target: Target, jobs: int, equivalents: list[dict], keep: bool) -> Outcome:
    outcome = Outcome(target)
    workdir = Path(tempfile.mkdtemp(prefix=f"search_r1_mutation_{target.name}_"))
    started = time.monotonic()
    try:
        prepare_copy(target, workdir)
        with open(workdir / "mutmut.log", "w") as log:
            done = mutmut(workdir, "run", "--max-children", str(jobs), *target.only, log=log)
        if done.returncode != 0:
            tail = (workdir / "mutmut.log").read_text()[-3000:]
            outcome.error = f"mutmut run exited {done.returncode}:\n{tail}"
            return outcome
        outcome.mutants = read_results(target, workdir)
        for mutant in outcome.mutants:
            if mutant.status in ("killed", "timeout"):
                continue
            mutant.diff = mutmut(workdir, "show", mutant.name).stdout
            mutant.why_equivalent = equivalence_reason(mutant, equivalents)
    finally:
        outcome.seconds = time.monotonic() - started
        if keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return outcome


@dataclass
class Run:
    jobs: int
    load: tuple[float, float]  # load average at the start and at the end
    minutes: float
    targets: list[str]

    def describe(self, started: str) -> str:
        return (
            f"{started}: {', '.join(self.targets)} with {self.jobs} worker(s), {self.minutes:.1f} minutes in all, "
            f"load average {self.load[0]:.1f} at the start and {self.load[1]:.1f} at the end on {os.cpu_count()} CPUs"
        )


def load_record(path: Path = RECORD) -> tuple[dict[str, Run], dict[str, Outcome]]:
    """The runs and each target's last outcome, as bench/mutation_results.json holds them (targets no longer in
    TARGETS are dropped)."""
    if not path.exists():
        return {}, {}
    data = json.loads(path.read_text())
    runs = {
        started: Run(run["jobs"], tuple(run["load"]), run["minutes"], run["targets"])
        for started, run in data["runs"].items()
    }
    by_name = {t.name: t for t in TARGETS}
    outcomes = {}
    for name, o in data["targets"].items():
        if name in by_name:  # killed mutants are kept as counts: only the others are listed
            killed = [Mutant("", "", status) for status, count in o["killed"].items() for _ in range(count)]
            mutants = killed + [Mutant(**m) for m in o["not_killed"]]
            outcomes[name] = Outcome(by_name[name], mutants, o["seconds"], o["error"], o["run"])
    return runs, outcomes


def save_record(runs: dict[str, Run], outcomes: dict[str, Outcome], path: Path = RECORD) -> None:
    used = {o.run for o in outcomes.values()}
    data = {
        "runs": {started: asdict(run) for started, run in sorted(runs.items()) if started in used},
        "targets": {
            name: {
                "run": o.run,
                "seconds": round(o.seconds, 1),
                "error": o.error,
                "killed": {status: sum(m.status == status for m in o.mutants) for status in ("killed", "timeout")},
                # equivalence is decided again from the toml when rendering
                "not_killed": [
                    {**asdict(m), "why_equivalent": None} for m in o.mutants if m.status not in ("killed", "timeout")
                ],
            }
            for name, o in outcomes.items()
        },
    }
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def render(outcomes: list[Outcome], runs: dict[str, Run]) -> str:
    rows = [
        "| target | modules | test files | mutants | killed | survived | equivalent | score | minutes | run |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    killed = scored = 0
    for o in outcomes:
        modules = "<br>".join(o.target.files)
        tests = "<br>".join(t.removeprefix("tests/") for t in o.target.tests)
        if o.error:
            rows.append(
                f"| {o.target.name} | {modules} | {tests} | - | - | - | - | failed | {o.seconds / 60:.1f} | {o.run} |"
            )
            continue
        survived = len(o.survivors)
        killed += o.killed
        scored += o.killed + survived
        rows.append(
            f"| {o.target.name} | {modules} | {tests} | {len(o.mutants)} | {o.killed} | {survived} | {o.equivalent}"
            f" | {o.score:.1%} | {o.seconds / 60:.1f} | {o.run} |"
        )
    overall = killed / scored if scored else 1.0
    met = all(o.error is None and o.score >= TARGET_SCORE for o in outcomes)
    used = sorted({o.run for o in outcomes})
    lines = [
        f"Written by `make mutation` (`python bench/mutation.py`): mutmut {mutmut_version()}, one target at a time "
        "with only its test files. Each row comes from the last run that measured its target (`--targets` runs "
        "some and keeps the others' rows):",
        "",
        *[f"- {runs[started].describe(started)}" for started in used],
        "",
        "Score = killed / (killed + survived), equivalent mutants (no behaviour change, "
        "bench/mutation_equivalents.toml) left out; killed includes mutants stopped by mutmut's time limit.",
        "",
        *rows,
        "",
        f"Overall: {overall:.1%} of {scored} non-equivalent mutants killed; target >= {TARGET_SCORE:.0%} on every "
        f"target: {'met' if met else 'NOT met'}; {sum(o.seconds for o in outcomes) / 60:.1f} minutes summed over "
        "the rows.",
    ]
    left_out = [t.name for t in TARGETS if t.name not in {o.target.name for o in outcomes}]
    if left_out:
        lines += ["", f"Not measured yet: {', '.join(left_out)}."]
    survivors = [(o, m) for o in outcomes for m in o.survivors]
    if survivors:
        lines += ["", "Surviving mutants (no covering test fails):", ""]
        for o, m in survivors:
            lines.append(f"- {o.target.name}: `{m.name}` ({m.status}): {one_line(m.diff)}")
    equivalents = [(o, m) for o in outcomes for m in o.mutants if m.why_equivalent]
    if equivalents:
        lines += ["", "Equivalent mutants (survive because nothing observable changes):", ""]
        for o, m in equivalents:
            lines.append(f"- {o.target.name}: `{m.function}` {one_line(m.diff)}: {m.why_equivalent}")
    for o in outcomes:
        if o.error:
            lines += ["", f"{o.target.name} failed:", "", "```", o.error.strip(), "```"]
    return "\n".join(lines)


def one_line(diff: str) -> str:
    change = changed_lines(diff).splitlines()
    shown = " / ".join(line for line in change)
    return f"`{shown}`" if shown else "(no diff)"


def mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(t.name for t in TARGETS), help="comma-separated target names")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    parser.add_argument("--keep", action="store_true", help="keep each target's temporary copy (prints its path)")
    parser.add_argument("--no_write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args()

    by_name = {t.name: t for t in TARGETS}
    unknown = [name for name in args.targets.split(",") if name not in by_name]
    if unknown:
        parser.error(f"--targets: unknown {unknown}; accepted: {', '.join(by_name)}")
    equivalents = load_equivalents()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still remove the temporary copy
    load_start = os.getloadavg()[0]
    started_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    started = time.monotonic()
    outcomes = []
    for name in args.targets.split(","):
        print(f"mutating {name} ...", flush=True)
        outcome = run_target(by_name[name], args.jobs, equivalents, args.keep)
        outcome.run = started_at
        print(
            f"  {name}: {len(outcome.mutants)} mutants, {outcome.killed} killed, {len(outcome.survivors)} survived,"
            f" {outcome.equivalent} equivalent, {outcome.seconds / 60:.1f} min"
            + (" (FAILED)" if outcome.error else ""),
            flush=True,
        )
        for mutant in outcome.survivors:
            print(f"    survived: {mutant.name} {one_line(mutant.diff)}", flush=True)
        outcomes.append(outcome)
    this_run = Run(
        args.jobs,
        (load_start, os.getloadavg()[0]),
        (time.monotonic() - started) / 60,
        [o.target.name for o in outcomes],
    )
    runs, recorded = ({}, {}) if args.no_write else load_record()
    runs[started_at] = this_run
    recorded.update({o.target.name: o for o in outcomes})
    shown = [recorded[t.name] for t in TARGETS if t.name in recorded]
    for outcome in shown:  # the equivalents as the toml says now
        for mutant in outcome.mutants:
            mutant.why_equivalent = (
                None if mutant.status in ("killed", "timeout") else equivalence_reason(mutant, equivalents)
            )
    results_md.report(TITLE, render(shown, runs), write=not args.no_write)
    if not args.no_write:
        save_record(runs, recorded)
    return 0 if all(o.error is None and o.score >= TARGET_SCORE for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
