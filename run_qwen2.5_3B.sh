#!/usr/bin/env bash
# Search-R1 GRPO training of Qwen2.5-3B with slime: colocated SGLang rollout and Megatron training on one node.
#
#   bash run_qwen2.5_3B.sh [--dry-run] [extra train.py flags ...]
#
# Every path and setting comes from an environment variable (the defaults are the slime example's).
# DRY_RUN=1 (or --dry-run) checks the settings and prints the commands instead of running them (and, after them,
# the viewer command for DUMP_DIR and the commands from a checkpoint in SAVE_DIR to evaluate.py). Either way the
# plugin's configuration and the slime flags are checked here, with the messages generate() would give at its
# first sample, before Ray, SGLang or Megatron start (python -m slime_search_r1.launch_check; SKIP_PLUGIN_CHECK=1 skips).
# The plugin's own variables (LLM_API_MODE, SEARCH_BACKEND, RETRIEVAL_SERVER_URL, SEARCH_R1_*, ...) are
# forwarded to the Ray job. Nothing is killed at start: a Ray head is started only when none answers at
# RAY_DASHBOARD_URL (START_RAY=auto), and on exit the script stops only the job and the head it started.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"

die() {
  echo "run_qwen2.5_3B.sh: error: $*" >&2
  exit 1
}

warn() {
  echo "run_qwen2.5_3B.sh: warning: $*" >&2
}

info() {
  echo "run_qwen2.5_3B.sh: $*" >&2
}

# 1/true/yes/on and 0/false/no/off (or empty); anything else is a typo worth stopping for.
is_true() {
  local name=$1 value=${2,,}
  case "$value" in
    1 | true | yes | on) return 0 ;;
    0 | false | no | off | "") return 1 ;;
    *) die "$name=$2 is not a boolean; use 1/true/yes/on or 0/false/no/off" ;;
  esac
}

usage() {
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  echo "See the variables at the top of load_settings() in this file for every setting and its default."
}

