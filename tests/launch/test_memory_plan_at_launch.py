"""The retriever's memory plan before any GPU is spent: the launch (python -m slime_search_r1.launch,
what run_qwen2.5_3B.sh runs) checks a retrieval server that NODE_RETRIEVER_* say shares the node, and the tmux wrapper
(run_qwen2.5_3B_with_retrieval.sh) checks the server it is about to start, beside what train.py's flags declare:
SGLang's --sglang-mem-fraction-static and what the colocated trainer keeps (6 GiB). Both print the plan, and
refuse a layout that cannot fit with one line that holds the figures."""

import shutil
import sys
from pathlib import Path

import pytest

from local_dense_retriever.retrieval.memory_plan import gib, plan_memory
from local_dense_retriever.serving.launcher import ServerFacts, preflight
from slime_search_r1.launch import retriever_server
from slime_search_r1.launch.command import read_flags
from slime_search_r1.launch.retriever_memory import TrainingGpus, declared_training
from slime_search_r1.settings.sources import read_environment
from slime_search_r1.settings.table import WRAPPER, read_by
from support.launch_runs import SCRIPT, dry_run_here, launch_here, run_script
from support.loopback import free_port
from support.retriever_fixtures import small_wiki_fixture  # noqa: F401
from test_wrapper import logs, run_wrapper, tmux_server_running
from test_wrapper import wrapper_env_fixture  # noqa: F401

WIKI_18 = "21015324"  # Search-R1's corpus: 21M passages x 768 (e5-base-v2)
# 80 GiB x (1 - 0.7, run_qwen2.5_3B.sh's --sglang-mem-fraction-static) - 6 GiB trainer - 1 GiB reserve
LEFT_ON_AN_80_GIB_GPU = "80.0 GiB x (1 - 0.7 SGLang static fraction) - 6.0 GiB trainer - 1.0 GiB reserve = 17.0 GiB"
NO_NVIDIA_SMI = str(Path(sys.executable).parent)  # a PATH without nvidia-smi: each GPU's memory is not known


def per_gpu(layout: str, gpus: int, corpus_size: int = int(WIKI_18), dim: int = 768) -> str:
    return gib(plan_memory(layout, corpus_size, dim, gpus).gpu_bytes)


# ---- the launch: NODE_RETRIEVER_* describe a server sharing the node


def test_the_launch_prints_the_plan_of_a_server_that_fits_beside_training(monkeypatch, capsys):
    run = dry_run_here(monkeypatch, capsys, NODE_RETRIEVER_LAYOUT="torch-fp16", NODE_RETRIEVER_CORPUS_SIZE=WIKI_18,
                       GPU_MEMORY_GIB="80")  # fmt: skip
    plan = [line for line in run.stdout.splitlines() if line.startswith("# memory plan")]
    assert plan == [
        "# memory plan (NODE_RETRIEVER_LAYOUT=torch-fp16 on NODE_RETRIEVER_GPUS=0-7): layout torch-fp16, "
        f"21,015,324 x 768: RAM {gib(plan_memory('torch-fp16', int(WIKI_18), 768, 8).ram_bytes)} (a load chunk: "
        f"vectors stream from the memory-mapped file); per GPU over 8: {per_gpu('torch-fp16', 8)} (vectors 3.8 GiB "
        "+ workspace 1.0 GiB + encoder 0.2 GiB + CUDA context 0.6 GiB)"
    ]
    assert (
        "# beside training (SGLang and the colocated trainer on GPU(s) 0-7, --sglang-mem-fraction-static 0.7): GPU 0 "
        f"(SGLang and the colocated trainer) leaves {LEFT_ON_AN_80_GIB_GPU} (GPU memory: GPU_MEMORY_GIB); the plan's "
        f"{per_gpu('torch-fp16', 8)} fits"
    ) in run.stdout.splitlines()
    assert run.train_args  # the command is still printed after the plan


