#!/usr/bin/env bash
# Search-R1 training with a local retrieval server, both in one tmux session and stopped together.
#
#   bash run_qwen2.5_3B_with_retrieval.sh
#
# 1. checks tmux, the retriever environment, the index and corpus files and that the port is free,
# 2. starts the retrieval server in tmux window 0 ("retriever") with a timestamped log,
# 3. waits until GET /health answers 200 (RETRIEVER_STARTUP_TIMEOUT s, 120 by default),
# 4. starts training (TRAIN_CMD, run_qwen2.5_3B.sh by default) in window 1 ("training") with a timestamped log,
# 5. on exit or Ctrl-C stops exactly what it started; exits with training's exit code (1 if the server dies first).
# RETRIEVAL_SERVER_URL (default http://127.0.0.1:8000) gives the port; a non-local URL (or START_RETRIEVER=0)
# uses that server as it is and starts none. Watch it with: tmux attach -t slime-search-r1
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
NAME="run_qwen2.5_3B_with_retrieval.sh"

die() {
  echo "${NAME}: error: $*" >&2
  exit 1
}

info() {
  echo "${NAME}: $*" >&2
}

usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  echo "Settings (environment variables) and their defaults are at the top of load_settings() in this file."
}

load_settings() {
  TMUX_SESSION=${TMUX_SESSION:-slime-search-r1}
  TMUX_SOCKET=${TMUX_SOCKET:-} # a named tmux server (tmux -L); empty: the default one
  RETRIEVAL_SERVER_URL=${RETRIEVAL_SERVER_URL:-http://127.0.0.1:8000}
  START_RETRIEVER=${START_RETRIEVER:-auto} # auto: start one when the URL is local | 0: use the running one
  local default_python=python3
  [[ -x "${SCRIPT_DIR}/local_dense_retriever/.venv/bin/python" ]] &&
    default_python="${SCRIPT_DIR}/local_dense_retriever/.venv/bin/python"
  RETRIEVER_PYTHON=${RETRIEVER_PYTHON:-$default_python} # e.g. ~/miniconda3/envs/retriever/bin/python
  RETRIEVER_PRESET=${RETRIEVER_PRESET:-} # "embedded": the mini-Wikipedia + MiniLM index (built on first use)
  RETRIEVER_INDEX_PATH=${RETRIEVER_INDEX_PATH:-/root/Index/e5_Flat.index}
  RETRIEVER_CORPUS_PATH=${RETRIEVER_CORPUS_PATH:-/root/Index/wiki-18.jsonl}
  RETRIEVER_NAME=${RETRIEVER_NAME:-e5}
  RETRIEVER_MODEL=${RETRIEVER_MODEL:-intfloat/e5-base-v2}
  RETRIEVER_TOPK=${RETRIEVER_TOPK:-3}
  RETRIEVER_FAISS_GPU=${RETRIEVER_FAISS_GPU:-auto} # auto: --faiss_gpu when nvidia-smi lists a GPU
  RETRIEVER_HOST=${RETRIEVER_HOST:-127.0.0.1}
  # CPU share (see README): the server sizes its threads to the CPUs it may use and never spins idle threads.
  RETRIEVER_NUM_THREADS=${RETRIEVER_NUM_THREADS:-} # --num_threads; empty: the CPUs the server may use
  RETRIEVER_CPUS=${RETRIEVER_CPUS:-}               # e.g. 0-7: run the server under taskset -c on these CPUs only
  RETRIEVER_EXTRA_ARGS=${RETRIEVER_EXTRA_ARGS:-}
  RETRIEVER_STARTUP_TIMEOUT=${RETRIEVER_STARTUP_TIMEOUT:-120}
  SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-60} # seconds training gets to stop after Ctrl-C before SIGTERM
  LOG_DIR=${LOG_DIR:-${SCRIPT_DIR}/logs}
  TRAIN_CMD=${TRAIN_CMD:-bash $(printf '%q' "${SCRIPT_DIR}/run_qwen2.5_3B.sh")}

  [[ "$RETRIEVER_STARTUP_TIMEOUT" =~ ^[0-9]+$ ]] || die "RETRIEVER_STARTUP_TIMEOUT must be whole seconds"
  [[ "$SHUTDOWN_TIMEOUT" =~ ^[0-9]+$ ]] || die "SHUTDOWN_TIMEOUT must be whole seconds"
  case "$START_RETRIEVER" in auto | 0) ;; *) die "START_RETRIEVER=$START_RETRIEVER is invalid; accepted: auto | 0" ;; esac
  [[ -z "$RETRIEVER_NUM_THREADS" || "$RETRIEVER_NUM_THREADS" =~ ^[1-9][0-9]*$ ]] ||
    die "RETRIEVER_NUM_THREADS=$RETRIEVER_NUM_THREADS is invalid; accepted: a whole number from 1, or empty (usable CPUs)"
  [[ -z "$RETRIEVER_CPUS" || "$RETRIEVER_CPUS" =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
    die "RETRIEVER_CPUS=$RETRIEVER_CPUS is invalid; accepted: a CPU list for taskset -c like 0-7 or 0,2,4-6, or empty"
  case "$RETRIEVER_PRESET" in "" | embedded) ;; *) die "RETRIEVER_PRESET=$RETRIEVER_PRESET is invalid; accepted: embedded" ;; esac
  case "${SEARCH_BACKEND:-local}" in
    local) ;;
    *) die "SEARCH_BACKEND=${SEARCH_BACKEND} needs no retrieval server; run run_qwen2.5_3B.sh directly" ;;
  esac
}