load_settings() {
  DRY_RUN=${DRY_RUN:-0}
  local default_slime_dir=/root/slime
  # Inside slime's tree (examples/search-r1/) the slime checkout is two levels up.
  if [[ -f "${SCRIPT_DIR}/../../train.py" ]]; then
    default_slime_dir="$(cd -- "${SCRIPT_DIR}/../.." && pwd)"
  fi
  SLIME_DIR=${SLIME_DIR:-$default_slime_dir}
  MEGATRON_PATH=${MEGATRON_PATH:-/root/Megatron-LM}
  MODEL_ARGS_FILE=${MODEL_ARGS_FILE:-${SLIME_DIR}/scripts/models/qwen2.5-3B.sh}
  PYTHON_BIN=${PYTHON_BIN:-python3}

  # checkpoints
  HF_CHECKPOINT=${HF_CHECKPOINT:-/root/Qwen2.5-3B}
  REF_LOAD=${REF_LOAD:-/root/Qwen2.5-3B_torch_dist}
  LOAD_DIR=${LOAD_DIR:-}
  SAVE_DIR=${SAVE_DIR:-}
  SAVE_INTERVAL=${SAVE_INTERVAL:-20}

  # slime's debug dumps, for the trajectory viewer (python -m slime_search_r1.viewer): off unless DUMP_DIR is set.
  # slime writes them for EVERY rollout (and every evaluation); it has no interval, so the viewer picks which ones
  # to show (--rollouts ::50). Train dumps hold the train log probs, reference log probs, advantages and entropy.
  DUMP_DIR=${DUMP_DIR:-}
  DUMP_TRAIN_DATA=${DUMP_TRAIN_DATA:-1}
  # the paper's row evaluate.py --reference prints beside the EM of a converted checkpoint (evaluate.py --help)
  REFERENCE=${REFERENCE:-}

  # data and rollout
  PROMPT_DATA=${PROMPT_DATA:-/root/Search-R1/data/nq_hotpotqa_train/train.parquet}
  INPUT_KEY=${INPUT_KEY:-prompt}
  LABEL_KEY=${LABEL_KEY:-reward_model}
  TOOL_KEY=${TOOL_KEY:-tools}
  # the column slime copies into sample.metadata; evaluation reads its "data_source" for EM per data source
  METADATA_KEY=${METADATA_KEY:-metadata}
  NUM_ROLLOUT=${NUM_ROLLOUT:-3000}
  ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-32}
  N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
  GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-256}
  # slime's max_new_tokens is the budget of the WHOLE multi-turn response, retrieved documents included:
  # with 3 turns that is up to 2 <information> blocks of <= 500 tokens plus ~1000 tokens of model text.
  # The single-turn example's 512 would truncate most search trajectories after the first search.
  ROLLOUT_MAX_RESPONSE_LEN=${ROLLOUT_MAX_RESPONSE_LEN:-2048}
  ROLLOUT_TEMPERATURE=${ROLLOUT_TEMPERATURE:-1}

  # evaluation inside training: off unless EVAL_PROMPT_DATA is set (slime's path@[start:end] slices work)
  EVAL_PROMPT_DATA=${EVAL_PROMPT_DATA:-}
  EVAL_NAME=${EVAL_NAME:-search_r1_test}
  EVAL_INTERVAL=${EVAL_INTERVAL:-25}
  EVAL_TEMPERATURE=${EVAL_TEMPERATURE:-0} # Search-R1 validates greedily (do_sample=False)
  EVAL_MAX_RESPONSE_LEN=${EVAL_MAX_RESPONSE_LEN:-$ROLLOUT_MAX_RESPONSE_LEN}

  # parallelism and memory
  NUM_GPUS=${NUM_GPUS:-8}
  TENSOR_PARALLEL_SIZE=${TENSOR_PARALLEL_SIZE:-2}
  MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-9216}
  ROLLOUT_NUM_GPUS_PER_ENGINE=${ROLLOUT_NUM_GPUS_PER_ENGINE:-2}
  SGLANG_MEM_FRACTION_STATIC=${SGLANG_MEM_FRACTION_STATIC:-0.7}

  # GRPO and optimizer
  KL_LOSS_COEF=${KL_LOSS_COEF:-0.001}
  KL_LOSS_TYPE=${KL_LOSS_TYPE:-low_var_kl}
  ENTROPY_COEF=${ENTROPY_COEF:-0.00}
  EPS_CLIP=${EPS_CLIP:-0.2}
  EPS_CLIP_HIGH=${EPS_CLIP_HIGH:-0.28}
  LR=${LR:-1e-6}

  # TIS / MIS (examples/train_infer_mismatch_helper); needs the engine's log probs of every trained token
  USE_TIS=${USE_TIS:-0}
  TIS_CONFIG_PATH=${TIS_CONFIG_PATH:-${SLIME_DIR}/examples/train_infer_mismatch_helper/mis.yaml}
  TIS_FUNCTION_PATH=${TIS_FUNCTION_PATH:-examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp}

  # the plugin's search metrics in slime's wandb/TensorBoard logs (an empty value leaves slime's logging alone)
  ROLLOUT_LOG_FUNCTION_PATH=${ROLLOUT_LOG_FUNCTION_PATH-generate_with_search.log_rollout_metrics}
  EVAL_ROLLOUT_LOG_FUNCTION_PATH=${EVAL_ROLLOUT_LOG_FUNCTION_PATH-generate_with_search.log_eval_rollout_metrics}

  # wandb (the key goes to the job's environment as WANDB_API_KEY, never onto a command line)
  USE_WANDB=${USE_WANDB:-0}
  WANDB_PROJECT=${WANDB_PROJECT:-slime-search-r1}
  WANDB_GROUP=${WANDB_GROUP:-search-r1_qwen2.5-3B}
  if [[ -z "${WANDB_API_KEY:-}" && -n "${WANDB_KEY:-}" ]]; then
    export WANDB_API_KEY=$WANDB_KEY
  fi

  # Ray
  MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
  RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
  RAY_DASHBOARD_URL=${RAY_DASHBOARD_URL:-http://${MASTER_ADDR}:${RAY_DASHBOARD_PORT}}
  START_RAY=${START_RAY:-auto} # auto | 1 | 0
  RAY_START_TIMEOUT=${RAY_START_TIMEOUT:-120}
  RAY_BIN=${RAY_BIN:-ray}
  JOB_ID=${JOB_ID:-search-r1-$(date +%Y%m%d-%H%M%S)-$$}
  EXTRA_RUNTIME_ENV_VARS=${EXTRA_RUNTIME_ENV_VARS:-} # more variable names to forward, space or comma separated
  EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS:-}

  local flag
  for flag in DRY_RUN USE_TIS USE_WANDB DUMP_TRAIN_DATA; do
    is_true "$flag" "${!flag}" || true # stops on a value that is not a boolean
  done

  LLM_API_MODE=${LLM_API_MODE:-generate}
  case "$LLM_API_MODE" in
    generate | chat) ;;
    *) die "LLM_API_MODE=$LLM_API_MODE is invalid; accepted: generate | chat" ;;
  esac
  case "$START_RAY" in
    auto | 1 | 0) ;;
    *) die "START_RAY=$START_RAY is invalid; accepted: auto (start a head only if none answers) | 1 | 0" ;;
  esac
}

