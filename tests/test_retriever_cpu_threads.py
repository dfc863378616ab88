"""CPU thread sizing for the retriever: affinity and cgroup quotas (fake cgroup trees), and what the server and the
index builder really run with (real subprocesses, with OpenMP printing its own settings)."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from local_dense_retriever.retrieval import cpu_threads
from local_dense_retriever.serving.launcher import PACKAGE_ROOT, ServerProcess
from local_dense_retriever.demo.mini_wiki import load_summaries, write_corpus
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401

PASSIVE_IN_OPENMP = "OMP_WAIT_POLICY = 'PASSIVE'"  # libgomp's OMP_DISPLAY_ENV line


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
    assert cpu_threads.cgroup_cpu_quota(proc) == 1.5


def test_cgroup_v2_quota_of_a_parent_caps_its_children(tmp_path):
    mount = tmp_path / "cgroup2"
    cgroup_dir(mount, "kubepods/pod1", cpu__max="200000 100000")
    cgroup_dir(mount, "kubepods/pod1/c1", cpu__max="max 100000")
    proc = fake_proc_self(tmp_path, "0::/kubepods/pod1/c1\n", [("/", str(mount), "cgroup2", "rw")])
    assert cpu_threads.cgroup_cpu_quota(proc) == 2.0


def test_cgroup_v2_without_a_quota_gives_none(tmp_path):
    mount = tmp_path / "cgroup2"
    cgroup_dir(mount, "user.slice/session.scope", cpu__max="max 100000")
    proc = fake_proc_self(tmp_path, "0::/user.slice/session.scope\n", [("/", str(mount), "cgroup2", "rw")])
    assert cpu_threads.cgroup_cpu_quota(proc) is None


def test_cgroup_v1_cfs_quota_gives_the_quota_in_cpus(tmp_path):
    mount = tmp_path / "cpu,cpuacct"
    cgroup_dir(mount, "docker/abc", cpu__cfs_quota_us="250000", cpu__cfs_period_us="100000")
    proc = fake_proc_self(
        tmp_path,
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
        [("/", str(mount), "cgroup", "rw,cpu,cpuacct"), ("/", str(tmp_path / "unified"), "cgroup2", "rw")],
    )
    assert cpu_threads.cgroup_cpu_quota(proc) == 2.5


def test_cgroup_v1_quota_of_minus_one_means_no_quota(tmp_path):
    mount = tmp_path / "cpu"
    cgroup_dir(mount, "", cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")  # this machine's own layout
    proc = fake_proc_self(tmp_path, "1:cpu:/\n0::/\n", [("/", str(mount), "cgroup", "rw,cpu")])
    assert cpu_threads.cgroup_cpu_quota(proc) is None


def test_a_container_mount_rooted_at_its_own_cgroup_is_read_at_the_mount_point(tmp_path):
    # Docker without a cgroup namespace: /proc/self/cgroup says /docker/abc and so does the mount's root.
    mount = tmp_path / "cpu"
    cgroup_dir(mount, "", cpu__cfs_quota_us="100000", cpu__cfs_period_us="100000")
    proc = fake_proc_self(tmp_path, "4:cpu:/docker/abc\n", [("/docker/abc", str(mount), "cgroup", "rw,cpu")])
    assert cpu_threads.cgroup_cpu_quota(proc) == 1.0


def test_no_cgroup_files_means_no_quota(tmp_path):
    proc = tmp_path / "proc_self"
    proc.mkdir()
    assert cpu_threads.cgroup_cpu_quota(proc) is None


@pytest.mark.parametrize(
    "affinity, quota, expected",
    [(8, None, 8), (8, 2.5, 2), (8, 0.5, 1), (2, 16.0, 2)],
    ids=["affinity only", "quota rounded down", "at least one", "affinity below quota"],
)
def test_usable_cpus_are_the_affinity_capped_by_the_quota(monkeypatch, affinity, quota, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_quota", lambda proc_self=None: quota)
    budget = cpu_threads.usable_cpus()
    assert budget.cpus == expected
    assert budget.affinity == affinity


def test_thread_count_is_num_threads_when_given_else_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(cpu_threads, "cgroup_cpu_quota", lambda proc_self=None: None)
    assert cpu_threads.thread_count() == 3
    assert cpu_threads.thread_count(5) == 5


@pytest.fixture
def fresh_wait_policy(monkeypatch):
    """No OMP_WAIT_POLICY in the environment, and calm_openmp()'s record restored after the test."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(cpu_threads, "_calmed_before_load", cpu_threads._calmed_before_load)