tmux_cmd() {
  if [[ -n "$TMUX_SOCKET" ]]; then
    tmux -L "$TMUX_SOCKET" "$@"
  else
    tmux "$@"
  fi
}

# Sets URL_BASE (scheme://host:port), URL_HOST and URL_PORT from one URL; dies on anything else.
parse_url() {
  local url=$1
  [[ "$url" =~ ^(https?)://(\[[0-9a-fA-F:.]+\]|[^/:]+)(:([0-9]+))?(/.*)?$ ]] ||
    die "RETRIEVAL_SERVER_URL='$url' is not a URL like http://127.0.0.1:8000 (the /retrieve path is optional)"
  local scheme=${BASH_REMATCH[1]}
  URL_HOST=${BASH_REMATCH[2]}
  URL_PORT=${BASH_REMATCH[4]:-}
  [[ -n "$URL_PORT" ]] || URL_PORT=$([[ "$scheme" == https ]] && echo 443 || echo 80)
  URL_BASE="${scheme}://${URL_HOST}:${URL_PORT}"
}

is_local_host() {
  case "$1" in
    127.0.0.1 | localhost | "[::1]") return 0 ;;
    *) return 1 ;;
  esac
}

# 200 from /health means ready; a server without /health (404) counts as ready if /retrieve answers.
server_ready() {
  local base=$1 code
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "${base}/health" || true)
  [[ "$code" == 200 ]] && return 0
  [[ "$code" == 404 ]] || return 1
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H 'Content-Type: application/json' \
    -d '{"queries": ["health check"], "topk": 1, "return_scores": false}' "${base}/retrieve" || true)
  [[ "$code" == 200 ]]
}