# A missing file stops a real run; a dry run only warns so the command can still be inspected.
require_path() {
  local what=$1 path=${2%@\[*\]} # strip slime's @[start:end] row slice
  [[ -e "$path" ]] && return 0
  if is_true DRY_RUN "$DRY_RUN"; then
    warn "$what not found: $path"
  else
    die "$what not found: $path (set the variable that names it; see the top of this script)"
  fi
}

check_settings() {
  require_path "slime checkout (SLIME_DIR)" "${SLIME_DIR}/train.py"
  require_path "model architecture flags (MODEL_ARGS_FILE)" "$MODEL_ARGS_FILE"
  require_path "Hugging Face checkpoint (HF_CHECKPOINT)" "$HF_CHECKPOINT"
  require_path "Megatron reference checkpoint (REF_LOAD)" "$REF_LOAD"
  require_path "training data (PROMPT_DATA)" "$PROMPT_DATA"
  [[ -z "$LOAD_DIR" ]] || require_path "checkpoint to resume (LOAD_DIR)" "$LOAD_DIR"
  [[ -z "$EVAL_PROMPT_DATA" ]] || require_path "evaluation data (EVAL_PROMPT_DATA)" "$EVAL_PROMPT_DATA"
  if is_true USE_TIS "$USE_TIS"; then
    require_path "TIS config (TIS_CONFIG_PATH)" "$TIS_CONFIG_PATH"
  fi
  if ! is_true DRY_RUN "$DRY_RUN"; then
    command -v "$RAY_BIN" >/dev/null || die "'$RAY_BIN' not found on PATH; run inside slime's environment or set RAY_BIN"
    command -v curl >/dev/null || die "curl not found on PATH (used to probe the Ray dashboard)"
  fi
}

load_model_args() {
  MODEL_ARGS=()
  if [[ -f "$MODEL_ARGS_FILE" ]]; then
    # shellcheck source=/dev/null
    source "$MODEL_ARGS_FILE"
  fi
}

