"""CPU thread sizing for the retriever: affinity and cgroup quotas (fake cgroup trees), and what the server and the
index builder really run with (real subprocesses, with OpenMP printing its own settings)."""

import contextlib
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from local_dense_retriever.retrieval import cpu_budget, cpu_threads
from local_dense_retriever.serving.launcher import PACKAGE_ROOT, ServerProcess
from local_dense_retriever.demo.mini_wiki import load_summaries, write_corpus
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401

# libgomp's OMP_DISPLAY_ENV=VERBOSE lines: its default wait spins 300000 rounds, then sleeps; PASSIVE sleeps at once
SPIN_THEN_SLEEP_IN_OPENMP = "GOMP_SPINCOUNT = '300000'"
PASSIVE_IN_OPENMP = "GOMP_SPINCOUNT = '0'"


def fake_proc_self(tmp_path: Path, cgroup: str, mounts: list[tuple[str, str, str, str]]) -> Path:
    """A /proc/self with `cgroup` and a mountinfo of (root, mount point, fs type, super options) lines."""
    proc = tmp_path / "proc_self"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    lines = [
        f"{30 + i} 23 0:{28 + i} {root} {point} rw,nosuid,nodev,noexec,relatime - {fs} {fs} {options}"
        for i, (root, point, fs, options) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text("\n".join(["22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw", *lines]) + "\n")
    return proc


def cgroup_dir(base: Path, relative: str, **files: str) -> Path:
    directory = base / relative.strip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("__", ".")).write_text(text + "\n")
    return directory


def test_cgroup_v2_cpu_max_gives_the_quota_in_cpus(tmp_path):
    mount = tmp_path / "cgroup2"
    cgroup_dir(mount, "kubepods/pod1/c1", cpu__max="150000 100000")
    proc = fake_proc_self(tmp_path, "0::/kubepods/pod1/c1\n", [("/", str(mount), "cgroup2", "rw,nsdelegate")])
    assert cpu_budget.cgroup_cpu_quota(proc) == 1.5


def test_cgroup_v2_quota_of_a_parent_caps_its_children(tmp_path):
    mount = tmp_path / "cgroup2"
    cgroup_dir(mount, "kubepods/pod1", cpu__max="200000 100000")
    cgroup_dir(mount, "kubepods/pod1/c1", cpu__max="max 100000")
    proc = fake_proc_self(tmp_path, "0::/kubepods/pod1/c1\n", [("/", str(mount), "cgroup2", "rw")])
    assert cpu_budget.cgroup_cpu_quota(proc) == 2.0


def test_cgroup_v2_without_a_quota_gives_none(tmp_path):
    mount = tmp_path / "cgroup2"
    cgroup_dir(mount, "user.slice/session.scope", cpu__max="max 100000")
    proc = fake_proc_self(tmp_path, "0::/user.slice/session.scope\n", [("/", str(mount), "cgroup2", "rw")])
    assert cpu_budget.cgroup_cpu_quota(proc) is None


def test_cgroup_v1_cfs_quota_gives_the_quota_in_cpus(tmp_path):
    mount = tmp_path / "cpu,cpuacct"
    cgroup_dir(mount, "docker/abc", cpu__cfs_quota_us="250000", cpu__cfs_period_us="100000")
    proc = fake_proc_self(
        tmp_path,
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
        [("/", str(mount), "cgroup", "rw,cpu,cpuacct"), ("/", str(tmp_path / "unified"), "cgroup2", "rw")],
    )
    assert cpu_budget.cgroup_cpu_quota(proc) == 2.5