def test_the_launch_refuses_a_layout_that_cannot_fit_beside_training_with_the_figures():
    """Through the script itself (bash run_qwen2.5_3B.sh --dry-run): the whole wiki-18 on one 80 GiB GPU."""
    result = run_script("--dry-run", NODE_RETRIEVER_LAYOUT="torch-fp16", NODE_RETRIEVER_GPUS="0",
                        NODE_RETRIEVER_CORPUS_SIZE=WIKI_18, GPU_MEMORY_GIB="80")  # fmt: skip
    assert result.returncode == 1
    error = result.stderr.splitlines()[-1]
    assert error.startswith(
        "run_qwen2.5_3B.sh: error: NODE_RETRIEVER_LAYOUT=torch-fp16 on NODE_RETRIEVER_GPUS=0: layout torch-fp16 over "
        f"1 GPU(s) needs {per_gpu('torch-fp16', 1)} on its most loaded GPU but GPU 0 (SGLang and the colocated "
        f"trainer) leaves {LEFT_ON_AN_80_GIB_GPU} (GPU memory: GPU_MEMORY_GIB); what would fit: --torch_search over "
        f"2 GPUs (torch-fp16: {per_gpu('torch-fp16', 2)} each; --torch_search 0,1); --sglang-mem-fraction-static "
    )
    assert "# Ray" not in result.stdout  # nothing printed as if it would run


def test_a_lower_sglang_fraction_makes_room(monkeypatch, capsys):
    """The budget follows train.py's flags (the last --sglang-mem-fraction-static wins)."""
    env = {"NODE_RETRIEVER_LAYOUT": "torch-fp16", "NODE_RETRIEVER_GPUS": "0", "NODE_RETRIEVER_CORPUS_SIZE": WIKI_18,
           "GPU_MEMORY_GIB": "80"}  # fmt: skip
    code, _, stderr = launch_here(monkeypatch, capsys, "--dry-run", **env)
    assert code == 1 and "needs 31.9 GiB" in stderr
    run = dry_run_here(monkeypatch, capsys, "--sglang-mem-fraction-static", "0.5", **env)
    assert "- 6.0 GiB trainer - 1.0 GiB reserve = 33.0 GiB (GPU memory: GPU_MEMORY_GIB); the plan's 31.9 GiB fits" in (
        run.stdout
    )


def test_a_cpu_layout_holds_no_gpu_and_unknown_gpu_memory_is_a_warning(monkeypatch, capsys):
    run = dry_run_here(monkeypatch, capsys, NODE_RETRIEVER_LAYOUT="HNSW32,SQ8", NODE_RETRIEVER_CORPUS_SIZE=WIKI_18)
    assert "# memory plan (NODE_RETRIEVER_LAYOUT=HNSW32,SQ8): layout HNSW32,SQ8, 21,015,324 x 768: RAM" in run.stdout
    assert not [line for line in run.stdout.splitlines() if line.startswith("# beside training")]
    run = dry_run_here(monkeypatch, capsys, NODE_RETRIEVER_LAYOUT="torch-fp16", NODE_RETRIEVER_CORPUS_SIZE=WIKI_18,
                       PATH=NO_NVIDIA_SMI)  # fmt: skip
    assert (
        "run_qwen2.5_3B.sh: warning: each GPU's memory is not known (no nvidia-smi here; set GPU_MEMORY_GIB): the "
        f"plan's {per_gpu('torch-fp16', 8)} per GPU is not checked"
    ) in run.stderr