decide_what_to_start() {
  local -a urls
  IFS=',' read -r -a urls <<<"$RETRIEVAL_SERVER_URL"
  SERVER_BASES=()
  local url
  for url in "${urls[@]}"; do
    url=${url//[[:space:]]/}
    [[ -z "$url" ]] && continue
    parse_url "$url"
    SERVER_BASES+=("$URL_BASE")
  done
  ((${#SERVER_BASES[@]})) || die "RETRIEVAL_SERVER_URL is empty"
  START_LOCAL=0
  if [[ "$START_RETRIEVER" == auto && ${#SERVER_BASES[@]} -eq 1 ]]; then
    # URL_HOST and URL_PORT are the single URL's, parsed in the loop above
    if is_local_host "$URL_HOST"; then
      START_LOCAL=1
    fi
  fi
}

apply_preset() {
  [[ "$RETRIEVER_PRESET" == embedded ]] || return 0
  info "preparing the embedded mini-Wikipedia index (built once, cached under ${SCRIPT_DIR}/.cache; minutes on CPU)"
  local -a flags
  mapfile -t flags < <(cd "$SCRIPT_DIR" && "$RETRIEVER_PYTHON" -m local_dense_retriever.demo --print_server_flags)
  ((${#flags[@]})) || die "could not prepare the embedded index (see the error above)"
  local i
  for ((i = 0; i + 1 < ${#flags[@]}; i += 2)); do
    case "${flags[i]}" in
      --index_path) RETRIEVER_INDEX_PATH=${flags[i + 1]} ;;
      --corpus_path) RETRIEVER_CORPUS_PATH=${flags[i + 1]} ;;
      --retriever_name) RETRIEVER_NAME=${flags[i + 1]} ;;
      --retriever_model) RETRIEVER_MODEL=${flags[i + 1]} ;;
      --topk) ;; # RETRIEVER_TOPK decides
      *) RETRIEVER_EXTRA_ARGS="${flags[i]} ${flags[i + 1]} ${RETRIEVER_EXTRA_ARGS}" ;;
    esac
  done
}

check_port_free() {
  "$RETRIEVER_PYTHON" - "$RETRIEVER_HOST" "$URL_PORT" <<'PY' || return 1
import socket
import sys

host, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
with socket.socket(family, socket.SOCK_STREAM) as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sys.exit(1)
PY
}

check_prerequisites() {
  command -v tmux >/dev/null || die "tmux is not installed (apt-get install tmux)"
  command -v curl >/dev/null || die "curl is not installed (apt-get install curl); it probes the server's /health"
  [[ -n "$TRAIN_CMD" ]] || die "TRAIN_CMD is empty"
  if tmux_cmd has-session -t "=${TMUX_SESSION}" 2>/dev/null; then
    die "tmux session '${TMUX_SESSION}' already exists (an earlier run?); attach with 'tmux attach -t ${TMUX_SESSION}' \
and stop it, or set TMUX_SESSION to another name"
  fi
  ((START_LOCAL)) || return 0

  command -v "$RETRIEVER_PYTHON" >/dev/null ||
    die "retriever Python '$RETRIEVER_PYTHON' not found; set RETRIEVER_PYTHON to the retriever environment's python"
  local missing
  missing=$("$RETRIEVER_PYTHON" -c '
import importlib.util
mods = ["torch", "transformers", "faiss", "fastapi", "uvicorn", "orjson", "pydantic"]
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))' 2>&1) ||
    die "'$RETRIEVER_PYTHON' does not run: $missing"
  [[ -z "$missing" ]] || die "the retriever environment ('$RETRIEVER_PYTHON') lacks: ${missing}; install them there \
(pip install -e '${SCRIPT_DIR}[retriever]') or point RETRIEVER_PYTHON at the right environment"
  [[ -f "${SCRIPT_DIR}/local_dense_retriever/retrieval_server.py" ]] ||
    die "local_dense_retriever/retrieval_server.py is missing next to this script"
  if [[ -n "$RETRIEVER_CPUS" ]]; then
    command -v taskset >/dev/null || die "RETRIEVER_CPUS needs taskset (apt-get install util-linux)"
    taskset -c "$RETRIEVER_CPUS" true 2>/dev/null ||
      die "RETRIEVER_CPUS=$RETRIEVER_CPUS names no CPU this script may use (allowed: $(taskset -cp $$ | sed 's/.*: //'))"
  fi

  apply_preset
  [[ -e "$RETRIEVER_CORPUS_PATH" ]] ||
    die "corpus not found: ${RETRIEVER_CORPUS_PATH} (set RETRIEVER_CORPUS_PATH; wiki-18.jsonl comes from download.py)"
  [[ -e "$RETRIEVER_INDEX_PATH" ]] ||
    die "index not found: ${RETRIEVER_INDEX_PATH} (set RETRIEVER_INDEX_PATH; cat part_* > e5_Flat.index after download)"
  check_port_free || die "port ${URL_PORT} on ${RETRIEVER_HOST} is in use (see: ss -ltnp 'sport = :${URL_PORT}'); \
stop what holds it, or choose another port with RETRIEVAL_SERVER_URL=http://127.0.0.1:<port>, or reuse a running \
server with START_RETRIEVER=0"
}

retriever_command() {
  local -a cmd extra
  cmd=()
  [[ -z "$RETRIEVER_CPUS" ]] || cmd+=(taskset -c "$RETRIEVER_CPUS") # exec keeps the pid the wrapper stops
  cmd+=(
    "$RETRIEVER_PYTHON" "${SCRIPT_DIR}/local_dense_retriever/retrieval_server.py"
    --index_path "$RETRIEVER_INDEX_PATH"
    --corpus_path "$RETRIEVER_CORPUS_PATH"
    --topk "$RETRIEVER_TOPK"
    --retriever_name "$RETRIEVER_NAME"
    --retriever_model "$RETRIEVER_MODEL"
    --host "$RETRIEVER_HOST"
    --port "$URL_PORT"
  )
  local gpu=$RETRIEVER_FAISS_GPU
  if [[ "$gpu" == auto ]]; then
    gpu=0
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU' && gpu=1
  fi
  [[ "$gpu" == 1 ]] && cmd+=(--faiss_gpu)
  [[ -z "$RETRIEVER_NUM_THREADS" ]] || cmd+=(--num_threads "$RETRIEVER_NUM_THREADS")
  read -r -a extra <<<"$RETRIEVER_EXTRA_ARGS"
  cmd+=("${extra[@]}")
  printf '%q ' "${cmd[@]}"
}

# The tmux server may be older than this shell (another session), so its environment is not ours: each
# window restores this script's environment from a NUL-separated snapshot before it runs anything.
# shellcheck disable=SC2016 # the $ expressions belong to the generated scripts
write_window_scripts() {
  env -0 >"${RUN_DIR}/env.bin"
  cat >"${RUN_DIR}/restore_env.sh" <<'SH'
while IFS= read -r -d '' entry; do
  name=${entry%%=*}
  case "$name" in TMUX | TMUX_PANE | SHELLOPTS | BASHOPTS | BASH_* | _ | SHLVL | PWD | OLDPWD) continue ;; esac
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && export "$entry"
done <"$(dirname "${BASH_SOURCE[0]}")/env.bin"
SH
  local cmd
  if ((START_LOCAL)); then
    cmd=$(retriever_command)
    {
      printf 'source %q\n' "${RUN_DIR}/restore_env.sh"
      printf 'cd %q\n' "$PWD"
      printf 'echo $$ >%q\n' "${RUN_DIR}/retriever.pid"
      echo "# tee ignores Ctrl-C in this window so that the server's last words still reach the log"
      printf 'exec > >(trap "" INT TERM; exec tee -a %q) 2>&1\n' "$RETRIEVER_LOG"
      printf 'echo "$(date "+%%F %%T") starting:" %q\n' "$cmd"
      printf 'exec %s\n' "$cmd"
    } >"${RUN_DIR}/retriever.sh"
  fi
  {
    printf 'source %q\n' "${RUN_DIR}/restore_env.sh"
    printf 'cd %q\n' "$PWD"
    echo "# Ctrl-C and SIGTERM reach the training command; this shell stays to record its exit code"
    echo "trap ':' INT TERM"
    printf 'echo "$(date "+%%F %%T") starting:" %q | tee -a %q\n' "$TRAIN_CMD" "$TRAINING_LOG"
    printf '{ %s\n} 2>&1 | (trap "" INT TERM; exec tee -a %q)\n' "$TRAIN_CMD" "$TRAINING_LOG"
    echo 'status=${PIPESTATUS[0]}'
    printf 'echo "$status" >%q && mv %q %q\n' "${RUN_DIR}/training.exit.tmp" "${RUN_DIR}/training.exit.tmp" \
      "${RUN_DIR}/training.exit"
  } >"${RUN_DIR}/training.sh"
}

log_tail() {
  echo "---- last lines of $1 ----" >&2
  tail -n "${2:-30}" "$1" >&2 2>/dev/null || true
  echo "----" >&2
}

pid_alive() {
  [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null
}

# Runs "$@" every 0.1 s while it succeeds, for at most $1 seconds of wall-clock time (a budget in loop turns would
# stretch on a loaded machine, where every `sleep` and `kill -0` takes longer). Fails if the time ran out.
wait_while() {
  local deadline=$((SECONDS + $1))
  shift
  while "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

no_pid_file_yet() {
  [[ ! -s "${RUN_DIR}/retriever.pid" ]]
}

SESSION_CREATED=0
RETRIEVER_PID=""
TRAINING_PANE_PID=""
RUN_DIR=""
EXIT_CODE=""

start_retriever() {
  info "starting the retrieval server on ${RETRIEVER_HOST}:${URL_PORT} in tmux window 'retriever' (log: ${RETRIEVER_LOG})"
  tmux_cmd new-session -d -s "$TMUX_SESSION" -n retriever -c "$PWD" "bash $(printf '%q' "${RUN_DIR}/retriever.sh")"
  SESSION_CREATED=1
  wait_while 10 no_pid_file_yet || die "the retriever window did not start (tmux session ${TMUX_SESSION})"
  RETRIEVER_PID=$(<"${RUN_DIR}/retriever.pid")
}

wait_until_ready() {
  local base started=$SECONDS
  for base in "${SERVER_BASES[@]}"; do
    info "waiting for ${base}/health (up to ${RETRIEVER_STARTUP_TIMEOUT} s)"
    until server_ready "$base"; do
      if ((START_LOCAL)) && ! pid_alive "$RETRIEVER_PID"; then
        RETRIEVER_PID=""
        log_tail "$RETRIEVER_LOG"
        die "the retrieval server exited during startup (log above: ${RETRIEVER_LOG})"
      fi
      if ((SECONDS - started >= RETRIEVER_STARTUP_TIMEOUT)); then
        ((START_LOCAL)) && log_tail "$RETRIEVER_LOG"
        die "${base} was not healthy after ${RETRIEVER_STARTUP_TIMEOUT} s; a large index can take longer to load \
(raise RETRIEVER_STARTUP_TIMEOUT), or check the server"
      fi
      sleep 1
    done
  done
  info "retrieval server ready after $((SECONDS - started)) s"
}

start_training() {
  info "starting training in tmux window 'training' (log: ${TRAINING_LOG})"
  local script
  script="bash $(printf '%q' "${RUN_DIR}/training.sh")"
  if ((SESSION_CREATED)); then
    TRAINING_PANE_PID=$(tmux_cmd new-window -d -P -F '#{pane_pid}' -t "${TMUX_SESSION}:" -n training -c "$PWD" "$script")
  else
    TRAINING_PANE_PID=$(tmux_cmd new-session -d -P -F '#{pane_pid}' -s "$TMUX_SESSION" -n training -c "$PWD" "$script")
    SESSION_CREATED=1
  fi
  local attach="tmux attach -t ${TMUX_SESSION}"
  [[ -z "$TMUX_SOCKET" ]] || attach="tmux -L ${TMUX_SOCKET} attach -t ${TMUX_SESSION}"
  info "watch with: ${attach}   (Ctrl-C here stops training and the server)"
}

wait_for_training() {
  while [[ ! -f "${RUN_DIR}/training.exit" ]]; do
    if ((START_LOCAL)) && ! pid_alive "$RETRIEVER_PID"; then
      RETRIEVER_PID=""
      log_tail "$RETRIEVER_LOG"
      die "the retrieval server died during training (log above); stopping training"
    fi
    if ! pid_alive "$TRAINING_PANE_PID"; then
      [[ -f "${RUN_DIR}/training.exit" ]] && break
      TRAINING_PANE_PID=""
      die "the training window closed without an exit code (killed?); see ${TRAINING_LOG}"
    fi
    sleep 0.5
  done
  EXIT_CODE=$(<"${RUN_DIR}/training.exit")
  info "training exited with code ${EXIT_CODE}"
}

training_running() {
  pid_alive "$TRAINING_PANE_PID" && [[ ! -f "${RUN_DIR}/training.exit" ]]
}

# Stops in bounded wall-clock time: at most SHUTDOWN_TIMEOUT s after Ctrl-C, then 10 s after SIGTERM.
stop_training() {
  training_running || return 0
  info "stopping training (Ctrl-C in its window, up to ${SHUTDOWN_TIMEOUT} s)"
  tmux_cmd send-keys -t "=${TMUX_SESSION}:training" C-c 2>/dev/null || true
  if ! wait_while "$SHUTDOWN_TIMEOUT" training_running; then
    info "training did not stop; sending SIGTERM to its window's process group"
    kill -TERM -- "-${TRAINING_PANE_PID}" 2>/dev/null || true
    wait_while 10 training_running || true
  fi
}

retriever_alive() {
  pid_alive "$RETRIEVER_PID"
}

stop_retriever() {
  retriever_alive || return 0
  info "stopping the retrieval server (pid ${RETRIEVER_PID})"
  kill -TERM "$RETRIEVER_PID" 2>/dev/null || true
  if ! wait_while 15 retriever_alive; then
    info "the retrieval server ignored SIGTERM for 15 s; sending SIGKILL"
    kill -KILL "$RETRIEVER_PID" 2>/dev/null || true
  fi
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM HUP
  trap '' INT # a second Ctrl-C must not cut the cleanup short
  stop_training
  stop_retriever
  if ((SESSION_CREATED)); then
    tmux_cmd kill-session -t "=${TMUX_SESSION}" 2>/dev/null || true
  fi
  [[ -z "$RUN_DIR" ]] || rm -rf "$RUN_DIR"
  [[ -z "$EXIT_CODE" ]] || status=$EXIT_CODE
  [[ -z "${TRAINING_LOG:-}" || ! -f "${TRAINING_LOG:-}" ]] || info "training log: ${TRAINING_LOG}"
  exit "$status"
}

main() {
  case "${1:-}" in
    -h | --help)
      usage
      exit 0
      ;;
    "") ;;
    *) die "unknown argument '$1'; settings are environment variables (see --help)" ;;
  esac
  load_settings
  decide_what_to_start
  check_prerequisites
  export RETRIEVAL_SERVER_URL SEARCH_BACKEND=local

  mkdir -p "$LOG_DIR"
  local stamp
  stamp=$(date +%Y%m%d_%H%M%S)
  RETRIEVER_LOG="${LOG_DIR}/retrieval_server_${stamp}.log"
  TRAINING_LOG="${LOG_DIR}/training_${stamp}.log"
  RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/search-r1-wrapper.XXXXXX")
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  write_window_scripts

  if ((START_LOCAL)); then
    start_retriever
  else
    info "using the retrieval server(s) at ${RETRIEVAL_SERVER_URL}; none is started here"
  fi
  wait_until_ready
  start_training
  wait_for_training
}

main "$@"
