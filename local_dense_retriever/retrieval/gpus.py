"""Which GPUs a setting may name, counted without importing torch (the server checks its flags before torch loads,
so that OpenMP reads the wait policy set after the check)."""

import os

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def visible_gpu_count() -> int:
    """GPUs CUDA would show this process: the driver's, narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it (the list
    ends at its first entry that names no GPU)."""
    try:
        installed = len(os.listdir(NVIDIA_GPUS))
    except OSError:
        installed = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return installed
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.startswith(("GPU-", "MIG-")):
            count += 1
        elif entry.isdigit() and int(entry) < installed:
            count += 1
        else:
            break
    return min(count, installed)


def parse_gpu_list(flag: str, value: str, visible: int) -> list[int] | None:
    """`cpu` -> None, `all` -> every visible GPU, `0,1,3` -> those ids; ValueError naming what is accepted."""
    value = value.strip().lower()
    if value == "cpu":
        return None
    if value == "all":
        if visible == 0:
            raise ValueError(f"{flag} all: no GPU is visible here; accepted: cpu, or GPU ids where GPUs exist")
        return list(range(visible))
    try:
        ids = [int(part) for part in value.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {value!r}: accepted are cpu, all, or GPU ids such as 0,1,2,3") from None
    have = f"GPUs 0-{visible - 1}" if visible else "no GPU"
    for gpu in ids:
        if not 0 <= gpu < visible:
            raise ValueError(f"{flag} {value}: GPU {gpu} is not there; this process sees {have} (accepted: cpu, all, "
                             "or ids of visible GPUs)")  # fmt: skip
    if len(set(ids)) != len(ids):
        raise ValueError(f"{flag} {value}: a GPU is named twice; accepted: distinct ids")
    return ids
