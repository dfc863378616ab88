"""An evaluate.py output folder on disk: trajectories.jsonl, an append-only JSONL file of one line per finished
sample, and run_config.json, the settings a resumed run must share with the run it resumes.

The viewer reads the same folders through these names.
"""

import json
from pathlib import Path

TRAJECTORIES = "trajectories.jsonl"
RUN_CONFIG = "run_config.json"

# A trajectory that ended like this is evaluated again on resume (a search outage is not the model's fault).
RETRIED_STATUSES = ("failed", "aborted")


class ResumeMismatch(RuntimeError):
    """The output folder holds a run made with other settings."""


class TrajectoryStore:
    """A JSONL file of one object per finished sample (trajectories.jsonl, judgements.jsonl), flushed per line."""

    def __init__(self, output_dir: Path, name: str = TRAJECTORIES):
        self.path = output_dir / name
        self._file = None

    def load(self) -> dict[str, dict]:
        """The latest record of every key; a line cut short by an interrupt is skipped."""
        records: dict[str, dict] = {}
        if not self.path.exists():
            return records
        with self.path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and "key" in record:
                    records[str(record["key"])] = record
        return records

    def open(self) -> None:
        needs_newline = self.path.exists() and self.path.stat().st_size > 0 and not self._ends_with_newline()
        self._file = self.path.open("a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")  # after a line cut short by an interrupt

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as raw:
            raw.seek(-1, 2)
            return raw.read(1) == b"\n"

    def append(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def check_run_config(output_dir: Path, config: dict) -> None:
    """Write run_config.json, or check that the run already in this folder used the same settings."""
    path = output_dir / RUN_CONFIG
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        changed = sorted(key for key in set(earlier) | set(config) if earlier.get(key) != config.get(key))
        if changed:
            details = "; ".join(f"{key}: {earlier.get(key)!r} -> {config.get(key)!r}" for key in changed)
            raise ResumeMismatch(
                f"{output_dir} holds a run with other settings ({details}); "
                "pass --overwrite to start over or choose another --output-dir"
            )
        return
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