def test_cgroup_v1_quota_of_minus_one_means_no_quota(tmp_path):
    mount = tmp_path / "cpu"
    cgroup_dir(mount, "", cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")  # this machine's own layout
    proc = fake_proc_self(tmp_path, "1:cpu:/\n0::/\n", [("/", str(mount), "cgroup", "rw,cpu")])
    assert cpu_budget.cgroup_cpu_quota(proc) is None


def test_a_container_mount_rooted_at_its_own_cgroup_is_read_at_the_mount_point(tmp_path):
    # Docker without a cgroup namespace: /proc/self/cgroup says /docker/abc and so does the mount's root.
    mount = tmp_path / "cpu"
    cgroup_dir(mount, "", cpu__cfs_quota_us="100000", cpu__cfs_period_us="100000")
    proc = fake_proc_self(tmp_path, "4:cpu:/docker/abc\n", [("/docker/abc", str(mount), "cgroup", "rw,cpu")])
    assert cpu_budget.cgroup_cpu_quota(proc) == 1.0


def test_no_cgroup_files_means_no_quota(tmp_path):
    proc = tmp_path / "proc_self"
    proc.mkdir()
    assert cpu_budget.cgroup_cpu_quota(proc) is None


@pytest.mark.parametrize(
    "affinity, quota, expected",
    [(8, None, 8), (8, 2.5, 2), (8, 0.5, 1), (2, 16.0, 2)],
    ids=["affinity only", "quota rounded down", "at least one", "affinity below quota"],
)
def test_usable_cpus_are_the_affinity_capped_by_the_quota(monkeypatch, affinity, quota, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(cpu_budget, "cgroup_cpu_quota", lambda proc_self=None: quota)
    budget = cpu_budget.usable_cpus()
    assert budget.cpus == expected
    assert budget.affinity == affinity


def test_thread_count_is_num_threads_when_given_else_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(cpu_budget, "cgroup_cpu_quota", lambda proc_self=None: None)
    assert cpu_budget.thread_count() == 3
    assert cpu_budget.thread_count(5) == 5


@pytest.fixture
def fresh_wait_policy(monkeypatch):
    """No OMP_WAIT_POLICY in the environment, and set_wait_policy()'s record restored after the test."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(cpu_threads, "_policy_before_load", cpu_threads._policy_before_load)


def test_tuned_layouts_keep_libgomps_default_wait(fresh_wait_policy):
    assert cpu_threads.set_wait_policy(tuned=True) in (True, False)
    assert "OMP_WAIT_POLICY" not in os.environ


def test_a_fixed_thread_count_gets_the_passive_wait_policy_unless_the_user_chose_one(monkeypatch, fresh_wait_policy):
    cpu_threads.set_wait_policy(tuned=False)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cpu_threads.set_wait_policy(tuned=False)
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_set_wait_policy_says_when_it_comes_too_late(monkeypatch, fresh_wait_policy):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", object()))
    assert cpu_threads.set_wait_policy(tuned=False) is False


@contextlib.contextmanager
def one_cpu_for_children():
    """Children started inside inherit an affinity of one CPU (as under `taskset -c N`); ours is restored after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


needs_two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell one CPU of affinity from the machine's count"
)


def start_server(small_wiki, tmp_path, *extra: str) -> tuple[ServerProcess, dict]:
    """A real server; its /health `cpu_threads`. Each OpenMP runtime prints its settings when it loads."""
    flags = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir), *extra]  # fmt: skip
    log_path = tmp_path / f"server{len(extra)}.log"
    server = ServerProcess(flags, log_path=log_path, startup_timeout=120, env={"OMP_DISPLAY_ENV": "VERBOSE"})
    server.start()
    try:
        return server, httpx.get(f"{server.url}/health").json()["cpu_threads"]
    finally:
        server.stop()


@needs_two_cpus
def test_server_sizes_its_threads_to_its_affinity_and_leaves_the_wait_to_the_tuner(
    small_wiki, tmp_path, fresh_wait_policy
):
    with one_cpu_for_children():
        server, threads = start_server(small_wiki, tmp_path)
    assert threads["affinity_cpus"] == 1 and threads["usable_cpus"] == 1
    assert threads["torch_threads"] == 1, threads
    assert threads["faiss_threads"] == 1, threads
    assert threads["layouts"] == ["1x1"] and threads["adaptive_threads"] is False
    assert threads["omp_wait_policy"].startswith("default") and threads["wait_policy_set_before_openmp_loaded"]
    # torch's and faiss's own libgomp copies both keep the default wait
    assert server.log_path.read_text().count(SPIN_THEN_SLEEP_IN_OPENMP) == 2, server.log_tail(60)


