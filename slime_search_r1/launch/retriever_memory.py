"""The retriever's memory beside training, checked before any GPU is spent, the same way by the tmux wrapper (before
it starts the server) and by the launch (before Ray starts, when NODE_RETRIEVER_LAYOUT says a server shares the node).

What training declares on each GPU comes from train.py's own flags (declared_training):
- --colocate (ASYNC_MODE=off): SGLang takes --sglang-mem-fraction-static of each GPU it shares with the trainer, and
  the trainer, offloaded while SGLang generates, keeps memory_plan.COLOCATED_TRAINER_GIB there (slime's release notes
  measured 3-5 GB after offload);
- without it (ASYNC_MODE=fully): slime gives the trainer the lowest GPU ids, 0 .. A-1, where it declares no bound, and
  SGLang its fraction of the next --rollout-num-gpus;
- a GPU outside training holds nothing of it.
Each GPU leaves the retriever total x (1 - fraction) - trainer - reserve (memory_plan.TrainingBudget); the plan's most
loaded GPU must fit the tightest GPU it uses. RAM is checked by the wrapper only, before the server starts: once
training runs, the server's RAM is already taken.

The wrapper learns train.py's flags by running TRAIN_CMD with DESCRIBE_VARIABLE (settings/table.py) naming a file,
when TRAIN_CMD runs the launch (python -m slime_search_r1.launch, as run_qwen2.5_3B.sh does): the launch writes its
resolved flags and what they declare there, and exits before anything starts.
"""

import argparse
import shutil
import subprocess
from dataclasses import dataclass, field

from local_dense_retriever.retrieval.layouts import parse_layout
from local_dense_retriever.retrieval.memory_plan import (
    COLOCATED_TRAINER_GIB,
    GIB,
    MemoryPlan,
    MemoryPlanError,
    TrainingBudget,
    check_fits,
    gib,
    plan_memory,
    table_layouts,
)
from local_dense_retriever.serving.launcher import ServerLayout
from slime_search_r1.settings.kinds import ConfigError, expand_ids
from slime_search_r1.settings.table import SETTINGS
from slime_search_r1.settings.view import Section

NODE_RETRIEVER_VARIABLES = tuple(s.env for key, s in SETTINGS.items() if key.startswith("node_retriever_"))
TRAINER_BYTES = int(COLOCATED_TRAINER_GIB * GIB)
# Without --sglang-mem-fraction-static SGLang sizes its share from the GPU itself (about 0.8-0.9 on large GPUs).
SGLANG_ASSUMED_FRACTION = 0.9
TUNER = "python -m local_dense_retriever.tune_index"


def id_text(ids) -> str:
    """0,1,2,3 as 0-3 (GPU lists in messages)."""
    ids, runs = sorted(ids), []
    for gpu in ids:
        if runs and gpu == runs[-1][1] + 1:
            runs[-1][1] = gpu
        else:
            runs.append([gpu, gpu])
    return ",".join(f"{low}" if low == high else f"{low}-{high}" for low, high in runs)


@dataclass(frozen=True)
class TrainingGpus:
    """What train.py's flags put on each GPU of the node."""

    node_gpus: int
    colocated: tuple[int, ...] = ()  # SGLang and the (offloaded) trainer
    trainer_only: tuple[int, ...] = ()
    rollout_only: tuple[int, ...] = ()  # SGLang alone
    sglang_fraction: float = SGLANG_ASSUMED_FRACTION
    fraction_given: bool = True

    @classmethod
    def from_json(cls, data: dict) -> "TrainingGpus":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def role(self, gpu: int) -> str:
        if gpu in self.colocated:
            return "SGLang and the colocated trainer"
        if gpu in self.trainer_only:
            return "the trainer"
        return "SGLang" if gpu in self.rollout_only else "no training"

    def budget(self, gpu: int, total: int, trainer_bytes: int) -> TrainingBudget:
        if gpu in self.colocated:
            return TrainingBudget(total, self.sglang_fraction, trainer_bytes)
        if gpu in self.rollout_only:
            return TrainingBudget(total, self.sglang_fraction)
        return TrainingBudget(total)  # the trainer alone declares no bound: see the warning

    def describe(self) -> str:
        parts = [f"{what} on GPU(s) {id_text(ids)}" for what, ids in
                 (("SGLang and the colocated trainer", self.colocated), ("the trainer", self.trainer_only),
                  ("SGLang", self.rollout_only)) if ids]  # fmt: skip
        if self.fraction_given:
            parts.append(f"--sglang-mem-fraction-static {self.sglang_fraction:g}")
        else:
            parts.append(f"no --sglang-mem-fraction-static (SGLang sizes its own; {self.sglang_fraction:g} assumed)")
        return ", ".join(parts)