build_train_args() {
  local -a ckpt rollout eval_args perf grpo optimizer wandb sglang misc custom dumps extra
  ckpt=(--hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD")
  [[ -z "$LOAD_DIR" ]] || ckpt+=(--load "$LOAD_DIR")
  [[ -z "$SAVE_DIR" ]] || ckpt+=(--save "$SAVE_DIR" --save-interval "$SAVE_INTERVAL")

  rollout=(
    --prompt-data "$PROMPT_DATA" --input-key "$INPUT_KEY" --label-key "$LABEL_KEY" --metadata-key "$METADATA_KEY"
  )
  if [[ "$LLM_API_MODE" == chat ]]; then
    # Chat mode keeps sample.prompt as the message list and reads the tool schemas from metadata["tools"].
    rollout+=(--tool-key "$TOOL_KEY")
  else
    # XML mode trains on the chat-templated prompt string, as Search-R1 does.
    rollout+=(--apply-chat-template)
  fi
  rollout+=(
    --rollout-shuffle
    --num-rollout "$NUM_ROLLOUT"
    --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES_PER_PROMPT"
    --rollout-max-response-len "$ROLLOUT_MAX_RESPONSE_LEN"
    --rollout-temperature "$ROLLOUT_TEMPERATURE"
    --global-batch-size "$GLOBAL_BATCH_SIZE"
    --balance-data
  )

  eval_args=()
  if [[ -n "$EVAL_PROMPT_DATA" ]]; then
    eval_args=(
      --eval-interval "$EVAL_INTERVAL"
      --eval-prompt-data "$EVAL_NAME" "$EVAL_PROMPT_DATA"
      --eval-input-key "$INPUT_KEY"
      --eval-label-key "$LABEL_KEY"
      --n-samples-per-eval-prompt 1
      --eval-max-response-len "$EVAL_MAX_RESPONSE_LEN"
      --eval-temperature "$EVAL_TEMPERATURE"
    )
    [[ "$LLM_API_MODE" != chat ]] || eval_args+=(--eval-tool-key "$TOOL_KEY")
  fi

  perf=(
    --tensor-model-parallel-size "$TENSOR_PARALLEL_SIZE"
    --sequence-parallel
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --expert-model-parallel-size 1
    --expert-tensor-parallel-size 1
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --use-dynamic-batch-size
    --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
  )

  grpo=(
    --advantage-estimator grpo
    --use-kl-loss
    --kl-loss-coef "$KL_LOSS_COEF"
    --kl-loss-type "$KL_LOSS_TYPE"
    --entropy-coef "$ENTROPY_COEF"
    --eps-clip "$EPS_CLIP"
    --eps-clip-high "$EPS_CLIP_HIGH"
  )
  custom=(
    --custom-generate-function-path generate_with_search.generate
    --custom-rm-path generate_with_search.reward_func
    # GRPO group statistics without the samples removed from the loss (FAILED searches)
    --custom-reward-post-process-path generate_with_search.post_process_rewards
  )
  if [[ -n "$ROLLOUT_LOG_FUNCTION_PATH" ]]; then
    custom+=(--custom-rollout-log-function-path "$ROLLOUT_LOG_FUNCTION_PATH")
  fi
  if [[ -n "$EVAL_ROLLOUT_LOG_FUNCTION_PATH" ]]; then
    custom+=(--custom-eval-rollout-log-function-path "$EVAL_ROLLOUT_LOG_FUNCTION_PATH")
  fi
  if is_true USE_TIS "$USE_TIS"; then
    grpo+=(--use-tis)
    custom+=(--custom-config-path "$TIS_CONFIG_PATH" --custom-tis-function-path "$TIS_FUNCTION_PATH")
  fi

  optimizer=(
    --optimizer adam
    --lr "$LR"
    --lr-decay-style constant
    --weight-decay 0.01
    --adam-beta1 0.9
    --adam-beta2 0.98
  )

  wandb=()
  if is_true USE_WANDB "$USE_WANDB"; then
    wandb=(--use-wandb --wandb-project "$WANDB_PROJECT" --wandb-group "$WANDB_GROUP")
  fi

  sglang=(
    --rollout-num-gpus-per-engine "$ROLLOUT_NUM_GPUS_PER_ENGINE"
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION_STATIC"
  )

  misc=(
    # Megatron's default dropout is 0.1
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32
    --attention-backend flash
  )

  dumps=()
  if [[ -n "$DUMP_DIR" ]]; then
    # slime fills {rollout_id} (eval_<id> for evaluations); the layout is its --dump-details one
    dumps=(--save-debug-rollout-data "${DUMP_DIR}/rollout_data/{rollout_id}.pt")
    if is_true DUMP_TRAIN_DATA "$DUMP_TRAIN_DATA"; then
      dumps+=(--save-debug-train-data "${DUMP_DIR}/train_data/{rollout_id}.pt")
    fi
  fi

  extra=()
  if [[ -n "$EXTRA_TRAIN_ARGS" ]]; then
    read -r -a extra <<<"$EXTRA_TRAIN_ARGS"
  fi

  TRAIN_ARGS=(
    --actor-num-nodes 1
    --actor-num-gpus-per-node "$NUM_GPUS"
    --num-gpus-per-node "$NUM_GPUS"
    --colocate
    "${MODEL_ARGS[@]}"
    "${ckpt[@]}"
    "${rollout[@]}"
    "${eval_args[@]}"
    "${optimizer[@]}"
    "${grpo[@]}"
    "${wandb[@]}"
    "${perf[@]}"
    "${sglang[@]}"
    "${misc[@]}"
    "${custom[@]}"
    "${dumps[@]}"
    "${extra[@]}"
    "${CLI_TRAIN_ARGS[@]}"
  )
}

# What generate() would refuse at its first sample (after minutes of start-up on the GPUs), refused now: the
# plugin's SEARCH_R1_CONFIGS with the environment's overrides, and the slime flags it cannot train with.
check_plugin() {
  if is_true SKIP_PLUGIN_CHECK "${SKIP_PLUGIN_CHECK:-0}"; then
    warn "SKIP_PLUGIN_CHECK is set: the plugin's settings are checked only at the first sample"
    return 0
  fi
  plugin_python -m slime_search_r1.launch_check --prog run_qwen2.5_3B.sh --plugin "${SCRIPT_DIR}/generate_with_search.py" \
    -- "${TRAIN_ARGS[@]}" || exit 1
}

# The plugin's Python, run as a module with this folder on the path (run as a file, a module folder would come
# first on sys.path and could shadow the standard library).
plugin_python() {
  LLM_API_MODE=$LLM_API_MODE PYTHONPATH="${SCRIPT_DIR}${PYTHONPATH:+:${PYTHONPATH}}" "$PYTHON_BIN" "$@"
}

# The environment variables of the plugin's settings (slime_search_r1/settings.py, and any its extensions add).
plugin_env_vars() {
  PLUGIN_ENV_VARS=()
  local listed
  listed=$(plugin_python -m slime_search_r1.launch_check --env-vars --plugin "${SCRIPT_DIR}/generate_with_search.py") ||
    die "could not list the plugin's settings (above)"
  mapfile -t PLUGIN_ENV_VARS <<<"$listed"
}

# Writes the Ray runtime env to $1 (mode 600): PYTHONPATH for the plugin, Megatron and slime's examples,
# plus every plugin variable that is set. With $2=redact, secrets are written as <hidden> (for printing).
write_runtime_env() {
  local target=$1 mode=${2:-real} name
  local -a passed=()
  local pythonpath="${MEGATRON_PATH}:${SCRIPT_DIR}:${SLIME_DIR}${PYTHONPATH:+:${PYTHONPATH}}"
  local -a extra_names
  read -r -a extra_names <<<"${EXTRA_RUNTIME_ENV_VARS//,/ }"
  # LLM_API_MODE always has a value here (default generate): the job sees the mode this command was built for.
  for name in "${PLUGIN_ENV_VARS[@]}" WANDB_API_KEY "${extra_names[@]}"; do
    [[ -n "${!name:-}" ]] && passed+=("$name")
  done
  (
    umask 077
    LLM_API_MODE=$LLM_API_MODE "$PYTHON_BIN" - "$target" "$mode" "$pythonpath" "${passed[@]}" <<'PY'
import json
import os
import re
import sys

target, mode, pythonpath, *names = sys.argv[1:]
env_vars = {"PYTHONPATH": pythonpath, "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1"}
secret = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
for name in names:
    env_vars[name] = "<hidden>" if mode == "redact" and secret.search(name) else os.environ[name]
with open(target, "w", encoding="utf-8") as out:
    json.dump({"env_vars": env_vars}, out, indent=2, sort_keys=True)
    out.write("\n")
PY
  )
}

# The viewer command for DUMP_DIR: the latest rollout's dumps, as one offline page.
print_viewer_command() {
  echo "# trajectory viewer, while or after training (--rollouts=-1: the latest rollout; ::50 every 50th; 10,20 those):"
  printf 'PYTHONPATH=%q %q -m slime_search_r1.viewer %q --rollouts=-1: --tokenizer %q --output %q\n' \
    "$SCRIPT_DIR" "$PYTHON_BIN" "$DUMP_DIR" "$HF_CHECKPOINT" "${DUMP_DIR}/viewer"
}

# From the latest checkpoint in SAVE_DIR (Megatron torch_dist, iter_<7 digits>/, the number in
# latest_checkpointed_iteration.txt) to a Hugging Face folder with slime's converter, then to evaluate.py.
# shellcheck disable=SC2016 # "$ITER" is printed as it is, for the user's shell to expand
print_checkpoint_commands() {
  local vocab_size="" i reference=$REFERENCE
  for ((i = 0; i < ${#MODEL_ARGS[@]}; i++)); do
    [[ "${MODEL_ARGS[i]}" == --vocab-size ]] && vocab_size=${MODEL_ARGS[i + 1]:-}
  done
  if [[ -z "$reference" ]]; then
    # this script trains with GRPO; an Instruct checkpoint compares with the paper's instruct row
    reference=search-r1-base-grpo
    [[ "${HF_CHECKPOINT,,}" == *instruct* ]] && reference=search-r1-instruct-grpo
  fi
  local data=${EVAL_PROMPT_DATA:-/root/Search-R1/data/nq_hotpotqa_train/test.parquet}
  echo "# after training: the latest checkpoint in SAVE_DIR to Hugging Face (slime's converter), served, evaluated:"
  [[ -n "$vocab_size" ]] ||
    echo "# (no --vocab-size in MODEL_ARGS_FILE: add the model's own to the converter if Megatron padded the embedding)"
  printf 'ITER=$(printf iter_%%07d "$(cat %q)")\n' "${SAVE_DIR}/latest_checkpointed_iteration.txt"
  # Megatron pads the embedding; --vocab-size (the model's, from MODEL_ARGS_FILE) removes the padding again
  printf 'PYTHONPATH=%q %q %q --input-dir %q/"$ITER" --output-dir %q/"$ITER" --origin-hf-dir %q%s\n' \
    "$MEGATRON_PATH" "$PYTHON_BIN" "${SLIME_DIR}/tools/convert_torch_dist_to_hf.py" "$SAVE_DIR" "${SAVE_DIR}/hf" \
    "$HF_CHECKPOINT" "${vocab_size:+ --vocab-size ${vocab_size}}"
  printf '%q -m sglang.launch_server --model-path %q/"$ITER" --port 30000 &\n' "$PYTHON_BIN" "${SAVE_DIR}/hf"
  printf '%q %q --data %q --hf-checkpoint %q/"$ITER" --sglang-url http://127.0.0.1:30000 --output-dir %q/"$ITER" --llm-api-mode %q --reference %q --viewer\n' \
    "$PYTHON_BIN" "${SCRIPT_DIR}/evaluate.py" "${data%@\[*\]}" "${SAVE_DIR}/hf" "${SAVE_DIR}/eval" "$LLM_API_MODE" "$reference"
}

ray_dashboard_up() {
  curl -s -o /dev/null --max-time 3 "${RAY_DASHBOARD_URL}/api/version"
}

print_command() {
  local word first=1
  for word in "$@"; do
    ((first)) || printf ' '
    printf '%q' "$word"
    first=0
  done
  printf '\n'
}

RAY_HEAD_PID=""
SUBMIT_PID=""
JOB_SUBMITTED=0
JOB_FINISHED=0
RUN_DIR=""

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if ((JOB_SUBMITTED && !JOB_FINISHED)); then
    # Ctrl-C only stops `ray job submit` from tailing the logs; the job itself would keep the GPUs.
    info "stopping Ray job ${JOB_ID}"
    timeout 90 "$RAY_BIN" job stop --address "$RAY_DASHBOARD_URL" "$JOB_ID" >&2 || warn "could not stop job ${JOB_ID}"
  fi
  if [[ -n "$SUBMIT_PID" ]]; then
    kill -TERM "$SUBMIT_PID" 2>/dev/null || true
    wait "$SUBMIT_PID" 2>/dev/null || true
  fi
  if [[ -n "$RAY_HEAD_PID" ]] && kill -0 "$RAY_HEAD_PID" 2>/dev/null; then
    # `ray start --block` stops every process of the node it started when it gets SIGTERM, and only those.
    info "stopping the Ray head this script started (pid ${RAY_HEAD_PID})"
    kill -TERM "$RAY_HEAD_PID" 2>/dev/null || true
    local waited=0
    while kill -0 "$RAY_HEAD_PID" 2>/dev/null && ((waited < 60)); do
      sleep 1
      waited=$((waited + 1))
    done
    kill -0 "$RAY_HEAD_PID" 2>/dev/null && warn "Ray head ${RAY_HEAD_PID} still running after 60 s"
  fi
  [[ -z "$RUN_DIR" ]] || rm -rf "$RUN_DIR"
  exit "$status"
}

# The one Ray head command, run by start_ray_head and printed by --dry-run.
ray_head_command() {
  RAY_HEAD_CMD=(
    "$RAY_BIN" start --head --block
    --node-ip-address "$MASTER_ADDR"
    --num-gpus "$NUM_GPUS"
    --disable-usage-stats
    --dashboard-port "$RAY_DASHBOARD_PORT"
  )
}

start_ray_head() {
  ray_head_command
  info "starting a Ray head: $(print_command "${RAY_HEAD_CMD[@]}")"
  "${RAY_HEAD_CMD[@]}" >"${RUN_DIR}/ray_head.log" 2>&1 &
  RAY_HEAD_PID=$!
  local waited=0
  until ray_dashboard_up; do
    if ! kill -0 "$RAY_HEAD_PID" 2>/dev/null; then
      RAY_HEAD_PID=""
      tail -n 20 "${RUN_DIR}/ray_head.log" >&2
      die "ray start failed (log above); if a stale cluster holds the ports, check 'ray status' and stop it yourself"
    fi
    ((waited < RAY_START_TIMEOUT)) || die "the Ray dashboard did not answer at ${RAY_DASHBOARD_URL} within ${RAY_START_TIMEOUT} s"
    sleep 1
    waited=$((waited + 1))
  done
}

main() {
  CLI_TRAIN_ARGS=()
  local arg
  for arg in "$@"; do
    case "$arg" in
      --dry-run) DRY_RUN=1 ;;
      -h | --help)
        usage
        exit 0
        ;;
      *) CLI_TRAIN_ARGS+=("$arg") ;;
    esac
  done
  load_settings
  check_settings
  load_model_args
  build_train_args
  check_plugin
  plugin_env_vars
  SUBMIT_PREFIX=("$RAY_BIN" job submit --address "$RAY_DASHBOARD_URL" --submission-id "$JOB_ID" --runtime-env)
  SUBMIT_ENTRYPOINT=(-- "$PYTHON_BIN" "${SLIME_DIR}/train.py" "${TRAIN_ARGS[@]}")

  if is_true DRY_RUN "$DRY_RUN"; then
    local shown
    shown=$(mktemp)
    write_runtime_env "$shown" redact
    echo "# Ray runtime env (written to a private file at run time; secrets shown as <hidden>):"
    cat "$shown"
    rm -f "$shown"
    case "$START_RAY" in
      auto) echo "# Ray head, started only if nothing answers at ${RAY_DASHBOARD_URL} (START_RAY=auto):" ;;
      1) echo "# Ray head (START_RAY=1):" ;;
      0) echo "# Ray head: not started (START_RAY=0); the job goes to ${RAY_DASHBOARD_URL}" ;;
    esac
    if [[ "$START_RAY" != 0 ]]; then
      ray_head_command
      print_command "${RAY_HEAD_CMD[@]}"
    fi
    echo "# training job:"
    print_command "${SUBMIT_PREFIX[@]}" "<runtime-env-file>" "${SUBMIT_ENTRYPOINT[@]}"
    [[ -z "$DUMP_DIR" ]] || print_viewer_command
    if [[ -n "$SAVE_DIR" ]]; then
      print_checkpoint_commands
    else
      echo "# no SAVE_DIR: no checkpoint is saved (set SAVE_DIR to get the commands from a checkpoint to evaluate.py)"
    fi
    return 0
  fi

  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/search-r1-run.XXXXXX")
  write_runtime_env "${RUN_DIR}/runtime_env.json"

  if ray_dashboard_up; then
    [[ "$START_RAY" != 1 ]] || die "START_RAY=1 but a Ray cluster already answers at ${RAY_DASHBOARD_URL}"
    info "using the Ray cluster that answers at ${RAY_DASHBOARD_URL} (it is left running)"
  elif [[ "$START_RAY" == 0 ]]; then
    die "START_RAY=0 but no Ray cluster answers at ${RAY_DASHBOARD_URL}; start one or set START_RAY=auto"
  else
    export PYTHONUNBUFFERED=1
    start_ray_head
  fi

  [[ -z "$DUMP_DIR" ]] || info "dumps go to ${DUMP_DIR}; see them with: $(print_viewer_command | tail -n 1)"
  info "submitting job ${JOB_ID}"
  JOB_SUBMITTED=1
  # In the background so that `wait` returns as soon as this script gets a signal, even one sent to it alone.
  "${SUBMIT_PREFIX[@]}" "${RUN_DIR}/runtime_env.json" "${SUBMIT_ENTRYPOINT[@]}" &
  SUBMIT_PID=$!
  local status=0
  wait "$SUBMIT_PID" || status=$?
  JOB_FINISHED=1
  SUBMIT_PID=""
  return "$status"
}

main "$@"
