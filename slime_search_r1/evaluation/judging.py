"""The judge's pass over a run: ask it about every trajectory without a usable verdict, keep each raw verdict in
judgements.jsonl, and join the verdicts into the trajectories for the reports.

judgements.jsonl has one line per judged trajectory (the latest line of a key wins): its key, the judge's identity
(model and the prompt's sha256), what it judged (the question, the gold answers and the answer), and the Verdict
(status, score, the judge's reply, the error, the attempts). A verdict counts for a trajectory only when it judged
what the trajectory holds now: a row run again on resume (after a failed search) with a new answer is judged again,
never scored by the verdict on its old answer. A run is re-scored from it without generating again (`evaluate.py
rescore DIR`); a trajectory whose verdict is missing, comes from another judge or prompt, judged another answer, or
is marked (error, invalid) is asked again on the next run.
"""

import asyncio
import json
import math
import sys
from pathlib import Path

from slime_search_r1.evaluation.store import TrajectoryStore
from slime_search_r1.http_client import close_loop_sessions
from slime_search_r1.scoring.judge import SCORED, JudgeClient, Verdict

JUDGEMENTS = "judgements.jsonl"
JUDGE_JSON = "judge.json"  # the judge whose verdicts the reports count (written when a judge last ran here)


JUDGED = ("question", "golden_answers", "answer")  # what the judge is shown of a trajectory


def judge_pending(judge: JudgeClient | None, records: list[dict], output_dir: Path) -> None:
    """Ask the judge about the records without a usable verdict from it (none when no judge is given)."""
    if judge is None:
        return
    verdicts = TrajectoryStore(output_dir, JUDGEMENTS).load()
    todo = pending(records, verdicts, judge.identity)
    unanswerable = sum("answer" not in record for record in records)
    if unanswerable:
        print(
            f"evaluate.py: warning: {unanswerable} trajectories hold no recorded answer, so the judge cannot be "
            "asked about them; they stay unjudged (rerun them with --overwrite)",
            file=sys.stderr,
        )
    print(f"evaluate.py: judge {judge.config.model}: {len(todo)} answers to judge", file=sys.stderr)
    if todo:
        judge_run(judge, todo, output_dir)


def unjudged_message(summary: dict) -> str | None:
    """What to tell the user when trajectories are left without a usable verdict, else None."""
    if not summary.get("unjudged"):
        return None
    return (
        f"{summary['unjudged']} trajectories have no usable verdict (marked error or invalid in {JUDGEMENTS}, with "
        "the judge's reply and the error); rerun the same command, or evaluate.py rescore with the judge flags, to "
        "ask again"
    )


def judged(record: dict) -> dict:
    """What the judge is shown of this trajectory (a verdict line records it, and counts only for it)."""
    return {field: record.get(field) for field in JUDGED}


def verdict_for(line: dict | None, record: dict, identity: dict) -> dict | None:
    """The line when it is this judge's verdict on what `record` holds now, else None."""
    if line is None or line.get("judge") != identity:
        return None
    return line if {field: line.get(field) for field in JUDGED} == judged(record) else None


def usable(line: dict | None, record: dict, identity: dict) -> bool:
    """This judge's verdict on the record's answer, and one that carries a score (correct, incorrect, no answer)."""
    mine = verdict_for(line, record, identity)
    return mine is not None and mine.get("status") in SCORED


def pending(records: list[dict], verdicts: dict[str, dict], identity: dict) -> list[dict]:
    """The trajectories this judge has no usable verdict for. A line without "answer" cannot be judged and stays
    unjudged."""
    return [r for r in records if "answer" in r and not usable(verdicts.get(r["key"]), r, identity)]


def verdict_line(record: dict, identity: dict, verdict: Verdict) -> dict:
    return {"key": record["key"], "judge": identity, **judged(record), **verdict.as_dict()}


async def judge_records(client: JudgeClient, records: list[dict], store, progress=None) -> list[dict]:
    """Ask the judge about each record (at most client.config.concurrency in flight), appending each verdict's line
    to `store` as it arrives; returns the lines."""
    identity = client.identity

    async def one(record: dict) -> dict:
        golds = record.get("golden_answers") or []
        verdict = await client.judge(record.get("question") or "", golds, record["answer"])
        line = verdict_line(record, identity, verdict)
        store.append(line)
        if progress is not None:
            progress.update(1)
        return line

    return list(await asyncio.gather(*(one(record) for record in records)))


def with_verdicts(records: list[dict], verdicts: dict[str, dict], identity: dict) -> list[dict]:
    """The records with "judge" (1.0, 0.0, or None when unjudged or marked) and "judge_status" from this judge's
    verdict on each record's answer."""
    joined = []
    for record in records:
        mine = verdict_for(verdicts.get(record["key"]), record, identity)
        score = mine.get("score") if mine else None
        if score is not None and not (isinstance(score, (int, float)) and math.isfinite(score)):
            score = None
        joined.append(record | {"judge": score, "judge_status": mine.get("status") if mine else "unjudged"})
    return joined


def judge_run(client: JudgeClient, records: list[dict], output_dir: Path) -> list[dict]:
    """Judge `records` into output_dir/judgements.jsonl with a progress bar and record the judge in judge.json."""
    from tqdm import tqdm

    (output_dir / JUDGE_JSON).write_text(json.dumps(client.describe(), indent=2) + "\n", encoding="utf-8")
    store = TrajectoryStore(output_dir, JUDGEMENTS)
    progress = tqdm(total=len(records), desc="judge", unit="answer", dynamic_ncols=True)

    async def run() -> list[dict]:
        try:
            return await judge_records(client, records, store, progress)
        finally:
            await close_loop_sessions()

    store.open()
    try:
        return asyncio.run(run())
    finally:
        store.close()
        progress.close()


def recorded_judge(output_dir: Path) -> dict | None:
    """The judge that last ran in output_dir (judge.json), or None."""
    path = output_dir / JUDGE_JSON
    if not path.is_file():
        return None
    try:
        described = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return described if isinstance(described, dict) and "model" in described else None


def identity_of(described: dict) -> dict:
    return {"model": described.get("model"), "prompt_sha256": described.get("prompt_sha256")}