def test_without_node_retriever_layout_nothing_is_planned(monkeypatch, capsys):
    run = dry_run_here(monkeypatch, capsys, GPU_MEMORY_GIB="1")  # a GPU too small for anything: nothing is checked
    assert "memory plan" not in run.stdout + run.stderr


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        ({"NODE_RETRIEVER_LAYOUT": "HNSW-32"}, (), "NODE_RETRIEVER_LAYOUT: "),
        ({"NODE_RETRIEVER_LAYOUT": "torch-fp16"}, (),
         "NODE_RETRIEVER_LAYOUT is set but NODE_RETRIEVER_CORPUS_SIZE is not; accepted: the retriever's passages"),
        ({"NODE_RETRIEVER_CORPUS_SIZE": "0"}, (), "NODE_RETRIEVER_CORPUS_SIZE='0' is out of range; accepted: >= 1"),
        ({"NODE_RETRIEVER_DIM": "wide"}, (), "NODE_RETRIEVER_DIM='wide' is invalid"),
        ({"NODE_RETRIEVER_GPUS": "0-x"}, (), "NODE_RETRIEVER_GPUS='0-x' is invalid; accepted: GPU ids like 0-7"),
        ({"NODE_RETRIEVER_LAYOUT": "Flat", "NODE_RETRIEVER_CORPUS_SIZE": "100", "NODE_RETRIEVER_GPUS": "0"}, (),
         "NODE_RETRIEVER_GPUS=0 with NODE_RETRIEVER_LAYOUT=Flat: a CPU layout uses no GPU"),
        ({"NODE_RETRIEVER_LAYOUT": "torch-fp16", "NODE_RETRIEVER_CORPUS_SIZE": "100", "NODE_RETRIEVER_GPUS": "6-9",
          "GPU_MEMORY_GIB": "80"}, (),
         "NODE_RETRIEVER_LAYOUT=torch-fp16 on NODE_RETRIEVER_GPUS=6-9: GPU 9 is not on the node "
         "(--num-gpus-per-node 8); accepted: GPU ids 0-7"),
        ({"GPU_MEMORY_GIB": "0"}, (), "GPU_MEMORY_GIB='0' is out of range; accepted: >= 0.1"),
        ({}, ("--sglang-mem-fraction-static", "1.2"),
         "--sglang-mem-fraction-static 1.2: accepted is a fraction in [0, 1)"),
    ],
)  # fmt: skip
def test_bad_memory_settings_stop_the_launch_with_one_line(monkeypatch, capsys, env, args, message):
    code, _, stderr = launch_here(monkeypatch, capsys, "--dry-run", *args, **env)
    assert code == 1
    assert stderr.startswith("run_qwen2.5_3B.sh: error: ") and message in stderr, stderr
    assert stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], TrainingGpus(8, colocated=tuple(range(8)), sglang_fraction=0.7)),
        (["--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4", "--colocate"],
         TrainingGpus(4, colocated=tuple(range(4)), sglang_fraction=0.7)),
        (["--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4"],  # slime: the trainer's GPUs first
         TrainingGpus(8, trainer_only=(0, 1, 2, 3), rollout_only=(4, 5, 6, 7), sglang_fraction=0.7)),
    ],
)  # fmt: skip
def test_what_train_py_flags_declare_on_each_gpu(args, expected):
    flags = ["--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "8", "--colocate",
             "--sglang-mem-fraction-static", "0.7"]  # fmt: skip
    if args:
        flags = ["--num-gpus-per-node", "8" if "--colocate" not in args else "4", "--sglang-mem-fraction-static",
                 "0.7", *args]  # fmt: skip
    assert declared_training(read_flags(flags)) == expected


# ---- the tmux wrapper: the server it would start, before anything starts


@pytest.fixture
def launch_as_training(wrapper_env):
    """The wrapper with its default TRAIN_CMD's script (run_qwen2.5_3B.sh), asked what training holds."""
    return {**wrapper_env, "TRAIN_CMD": f"bash {SCRIPT}", "PYTHON_BIN": sys.executable}