@needs_two_cpus
def test_server_tunes_its_layout_on_several_cpus_and_num_threads_fixes_one_with_passive_threads(
    small_wiki, tmp_path, fresh_wait_policy
):
    _, tuned = start_server(small_wiki, tmp_path)
    assert tuned["adaptive_threads"] is True and tuned["layouts"][0] == f"1x{tuned['usable_cpus']}"
    assert tuned["layouts"][-1] == f"{tuned['usable_cpus']}x1"  # one single-threaded batch per CPU
    server, fixed = start_server(small_wiki, tmp_path, "--num_threads", "2")
    assert fixed["adaptive_threads"] is False and fixed["layouts"] == ["1x2"]
    assert fixed["omp_wait_policy"] == "PASSIVE"
    assert server.log_path.read_text().count(PASSIVE_IN_OPENMP) == 2, server.log_tail(60)


@needs_two_cpus
def test_index_builder_encodes_with_threads_sized_to_its_affinity_and_the_default_wait(small_wiki, tmp_path):
    corpus = write_corpus(load_summaries()[:8], tmp_path / "corpus.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    with one_cpu_for_children():
        built = subprocess.run(
            [sys.executable, "-m", "local_dense_retriever.index_builder", "--corpus_path", str(corpus),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir),
             "--index_path", str(tmp_path / "x.index"), "--no_progress"],
            cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=300, env={**env, "OMP_DISPLAY_ENV": "VERBOSE"},
        )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "'torch_threads': 1" in built.stderr, built.stderr[-3000:]
    assert built.stderr.count(SPIN_THEN_SLEEP_IN_OPENMP) == 2, built.stderr[-3000:]


