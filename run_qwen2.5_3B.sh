#!/usr/bin/env bash
# Search-R1 GRPO training of Qwen2.5-3B with slime on one node: training and rollout colocated (train.py), or
# fully asynchronous on GPUs of their own with ASYNC_MODE=fully (train_async.py).
#
#   bash run_qwen2.5_3B.sh [--dry-run | --help | --list] [more train.py flags: appended, so the last one wins]
#
# Set the paths below (or export them). The slime flags are the arrays: edit them as in slime's examples, or
# uncomment the optional ones. Everything else is Python's (python -m slime_search_r1.launch; --list prints every
# setting): it resolves the plugin's settings (defaults < SEARCH_R1_CONFIGS in generate_with_search.py <
# environment variables), checks them and these flags as generate() would at its first sample, adds the flags
# they imply, writes the Ray runtime env, starts a Ray head only when none answers, and submits the job.
# --dry-run prints every value with where it came from, then the commands instead of running them.
set -euo pipefail

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"

# ---- paths
HF_CHECKPOINT=${HF_CHECKPOINT:-/root/Qwen2.5-3B}
REF_LOAD=${REF_LOAD:-/root/Qwen2.5-3B_torch_dist}
PROMPT_DATA=${PROMPT_DATA:-/root/Search-R1/data/nq_hotpotqa_train/train.parquet}
# slime, Megatron-LM and the model's MODEL_ARGS file: SLIME_DIR, MEGATRON_PATH, MODEL_ARGS_FILE (see --help)
# another model family (its slime scripts/models file, checkpoints and chat-template kwargs): MODEL=qwen3-4b, ...

CKPT_ARGS=(
   --hf-checkpoint "${HF_CHECKPOINT}"
   --ref-load "${REF_LOAD}"
   # --load /root/Qwen2.5-3B_slime/
   # --save /root/Qwen2.5-3B_slime/   # a dry run then prints the commands from the checkpoint to evaluate.py
   # --save-interval 20
)

ROLLOUT_ARGS=(
   --prompt-data "${PROMPT_DATA}"
   --input-key prompt
   --label-key reward_model
   # the column slime copies into sample.metadata; evaluation reads its "data_source" for EM per data source
   --metadata-key metadata
   # LLM_API_MODE=generate adds --apply-chat-template (XML tags on the templated prompt, as Search-R1);
   # chat adds --tool-key tools (the prompt stays a message list, the tool schemas come from the data)
   --rollout-shuffle
   --num-rollout 3000
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   # the budget of the WHOLE multi-turn response, search results included (slime's single-turn example: 512)
   --rollout-max-response-len 2048
   --rollout-temperature 1

   --global-batch-size 256
   --balance-data

   # --partial-rollout                    # resume episodes an abort cut (docs/rollout.md: Partial rollout)
   # --over-sampling-batch-size 96
   # --mask-offpolicy-in-partial-rollout
)

EVAL_ARGS=(
   # evaluation inside training (slime's path@[0:3000] reads a slice of the file):
   # --eval-interval 25
   # --eval-prompt-data search_r1_test /root/Search-R1/data/nq_hotpotqa_train/test.parquet@[0:3000]
   --eval-input-key prompt
   --eval-label-key reward_model
   --n-samples-per-eval-prompt 1
   --eval-max-response-len 2048
   --eval-temperature 0   # Search-R1 validates greedily
)

PERF_ARGS=(
   --tensor-model-parallel-size 2
   --sequence-parallel
   --pipeline-model-parallel-size 1
   --context-parallel-size 1
   --expert-model-parallel-size 1
   --expert-tensor-parallel-size 1

   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1

   # --micro-batch-size 1
   --use-dynamic-batch-size
   --max-tokens-per-gpu 9216
)

GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.001
   --kl-loss-type low_var_kl
   --entropy-coef 0.00
   --eps-clip 0.2
   --eps-clip-high 0.28

   # TIS with slime's MIS helper (the paths are slime's examples/train_infer_mismatch_helper):
   # --use-tis
   # --custom-config-path /root/slime/examples/train_infer_mismatch_helper/mis.yaml
   # --custom-tis-function-path examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.01
   --adam-beta1 0.9
   --adam-beta2 0.98
)

WANDB_ARGS=(
   # --use-wandb                        # the key (WANDB_API_KEY or WANDB_KEY) goes to the job's environment only
   --wandb-project slime-search-r1
   --wandb-group search-r1_qwen2.5-3B
)

SGLANG_ARGS=(
   --rollout-num-gpus-per-engine 2
   --sglang-mem-fraction-static 0.7
)

MISC_ARGS=(
   # default dropout in megatron is 0.1
   --attention-dropout 0.0
   --hidden-dropout 0.0
   # should be good for model performance
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   # need to comment this when using model with MLA
   --attention-backend flash

   # slime's dumps of every rollout, for the trajectory viewer (a dry run prints its command):
   # --save-debug-rollout-data "/root/dumps/rollout_data/{rollout_id}.pt"
   # --save-debug-train-data "/root/dumps/train_data/{rollout_id}.pt"
)

CUSTOM_ARGS=(
   --custom-generate-function-path generate_with_search.generate
   --custom-rm-path generate_with_search.reward_func
   # GRPO group statistics without the samples removed from the loss (FAILED searches)
   --custom-reward-post-process-path generate_with_search.post_process_rewards
   # the search metrics in slime's wandb / TensorBoard logs
   --custom-rollout-log-function-path generate_with_search.log_rollout_metrics
   --custom-eval-rollout-log-function-path generate_with_search.log_eval_rollout_metrics
)

# The launcher's own arguments ("$@": --dry-run, --help, more flags), then "--" and this script's flags.
PYTHONPATH="${SCRIPT_DIR}${PYTHONPATH:+:${PYTHONPATH}}" exec "${PYTHON_BIN:-python3}" -m slime_search_r1.launch \
   "${SCRIPT_DIR}/generate_with_search.py" "$@" -- \
   "${CKPT_ARGS[@]}" \
   "${ROLLOUT_ARGS[@]}" \
   "${EVAL_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" \
   "${GRPO_ARGS[@]}" \
   "${WANDB_ARGS[@]}" \
   "${PERF_ARGS[@]}" \
   "${SGLANG_ARGS[@]}" \
   "${MISC_ARGS[@]}" \
   "${CUSTOM_ARGS[@]}"