def declared_training(flags: argparse.Namespace) -> TrainingGpus:
    """The GPUs train.py's flags (read by command.read_flags) give SGLang and the trainer, on one node."""
    actor, rollout, node = flags.actor_num_gpus_per_node, flags.rollout_num_gpus, flags.num_gpus_per_node
    fraction = flags.sglang_mem_fraction_static
    if fraction is not None and not 0 <= fraction < 1:
        raise ConfigError(f"--sglang-mem-fraction-static {fraction}: accepted is a fraction in [0, 1)")
    shared = {"node_gpus": max(node, actor), "sglang_fraction": SGLANG_ASSUMED_FRACTION if fraction is None else
              fraction, "fraction_given": fraction is not None}  # fmt: skip
    if flags.colocate:  # slime's one placement group: the trainer and SGLang both start at GPU 0
        rollout = actor if rollout is None else rollout
        return TrainingGpus(colocated=tuple(range(min(actor, rollout))), trainer_only=tuple(range(rollout, actor)),
                            rollout_only=tuple(range(actor, rollout)), **shared)  # fmt: skip
    rollout = rollout or 0  # the trainer's GPUs first, then the rollout's (slime/ray/placement_group.py)
    return TrainingGpus(trainer_only=tuple(range(actor)), rollout_only=tuple(range(actor, actor + rollout)), **shared)


def gpu_memory_total(override_gib: float | None) -> tuple[int | None, str]:
    """Each GPU's memory (the smallest nvidia-smi lists) and where the figure came from; None where unknown."""
    if override_gib:
        return int(override_gib * GIB), "GPU_MEMORY_GIB"
    if shutil.which("nvidia-smi") is None:
        return None, "no nvidia-smi here"
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi did not answer in 60 s"
    totals = [float(word) for word in listed.stdout.split() if word.replace(".", "", 1).isdigit()]
    if listed.returncode != 0 or not totals:
        return None, "nvidia-smi lists no GPU"
    return int(min(totals) * 2**20), "nvidia-smi"


@dataclass
class Checked:
    plan: MemoryPlan
    lines: list[str]  # the plan, and what it was checked against
    warnings: list[str] = field(default_factory=list)


def check_beside_training(
    server: ServerLayout,
    setting: str,
    training: TrainingGpus | None,
    gpu_total: tuple[int | None, str],
    ram: tuple[int, str] | None = None,
) -> Checked:
    """The plan of `server` (named by `setting` in messages), checked on its GPUs against what `training` declares
    there (None: against each GPU's total only) and against `ram` (bytes, where the figure came from) when given.
    MemoryPlanError, one line with the setting, the figures and what would fit, when it does not fit."""
    if training and max(server.gpu_ids, default=-1) >= training.node_gpus:
        raise MemoryPlanError(
            f"{setting}: GPU {max(server.gpu_ids)} is not on the node (--num-gpus-per-node {training.node_gpus}); "
            f"accepted: GPU ids 0-{training.node_gpus - 1}"
        )
    plan = server.plan()
    checked = Checked(plan, [f"memory plan ({setting}): {plan.describe()}"])
    if plan.gpus:
        _check_gpus(server, setting, plan, training, gpu_total, checked)
    if ram is not None:
        try:
            check_fits(plan, None, ram[0])
        except MemoryPlanError:
            raise MemoryPlanError(
                f"{setting}: layout {plan.layout} needs {gib(plan.ram_bytes)} of RAM ({plan.ram_note}) but "
                f"{gib(ram[0])} is available ({ram[1]}); what would fit: {'; '.join(_ram_hints(server, ram[0]))}"
            ) from None
        checked.lines.append(f"RAM: {gib(plan.ram_bytes)} of the {gib(ram[0])} available ({ram[1]}): it fits")
    return checked