def assert_nothing_started(env) -> None:
    assert not tmux_server_running(env)
    assert not Path(env["LOG_DIR"]).exists()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_wrapper_refuses_a_gpu_layout_beside_the_declared_training_before_anything_starts(launch_as_training):
    """A 24 GiB GPU shared with run_qwen2.5_3B.sh's colocated training leaves 24 x 0.3 - 6 - 1 = 0.2 GiB."""
    args = launch_as_training["RETRIEVER_ARGS"] + " --torch_search 0"
    env = {**launch_as_training, "RETRIEVER_ARGS": args, "GPU_MEMORY_GIB": "24"}
    result = run_wrapper(env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        "run_qwen2.5_3B_with_retrieval.sh: error: --torch_search 0 (RETRIEVER_ARGS): layout torch-fp16 over 1 "
        "GPU(s) needs "
    )
    assert (
        "on its most loaded GPU but GPU 0 (SGLang and the colocated trainer) leaves 24.0 GiB x (1 - 0.7 SGLang static "
        "fraction) - 6.0 GiB trainer - 1.0 GiB reserve = 0.2 GiB (GPU memory: GPU_MEMORY_GIB); what would fit: "
    ) in result.stderr
    assert_nothing_started(env)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_training_launch_that_would_fail_stops_the_wrapper_when_asked(launch_as_training):
    """Asked what training holds, the launch checks its own settings first: a bad one stops the wrapper then."""
    args = launch_as_training["RETRIEVER_ARGS"] + " --torch_search 0"
    env = {**launch_as_training, "RETRIEVER_ARGS": args, "GPU_MEMORY_GIB": "80", "NUM_GPUS": "0"}
    result = run_wrapper(env, timeout=120)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        "run_qwen2.5_3B_with_retrieval.sh: error: training would not start (TRAIN_CMD's launch, asked first: exit "
        "code 1): run_qwen2.5_3B.sh: error: environment variable NUM_GPUS='0' is out of range; accepted: >= 1"
    )
    assert_nothing_started(env)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_wrapper_refuses_an_index_that_does_not_fit_in_ram(wrapper_env, small_wiki):
    env = {**wrapper_env, "RETRIEVER_RAM_GIB": "0.1", "TRAIN_CMD": "exit 0"}
    result = run_wrapper(env, timeout=120)
    assert result.returncode == 1
    error = result.stderr.splitlines()[-1]
    assert error.startswith(
        f"run_qwen2.5_3B_with_retrieval.sh: error: --index_path {small_wiki.index_path} (RETRIEVER_ARGS), on the CPU: "
        "layout Flat needs "
    )
    assert error.endswith(
        "of RAM (index 0.4 MiB + encoder) but 102.4 MiB is available (RETRIEVER_RAM_GIB); what would fit: none of the "
        "layouts (the encoder alone needs 0.4 GiB): free memory or raise RETRIEVER_RAM_GIB"
    )
    assert_nothing_started(env)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_wrapper_prints_the_plan_of_a_cpu_server_and_hands_the_launch_none(wrapper_env, small_wiki, tmp_path):
    """A layout that fits: the plan is printed and the server starts; on the CPU it holds no GPU, so training sees no
    NODE_RETRIEVER_* (not even the caller's: they described another server)."""
    seen = tmp_path / "node_retriever.env"
    env = {**wrapper_env, "TRAIN_CMD": f"env | grep ^NODE_RETRIEVER_ | sort > {seen}", "NODE_RETRIEVER_DIM": "1024"}
    result = run_wrapper(env)
    assert result.returncode == 0, result.stderr
    size = len(small_wiki.titles)
    ram = gib(plan_memory("Flat", size, 384).ram_bytes)
    assert (
        f"run_qwen2.5_3B_with_retrieval.sh: memory plan (--index_path {small_wiki.index_path} (RETRIEVER_ARGS), on "
        f"the CPU): layout Flat, {size:,} x 384: RAM {ram} (index "
    ) in result.stderr
    assert f"run_qwen2.5_3B_with_retrieval.sh: RAM: {ram} of the " in result.stderr
    assert "TRAIN_CMD" not in result.stderr  # a CPU layout: what training holds on the GPUs is not asked
    assert "Uvicorn running" in logs(env, "retrieval_server")
    assert seen.read_text() == ""


def test_the_wrapper_checks_a_fitting_gpu_layout_beside_what_the_launch_declares(monkeypatch, capsys):
    """The wrapper's check on the flags a GPU node would run (no GPU here: the plan needs none), with training asked
    from run_qwen2.5_3B.sh itself."""
    monkeypatch.setenv("PYTHON_BIN", sys.executable)
    knobs, _ = read_environment(read_by(WRAPPER), {
        "GPU_MEMORY_GIB": "80", "RETRIEVER_FAISS_GPU": "0", "RETRIEVER_ARGS": "--torch_search 2,3",
        "TRAIN_CMD": f"bash {SCRIPT} --sglang-mem-fraction-static 0.6",  # the last one wins
    })  # fmt: skip
    flags = ["--index_path", "wiki.index", "--corpus_path", "wiki.jsonl", "--torch_search", "2,3"]
    facts = ServerFacts(ram_available=64 * 2**30, visible_gpus=0, header={"code": "IxFI", "dim": 768,
                        "size": int(WIKI_18)}, index_bytes=0)  # fmt: skip
    node_env = retriever_server.check_memory(knobs, flags, facts)
    printed = capsys.readouterr().err
    assert ("memory plan (--torch_search 2,3 (RETRIEVER_ARGS)): layout torch-fp16, 21,015,324 x 768: RAM ") in printed
    assert (
        "beside training (SGLang and the colocated trainer on GPU(s) 0-7, --sglang-mem-fraction-static 0.6): GPU 2 "
        "(SGLang and the colocated trainer) leaves 80.0 GiB x (1 - 0.6 SGLang static fraction) - 6.0 GiB trainer - "
        f"1.0 GiB reserve = 25.0 GiB (GPU memory: GPU_MEMORY_GIB); the plan's {per_gpu('torch-fp16', 2)} fits"
    ) in printed
    assert node_env == {
        "NODE_RETRIEVER_LAYOUT": "torch-fp16", "NODE_RETRIEVER_CORPUS_SIZE": WIKI_18, "NODE_RETRIEVER_DIM": "768",
        "NODE_RETRIEVER_GPUS": "2,3",
    }  # fmt: skip