def test_calm_openmp_sets_the_passive_wait_policy_unless_the_user_chose_one(monkeypatch, fresh_wait_policy):
    cpu_threads.calm_openmp()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cpu_threads.calm_openmp()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_calm_openmp_says_when_it_comes_too_late(monkeypatch, fresh_wait_policy):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", object()))
    assert cpu_threads.calm_openmp() is False


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


@needs_two_cpus
def test_server_sizes_its_threads_to_its_affinity_and_sets_the_wait_policy_before_openmp_loads(
    small_wiki, tmp_path, fresh_wait_policy
):
    flags = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir)]  # fmt: skip
    env = {"OMP_DISPLAY_ENV": "TRUE"}  # each OpenMP runtime prints its settings when it loads
    server = ServerProcess(flags, log_path=tmp_path / "server.log", startup_timeout=120, env=env)
    with one_cpu_for_children():
        server.start()
    try:
        threads = httpx.get(f"{server.url}/health").json()["cpu_threads"]
    finally:
        server.stop()
    assert threads["affinity_cpus"] == 1 and threads["usable_cpus"] == 1
    assert threads["torch_threads"] == 1, threads
    assert threads["faiss_threads"] == 1, threads
    assert threads["omp_wait_policy"] == "PASSIVE" and threads["wait_policy_set_before_openmp_loaded"] is True
    # torch's and faiss's own libgomp copies both read it
    assert server.log_path.read_text().count(PASSIVE_IN_OPENMP) == 2, server.log_tail(60)


@needs_two_cpus
def test_index_builder_encodes_with_threads_sized_to_its_affinity_and_the_passive_wait_policy(small_wiki, tmp_path):
    corpus = write_corpus(load_summaries()[:8], tmp_path / "corpus.jsonl")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    with one_cpu_for_children():
        built = subprocess.run(
            [sys.executable, "-m", "local_dense_retriever.index_builder", "--corpus_path", str(corpus),
             "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir),
             "--index_path", str(tmp_path / "x.index"), "--no_progress"],
            cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=300, env={**env, "OMP_DISPLAY_ENV": "TRUE"},
        )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "'torch_threads': 1" in built.stderr, built.stderr[-3000:]
    assert built.stderr.count(PASSIVE_IN_OPENMP) == 2, built.stderr[-3000:]