def _check_gpus(server, setting, plan, training, gpu_total, checked) -> None:
    total, source = gpu_total
    if total is None:
        checked.warnings.append(f"each GPU's memory is not known ({source}; set GPU_MEMORY_GIB): the plan's "
                                f"{gib(plan.gpu_bytes)} per GPU is not checked")  # fmt: skip
        return
    gpus = server.gpu_ids
    budgets = {gpu: training.budget(gpu, total, TRAINER_BYTES) if training else TrainingBudget(total) for gpu in gpus}
    tightest = min(gpus, key=lambda gpu: budgets[gpu].available_bytes)
    budget = budgets[tightest]
    role = training.role(tightest) if training else "what training holds there is not known"
    alone = [gpu for gpu in gpus if training and gpu in training.trainer_only]
    if alone:
        rollout = training.rollout_only
        others = f"; SGLang's GPU(s) {id_text(rollout)} have a declared bound" if rollout else ""
        checked.warnings.append(
            f"the retriever's GPU(s) {id_text(alone)} hold the trainer alone (no --colocate), whose memory there is "
            f"not declared: they are checked against their total only{others}"
        )
    try:
        check_fits(plan, budget)
    except MemoryPlanError:
        hints = _gpu_hints(server, plan, budget, training)
        raise MemoryPlanError(
            f"{setting}: layout {plan.layout} over {plan.gpus} GPU(s) needs {gib(plan.gpu_bytes)} on its most loaded "
            f"GPU but GPU {tightest} ({role}) leaves {budget.describe()} (GPU memory: {source}); what would fit: "
            + "; ".join(hints)
        ) from None
    against = f"beside training ({training.describe()})" if training else "against each GPU's total"
    checked.lines.append(
        f"{against}: GPU {tightest} ({role}) leaves {budget.describe()} (GPU memory: {source}); the plan's "
        f"{gib(plan.gpu_bytes)} fits"
    )


def _gpu_hints(server: ServerLayout, plan: MemoryPlan, budget: TrainingBudget, training: TrainingGpus | None):
    """What would fit beside the same training: more GPUs for exact torch search, a lower SGLang fraction, a CPU
    layout."""
    hints = []
    torch_layout = "torch-" + plan.layout.rsplit("-", 1)[1]  # faiss-gpu-fp16 -> torch-fp16: the same vectors
    most = max(training.node_gpus if training else 8, len(server.gpu_ids))
    for count in range(len(server.gpu_ids) + 1, most + 1):
        need = plan_memory(torch_layout, server.corpus_size, server.dim, count).gpu_bytes
        if need <= budget.available_bytes:
            ids = ",".join(map(str, range(count)))
            hints.append(f"--torch_search over {count} GPUs ({torch_layout}: {gib(need)} each; --torch_search {ids})")
            break
    if budget.sglang_mem_fraction_static > 0:
        used = plan.gpu_bytes + budget.trainer_bytes + budget.reserve_bytes
        fraction = int((1 - used / budget.gpu_total_bytes) * 100) / 100
        if fraction >= 0.05:
            hints.append(f"--sglang-mem-fraction-static {fraction:.2f} or lower (SGLANG_ARGS; less KV cache)")
    flat = plan_memory("Flat", server.corpus_size, server.dim, mmap=True).ram_bytes
    hints.append(f"a CPU layout, without --faiss_gpu and --torch_search (Flat with --faiss_mmap: {gib(flat)} of RAM "
                 f"and the page cache; smaller ones: {TUNER})")  # fmt: skip
    return hints