def test_the_wrapper_names_an_index_layout_as_the_plan_does_and_credits_each_flag(small_wiki, tmp_path, capsys):
    """An HNSW index in RETRIEVER_ARGS beside the embedded preset (whose flags, given first, name the Flat index):
    the plan's line names the layout as the memory plan and --list name layouts (HNSW8,SQ8), read from the file in
    the retriever's Python, not FAISS's type code (IHNs), and credits the index path to RETRIEVER_ARGS, not the
    preset; a flag the preset gave (--faiss_mmap on its Flat index) is credited to the preset."""
    import faiss

    flat = faiss.read_index(str(small_wiki.index_path))
    vectors = flat.reconstruct_n(0, flat.ntotal)
    hnsw = faiss.index_factory(flat.d, "HNSW8,SQ8", faiss.METRIC_INNER_PRODUCT)
    hnsw.train(vectors)
    hnsw.add(vectors)
    hnsw_path = tmp_path / "minilm_HNSW8_SQ8.index"
    faiss.write_index(hnsw, str(hnsw_path))
    knobs, _ = read_environment(read_by(WRAPPER), {"RETRIEVER_PRESET": "embedded", "RETRIEVER_FAISS_GPU": "0",
                                                   "RETRIEVER_ARGS": f"--index_path {hnsw_path}"})  # fmt: skip
    preset = ["--index_path", str(small_wiki.index_path), "--corpus_path", str(small_wiki.corpus_path), "--faiss_mmap"]
    flags = [*preset, "--index_path", str(hnsw_path)]
    facts = preflight(sys.executable, flags, "127.0.0.1", free_port())
    retriever_server.check_memory(knobs, flags, facts)
    preset_only, _ = read_environment(read_by(WRAPPER), {"RETRIEVER_PRESET": "embedded", "RETRIEVER_FAISS_GPU": "0"})
    retriever_server.check_memory(preset_only, preset, preflight(sys.executable, preset, "127.0.0.1", free_port()))
    printed = capsys.readouterr().err
    assert (
        f"memory plan (--index_path {hnsw_path} (RETRIEVER_ARGS), on the CPU): layout HNSW8,SQ8, 300 x 384: RAM "
    ) in printed
    assert (
        f"memory plan (--index_path {small_wiki.index_path} (RETRIEVER_PRESET=embedded) --faiss_mmap "
        "(RETRIEVER_PRESET=embedded), on the CPU): layout Flat, 300 x 384: RAM "
    ) in printed
    assert "IHNs" not in printed


def test_the_wrapper_asks_only_a_train_cmd_that_runs_the_launch(tmp_path):
    """A TRAIN_CMD that is not the launch would run for real if asked: it is not asked, and the plan is checked
    against each GPU's total only."""
    ran = tmp_path / "ran"
    assert retriever_server.ask_training(f"touch {ran}") is None
    assert not ran.exists()
    assert retriever_server.runs_the_launch(f"bash {SCRIPT}")
    assert retriever_server.runs_the_launch("python -m slime_search_r1.launch plugin.py -- --colocate")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"RETRIEVER_RAM_GIB": "0"}, "RETRIEVER_RAM_GIB='0' is out of range; accepted: >= 0.1"),
        ({"GPU_MEMORY_GIB": "lots"}, "GPU_MEMORY_GIB='lots' is invalid"),
        ({"RETRIEVER_ARGS": "--torch_search 0,0"}, "--torch_search 0,0: a GPU is named twice"),
    ],
)
def test_bad_memory_settings_stop_the_wrapper_with_one_line(wrapper_env, override, message):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    if "RETRIEVER_ARGS" in override:  # flags given last win
        override = {"RETRIEVER_ARGS": wrapper_env["RETRIEVER_ARGS"] + " " + override["RETRIEVER_ARGS"]}
    result = run_wrapper({**wrapper_env, **override, "TRAIN_CMD": "exit 0"}, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("run_qwen2.5_3B_with_retrieval.sh: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert_nothing_started(wrapper_env)