def test_index_builder_num_threads_overrides_the_detected_count_with_passive_threads(small_wiki, tmp_path):
    corpus = write_corpus(load_summaries()[:8], tmp_path / "corpus.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    built = subprocess.run(
        [sys.executable, "-m", "local_dense_retriever.index_builder", "--corpus_path", str(corpus),
         "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir), "--num_threads", "3",
         "--index_path", str(tmp_path / "x.index"), "--no_progress"],
        cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=300, env={**env, "OMP_DISPLAY_ENV": "VERBOSE"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "'torch_threads': 3" in built.stderr, built.stderr[-3000:]
    assert built.stderr.count(PASSIVE_IN_OPENMP) == 2, built.stderr[-3000:]


class FakeCpu:
    """Batches on a fake clock, kept coming as a closed loop of clients would: a batch of `size` queries takes
    `seconds[layout] * size`, where the test sets the layouts' speed (and changes it when a neighbour comes)."""

    def __init__(self, tuner_options: dict | None = None, seconds: dict[str, float] | None = None, cpus: int = 2):
        self.now = 0.0
        self.seconds = seconds or dict(IDLE)
        self.overhead = dict.fromkeys(self.seconds, 0.0)  # seconds per batch on top of its queries'
        self.changes: list[tuple[str, int]] = []  # (thread, threads) for every pool resize
        self.other_cores = 0.0  # CPUs other processes keep busy; the tuner reads their running total
        self.other_seconds = 0.0
        options = {"other_cpu": lambda: self.other_seconds, **(tuner_options or {})}
        self.tuner = cpu_threads.ThreadTuner(cpus, set_threads=self.set_threads, clock=lambda: self.now, **options)
        self.noise = lambda: 1.0  # a factor on each batch's time
        self.running: list[tuple[float, cpu_threads.Ticket, int]] = []
        self.layouts_run: list[str] = []
        self.sizes_run: list[int] = []
        self.most_threads_at_once = 0

    def set_threads(self, threads: int) -> None:
        self.changes.append((threading.current_thread().name, threads))

    def run(self, batches: int, size: int = 64, in_flight: int = 1 << 30) -> None:
        """`batches` batches of `size` queries, at most `in_flight` at once (1: one client)."""
        for _ in range(batches):
            while len(self.running) < in_flight and (ticket := self.tuner.begin()) is not None:
                queries = size
                layout = str(ticket.layout)
                seconds = (self.overhead.get(layout, 0.0) + self.seconds[layout] * queries) * self.noise()
                self.running.append((self.now + seconds, ticket, queries))
                self.layouts_run.append(str(ticket.layout))
                self.sizes_run.append(queries)
                threads = sum(ticket.layout.threads for _, ticket, _ in self.running)
                self.most_threads_at_once = max(self.most_threads_at_once, threads)
            self.running.sort(key=lambda batch: batch[0])
            ends, ticket, queries = self.running.pop(0)
            self.other_seconds += self.other_cores * (ends - self.now)
            self.now = ends
            self.tuner.end(ticket, queries)

    @property
    def layout(self) -> str:
        return self.tuner.report()["layout"]


# Seconds per query in a batch of 64 (in-process, 10k, this 2-core machine): one batch on 2 spinning threads is the
# fastest idle; beside a process spinning on one core it collapses, while single-threaded batches side by side
# keep going (2x1 = two batches at once, so each query's share of the wall time is half its batch's).
IDLE = {"1x2": 0.109 / 64, "2x1": 0.239 / 64}
BUSY = {"1x2": 1.19 / 64, "2x1": 0.39 / 64}


def test_the_layouts_are_one_batch_on_every_cpu_or_one_single_threaded_batch_per_cpu():
    assert [str(layout) for layout in cpu_threads.layouts(2)] == ["1x2", "2x1"]
    assert [str(layout) for layout in cpu_threads.layouts(8)] == ["1x8", "8x1"]
    assert [str(layout) for layout in cpu_threads.layouts(2, parallel_batches=False)] == ["1x2", "1x1"]
    assert [str(layout) for layout in cpu_threads.layouts(1)] == ["1x1"]


def test_a_batch_starts_only_while_its_threads_fit_on_the_usable_cpus():
    tuner = cpu_threads.ThreadTuner(2, set_threads=lambda threads: None, clock=lambda: 0.0)
    first = tuner.begin()
    assert str(first.layout) == "1x2"
    assert tuner.begin() is None  # one batch on both CPUs: a second waits
    tuner.end(first, 64)
    assert tuner.begin() is not None


def test_single_threaded_layout_runs_one_batch_per_cpu():
    cpu = FakeCpu({"probe_every": 1 << 20}, seconds=dict(BUSY))
    cpu.run(40)
    assert cpu.layout == "2x1"
    cpu.run(60)
    assert cpu.layouts_run.count("1x2") == 4  # the start-up window only: the switch settles, nothing re-probes it
    cpu.run(5)
    assert cpu.layouts_run[-2:] == ["2x1", "2x1"] and len(cpu.running) == 1  # two at once: one still running
    assert cpu.most_threads_at_once == 2  # never more threads than CPUs, also while the layout changed


def test_tuner_keeps_one_batch_on_every_cpu_on_an_idle_machine():
    cpu = FakeCpu()
    cpu.run(2000)
    assert cpu.layout == "1x2"
    report = cpu.tuner.report()
    assert report["switches"] == 0 and report["probes"] >= 1  # the start-up check, then periodic ones
    assert cpu.layouts_run.count("2x1") / len(cpu.layouts_run) < 0.1  # probing costs a few batches in ten


def test_tuner_checks_the_other_layout_right_after_start_up():
    cpu = FakeCpu(seconds=dict(BUSY))  # started beside a busy process
    cpu.run(12)  # a short first window (4 batches), then a probe (half a window, 8)
    assert cpu.layout == "2x1"


def test_tuner_splits_the_cpus_when_a_neighbour_takes_a_core_and_shares_them_again_when_it_leaves():
    cpu = FakeCpu({"probe_every": 8})
    cpu.run(600)
    assert cpu.layout == "1x2"
    cpu.seconds = dict(BUSY)
    cpu.run(20)  # two batches 1.5x slower end the window and trigger a probe
    assert cpu.layout == "2x1"
    cpu.seconds = dict(IDLE)
    cpu.run(80)  # a window faster by more than 20% triggers a probe too
    assert cpu.layout == "1x2"


def test_tuner_splits_without_probing_while_another_process_holds_a_cpu_however_fast_shared_measures():
    cpu = FakeCpu({"probe_every": 2})  # shared measures the faster (its tail is what suffers beside a busy core)
    cpu.other_cores = 1.0
    cpu.run(400)
    assert cpu.layout == "2x1"
    assert cpu.layouts_run.count("1x2") == 4  # the start-up window only: no probe of it while the CPU is busy
    assert cpu.tuner.report()["other_processes_cpus"] == 1.0
    cpu.other_cores = 0.3  # the benchmark's own clients, say: below busy_cpus, so throughput decides again
    cpu.run(40)
    assert cpu.layout == "1x2"


def test_tuner_leaves_the_shared_layout_when_another_process_takes_a_cpu():
    cpu = FakeCpu()
    cpu.run(100)
    assert cpu.layout == "1x2"
    cpu.other_cores = 0.8
    cpu.run(32)  # the window under way, and the one that saw it end
    assert cpu.layout == "2x1"


def test_other_processes_cpu_is_the_busy_time_of_this_process_cpus_less_its_own(tmp_path):
    stat = tmp_path / "stat"
    # cpu0: user nice system idle iowait irq softirq steal; cpu1 is outside the affinity given
    stat.write_text("cpu  9 9 9 9 9 9 9 9\ncpu0 500 0 200 900 50 10 20 20 0 0\ncpu1 7000 0 0 0 0 0 0 0 0 0\n")
    meter = cpu_budget.OtherProcessesCpu({0}, proc_stat=stat)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    before = os.times()
    other = meter()
    after = os.times()
    assert 750 * tick - (after.user + after.system) <= other <= 750 * tick - (before.user + before.system)
    assert cpu_budget.OtherProcessesCpu({0}, proc_stat=tmp_path / "missing")() is None


def test_tuner_chooses_the_faster_layout_for_single_queries_too():
    cpu = FakeCpu(seconds={"1x2": 0.007, "2x1": 0.0136})  # one query alone: 2 spinning threads beat 1 thread
    cpu.run(500, size=1, in_flight=1)
    assert cpu.layout == "1x2"
    cpu.seconds = {"1x2": 0.309, "2x1": 0.031}  # beside a busy core
    cpu.run(60, size=1, in_flight=1)
    assert cpu.layout == "2x1"


def test_a_probe_that_is_far_worse_stops_after_its_first_batch():
    cpu = FakeCpu({"probe_every": 8}, seconds=dict(BUSY))
    cpu.run(40)
    assert cpu.layout == "2x1"
    start = len(cpu.layouts_run)
    cpu.run(16 * 9)  # eight windows, then a probe of 1x2, then back
    assert cpu.layouts_run[start:].count("1x2") == 1, cpu.layouts_run[start:]  # one batch, not a window of them
    assert cpu.layout == "2x1"


def test_a_change_within_the_jump_factor_waits_for_the_periodic_probe_and_one_beyond_it_does_not():
    cpu = FakeCpu({"probe_every": 1000}, seconds=dict(BUSY))
    cpu.run(40)
    probes = cpu.tuner.report()["probes"]
    for factor in (1.4, 1.0, 0.75, 1.0) * 5:  # windows up to 40% off, then back: within 1.5x of the one before
        cpu.seconds = {layout: seconds * factor for layout, seconds in BUSY.items()}
        cpu.run(16)
    assert cpu.tuner.report()["probes"] == probes
    cpu.seconds = {layout: seconds * 1.6 for layout, seconds in BUSY.items()}
    cpu.run(16 * 3)  # the jump, half a window re-measuring, the probe
    assert cpu.tuner.report()["probes"] == probes + 1


def test_probes_run_every_probe_every_windows():
    cpu = FakeCpu({"probe_every": 4})
    cpu.run(16 * 40)
    runs = "".join("s" if layout == "2x1" else "." for layout in cpu.layouts_run)
    gaps = [len(gap) for gap in runs.strip(".").split("s") if gap]
    assert gaps[-3:] == [4 * 16] * 3  # four windows of the shared layout between probes


def test_ordinary_noise_does_not_switch_the_layout():
    cpu = FakeCpu()
    rng = random.Random(0)
    cpu.noise = lambda: rng.uniform(0.85, 1.15)  # batch times vary by +-15% here, with no trend
    cpu.run(3000)
    assert cpu.tuner.report()["switches"] == 0


def test_each_thread_resizes_its_own_pools_and_only_when_its_count_changes():
    calls: list[tuple[str, int]] = []

    def set_threads(threads: int) -> None:
        calls.append((threading.current_thread().name, threads))

    tuner = cpu_threads.ThreadTuner(2, set_threads=set_threads)
    ticket = tuner.begin()
    tuner.enter(ticket)
    tuner.enter(ticket)
    worker = threading.Thread(target=tuner.enter, args=(ticket,), name="other")
    worker.start()
    worker.join()
    assert calls == [("MainThread", 2), ("other", 2)]  # OpenMP thread counts are per thread


def test_num_threads_fixes_one_batch_on_that_many_threads():
    cpu = FakeCpu({"adaptive": False}, seconds=dict(BUSY), cpus=3)
    cpu.seconds["1x3"] = 0.01
    cpu.run(200)
    assert set(cpu.layouts_run) == {"1x3"}
    assert cpu.tuner.report()["adaptive_threads"] is False and cpu.tuner.workers == 1


def test_the_index_builder_runs_forward_passes_in_the_tuners_layout():
    from local_dense_retriever.building.passage_vectors import TunedPasses

    tuner = cpu_threads.ThreadTuner(1, fixed=cpu_threads.Layout(threads=1, batches=2), set_threads=lambda n: None)
    both_inside = threading.Barrier(2, timeout=10)  # fails unless two passes run at once

    def forward(rows):
        both_inside.wait()
        return rows[0] * 10

    results = list(TunedPasses(tuner)(forward, [[1], [2], [3], [4]]))
    assert sorted(results) == [10, 20, 30, 40]


def test_a_failing_forward_pass_stops_the_others_and_raises():
    from local_dense_retriever.building.passage_vectors import TunedPasses

    tuner = cpu_threads.ThreadTuner(2, adaptive=False, set_threads=lambda n: None)
    ran = []

    def forward(rows):
        ran.append(rows[0])
        if rows[0] == 2:
            raise RuntimeError("pass 2 failed")
        return rows

    with pytest.raises(RuntimeError, match="pass 2 failed"):
        list(TunedPasses(tuner)(forward, [[i] for i in range(10)]))
    assert ran == [0, 1, 2]  # one pass at a time (1x2), and none after the failure


def test_a_jump_in_either_direction_re_measures_the_layout_then_probes():
    cpu = FakeCpu()
    cpu.run(2000)  # settled on 1x2: periodic probes are rare by now
    probes = cpu.tuner.report()["probes"]
    while cpu.tuner.report()["probes"] == probes:  # up to the end of a probe: a window of 1x2 starts afresh
        cpu.run(1)
    cpu.seconds = {layout: seconds / 3 for layout, seconds in IDLE.items()}  # e.g. the load went up
    ran = len(cpu.layouts_run)
    cpu.run(16 + 8 + 8 + 4)  # (the probe's last batches end after the next layout's first begin)
    after = cpu.layouts_run[ran:]
    assert after.index("2x1") == 16 + 8  # a window at the new cost (a jump), half a window re-measuring, the probe
    assert cpu.layout == "1x2" and cpu.tuner.report()["probes"] == probes + 2


def test_a_window_mixing_lone_queries_and_full_batches_does_not_decide_the_layout():
    """Seen on the real server beside a busy core: one client, then 256. The window that mixed both cost 15.6 ms per
    query on 2x1; a probe of 1x2 at 4.8 ms beat it, though 2x1 runs full batches at 3.4 ms. The probe must be
    measured against the layout under the new load."""
    cpu = FakeCpu(seconds={"1x2": 0.0042, "2x1": 0.0062})  # per query in a batch of 64: 1x2 4.8 ms, 2x1 3.4 ms
    cpu.overhead = {"1x2": 0.060, "2x1": 0.040}  # a lone query: 1x2 64 ms, 2x1 46 ms
    cpu.run(300, size=1, in_flight=1)  # one client
    assert cpu.layout == "2x1"
    probes = cpu.tuner.report()["probes"]
    while cpu.tuner.report()["probes"] == probes:  # up to the end of a probe: a window of 2x1 starts afresh
        cpu.run(1, size=1, in_flight=1)
    cpu.run(14, size=1, in_flight=1)
    switches = cpu.tuner.report()["switches"]
    ran = len(cpu.layouts_run)
    cpu.run(400, size=64)  # 256 clients: the window ends with 2 full batches (7.6 ms per query in all)
    assert cpu.tuner.report()["switches"] == switches and cpu.layout == "2x1"
    runs = "".join("s" if layout == "1x2" else "." for layout in cpu.layouts_run[ran:])
    probes = [len(probe) for probe in runs.split(".") if probe]
    assert probes and max(probes) <= 8, probes  # probes of half a window, never a stay