def _ram_hints(server: ServerLayout, available: int) -> list[str]:
    """What would fit in `available` bytes of RAM instead (only what fits)."""
    candidates = []
    if server.layout == "Flat" and not server.mmap and not server.flag:
        mmap = plan_memory("Flat", server.corpus_size, server.dim, mmap=True).ram_bytes
        candidates.append((mmap, f"--faiss_mmap ({gib(mmap)}; pages of the index are cached while RAM allows)"))
    for spec in table_layouts(server.corpus_size, server.dim):
        if not parse_layout(spec).on_gpu and spec != server.layout:
            ram = plan_memory(spec, server.corpus_size, server.dim).ram_bytes
            candidates.append((ram, f"{spec} ({gib(ram)}; {TUNER})"))
    torch = plan_memory("torch-fp16", server.corpus_size, server.dim, 1).ram_bytes
    candidates.append(
        (torch, f"--torch_search on GPUs ({gib(torch)}: the vectors stream from the memory-mapped file)")
    )
    hints = [hint for ram, hint in candidates if ram <= available][:4]
    return hints or [f"none of the layouts (the encoder alone needs {gib(min(ram for ram, _ in candidates))}): "
                     "free memory or raise RETRIEVER_RAM_GIB"]  # fmt: skip


def node_retriever(knobs: Section, training: TrainingGpus) -> ServerLayout | None:
    """The retrieval server NODE_RETRIEVER_* describe (None when NODE_RETRIEVER_LAYOUT is unset)."""
    spec = knobs.node_retriever_layout
    if spec is None:
        return None
    try:
        layout = parse_layout(spec)
    except ValueError as err:
        raise ConfigError(f"NODE_RETRIEVER_LAYOUT: {err}") from None
    if knobs.node_retriever_corpus_size is None:
        raise ConfigError(
            "NODE_RETRIEVER_LAYOUT is set but NODE_RETRIEVER_CORPUS_SIZE is not; accepted: the retriever's passages "
            "(wiki-18: 21015324; python -m local_dense_retriever.memory_plan --index_path INDEX --json prints it)"
        )
    gpus = ()
    if layout.on_gpu:
        gpus = tuple(expand_ids(knobs.node_retriever_gpus or f"0-{training.node_gpus - 1}"))
    elif knobs.node_retriever_gpus:
        raise ConfigError(f"NODE_RETRIEVER_GPUS={knobs.node_retriever_gpus} with NODE_RETRIEVER_LAYOUT={spec}: a CPU "
                          "layout uses no GPU; accepted: a GPU layout (torch-fp16, faiss-gpu-fp16, ...) or no "
                          "NODE_RETRIEVER_GPUS")  # fmt: skip
    return ServerLayout(layout.spec, knobs.node_retriever_corpus_size, knobs.node_retriever_dim, gpus)


def node_retriever_environment(server: ServerLayout) -> dict[str, str]:
    """NODE_RETRIEVER_* for `server`, for the launch in the training window: what it holds on the GPUs (empty for a
    server on the CPU, whose RAM the wrapper checked before it started)."""
    if not server.gpu_ids:
        return {}
    return {
        "NODE_RETRIEVER_LAYOUT": server.layout,
        "NODE_RETRIEVER_CORPUS_SIZE": str(server.corpus_size),
        "NODE_RETRIEVER_DIM": str(server.dim),
        "NODE_RETRIEVER_GPUS": ",".join(map(str, server.gpu_ids)),
    }


def check_node_retriever(knobs: Section, training: TrainingGpus) -> Checked | None:
    """The launch's check: the server NODE_RETRIEVER_* describe, beside what train.py's flags declare; ConfigError
    when it cannot fit."""
    server = node_retriever(knobs, training)
    if server is None:
        return None
    setting = f"NODE_RETRIEVER_LAYOUT={server.layout}"
    if server.gpu_ids:
        setting += f" on NODE_RETRIEVER_GPUS={id_text(server.gpu_ids)}"
    gpu_total = gpu_memory_total(knobs.gpu_memory_gib) if server.gpu_ids else (None, "")
    try:
        return check_beside_training(server, setting, training, gpu_total)
    except MemoryPlanError as err:
        raise ConfigError(str(err)) from None