def test_index_builder_num_threads_overrides_the_detected_count(small_wiki, tmp_path):
    corpus = write_corpus(load_summaries()[:8], tmp_path / "corpus.jsonl")
    built = subprocess.run(
        [sys.executable, "-m", "local_dense_retriever.index_builder", "--corpus_path", str(corpus),
         "--retriever_name", "minilm", "--retriever_model", str(small_wiki.model_dir), "--num_threads", "3",
         "--index_path", str(tmp_path / "x.index"), "--no_progress"],
        cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "'torch_threads': 3" in built.stderr, built.stderr[-3000:]


class FakeCpu:
    """A search whose batches take `seconds[threads]` on a fake clock: the thread counts' speed, set by the test."""

    def __init__(self, seconds: dict[int, float]):
        self.seconds = seconds
        self.now = 0.0
        self.threads: int | None = None
        self.changes: list[int] = []

    def set_threads(self, threads: int) -> None:
        self.threads = threads
        self.changes.append(threads)

    def clock(self) -> float:
        return self.now

    def search(self, queries: list[str], k: int) -> str:
        self.now += self.seconds[self.threads] * len(queries) ** 0.5
        return f"{len(queries)} queries on {self.threads} threads"


def run_batches(search, count: int, size: int = 64) -> None:
    for _ in range(count):
        search(["q"] * size, 3)


def test_thread_ladder_steps_down_by_about_a_third():
    assert cpu_threads.thread_ladder(8) == [8, 6, 4, 3, 2, 1]
    assert cpu_threads.thread_ladder(2) == [2, 1]
    assert cpu_threads.thread_ladder(1) == [1]


def test_tuner_keeps_every_usable_cpu_while_that_is_fastest():
    cpu = FakeCpu({2: 0.212, 1: 0.308})  # one batch of 64 on the idle 2-core machine
    tuner = cpu_threads.ThreadTuner(2, set_threads=cpu.set_threads, clock=cpu.clock)
    search = tuner.wrap(cpu.search)
    assert search(["q"] * 64, 3) == "64 queries on 2 threads"
    run_batches(search, 200)
    assert cpu.threads == 2
    assert tuner.report()["by_batch_size"]["64-127"]["threads"] == 2


def test_tuner_drops_a_thread_while_a_busy_process_holds_a_core_and_takes_it_back_after():
    cpu = FakeCpu({2: 0.212, 1: 0.308})
    tuner = cpu_threads.ThreadTuner(2, set_threads=cpu.set_threads, clock=cpu.clock, probe_every=32)
    search = tuner.wrap(cpu.search)
    run_batches(search, 100)
    cpu.seconds = {2: 0.40, 1: 0.309}  # the same batch beside a process spinning on one core
    run_batches(search, 8)  # the slowdown triggers probes at once, not after 32 batches
    assert tuner.report()["by_batch_size"]["64-127"]["threads"] == 1
    cpu.seconds = {2: 0.212, 1: 0.308}  # one thread is no slower now, so only the periodic probes notice
    run_batches(search, 32)  # the first of them goes back: two threads' busy-time figure is not held against it
    assert tuner.report()["by_batch_size"]["64-127"]["threads"] == 2


def test_tuner_tunes_each_batch_size_on_its_own():
    cpu = FakeCpu({2: 0.2, 1: 0.3})
    tuner = cpu_threads.ThreadTuner(2, set_threads=cpu.set_threads, clock=cpu.clock)
    search = tuner.wrap(cpu.search)
    run_batches(search, 100, size=64)
    cpu.seconds = {2: 0.3, 1: 0.2}
    run_batches(search, 100, size=1)
    by_size = tuner.report()["by_batch_size"]
    assert by_size["1"]["threads"] == 1
    assert by_size["64-127"]["threads"] == 2  # untouched: no batch of that size ran meanwhile


def test_tuner_accepts_a_slower_machine_when_no_other_count_is_faster():
    cpu = FakeCpu({2: 0.2, 1: 0.3})
    tuner = cpu_threads.ThreadTuner(2, set_threads=cpu.set_threads, clock=cpu.clock, probe_every=32)
    search = tuner.wrap(cpu.search)
    run_batches(search, 10)
    cpu.seconds = {2: 0.4, 1: 0.6}  # everything slower, two threads still best
    cpu.changes.clear()
    run_batches(search, 20)  # batches 11-30: the next periodic probe would be batch 32
    assert cpu.changes.count(1) <= 2  # a probe or two while its time settles, not one per batch
    assert tuner.report()["by_batch_size"]["64-127"]["threads"] == 2


def test_ordinary_batch_time_noise_triggers_a_probe_at_most_while_settling():
    cpu = FakeCpu({2: 0.2, 1: 0.3})
    tuner = cpu_threads.ThreadTuner(2, set_threads=cpu.set_threads, clock=cpu.clock, probe_every=32)
    search = tuner.wrap(cpu.search)
    for seconds in [0.16, 0.24, 0.24, 0.16, 0.2, 0.2] * 5:  # +-20% around 0.2 s, no trend
        cpu.seconds[2] = seconds
        search(["q"] * 64, 3)
    assert tuner.report()["by_batch_size"]["64-127"]["probes"] <= 1


def test_tuner_resizes_the_pools_only_when_the_count_changes():
    cpu = FakeCpu({2: 0.2, 1: 0.3})
    search = cpu_threads.ThreadTuner(2, set_threads=cpu.set_threads, clock=cpu.clock, probe_every=32).wrap(cpu.search)
    run_batches(search, 65)
    assert cpu.changes == [2, 1, 2, 1, 2]  # the first batch, then batches 32 and 64 probe one thread, and back


def test_num_threads_fixes_the_count_and_leaves_search_unwrapped():
    cpu = FakeCpu({3: 0.2})
    tuner = cpu_threads.ThreadTuner(3, adaptive=False, set_threads=cpu.set_threads, clock=cpu.clock)
    assert tuner.wrap(cpu.search) == cpu.search
    assert tuner.report()["adaptive_threads"] is False
