#!/usr/bin/env bash
# GRPO on Qwen2.5-3B-Instruct with a search tool (the Search-R1 recipe) on the installed verl, FSDP + SGLang or vLLM
# (ROLLOUT, async).
#
#   RETRIEVER_URL=http://127.0.0.1:8000 nohup bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh > train.log 2>&1 &
#   DRY_RUN=1 bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh     # checks only, no GPU needed
#
# Every knob below is an environment variable with the published recipe's default; any other verl setting goes at the
# end as a hydra override, e.g.
#   bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh trainer.total_epochs=2 trainer.save_freq=50
# Before launching, one Python step checks the knobs, adds what cannot be written here (the actor's attention, the
# trainer mode, a resume), writes the run folder's tool config and runs the preflight: it composes the full config
# from the installed verl and checks the keys, the data, the tool YAML, the retriever (a real /retrieve probe), the
# reward function, the tokenizer and the GPUs.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

set -a
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}"  # a model folder or hub id
DATA_DIR="${DATA_DIR:-${HOME}/data/searchR1_processed_direct}"  # what preprocess_searchR1_dataset.py wrote
TRAIN_DATA="${TRAIN_DATA:-${DATA_DIR}/train.parquet}"
# the 500-per-source subsample the preprocessing writes (the full test set, test.parquet, is ~15x slower to validate)
VAL_DATA="${VAL_DATA:-${DATA_DIR}/val_subset.parquet}"
TOOL_CONFIG="${TOOL_CONFIG:-${VS_REPO_DIR}/tool_config/search_tool_config.yaml}"  # copied into the run folder
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"  # one URL, or several separated by commas
# url: use RETRIEVER_URL; serve: start a Ray Serve retriever fleet in verl's Ray cluster first (see common.sh)
RETRIEVER="${RETRIEVER:-url}"
AGENT="${AGENT:-tool_agent}"  # tool_agent: verl's hermes <tool_call> loop; search_r1_agent: the native <search> loop
AGENT_LOOP_CONFIG="${AGENT_LOOP_CONFIG:-${VS_REPO_DIR}/tool_config/search_r1_agent.yaml}"  # search_r1_agent's loop
MAX_TURNS="${MAX_TURNS:-2}"  # assistant turns per trajectory: 2 = one round of searches, then an answer
# verl cuts tool text at this many characters; it matches the shipped tool YAML's max_result_chars
MAX_TOOL_RESPONSE_LENGTH="${MAX_TOOL_RESPONSE_LENGTH:-6000}"
REWARD_FN_PATH="${REWARD_FN_PATH:-pkg://verl_search.reward}"  # verl imports pkg:// paths as modules; a file works too
ROLLOUT="${ROLLOUT:-sglang}"  # sglang | vllm (each has a locked environment: make install-gpu ROLLOUT=...)
# the actor's attention: auto (flash_attention_2 when transformers finds FlashAttention-2, else sdpa), or any name
# transformers accepts
ATTN_IMPLEMENTATION="${ATTN_IMPLEMENTATION:-auto}"
N_GPUS="${N_GPUS:-8}"  # GPUs per node
NNODES="${NNODES:-1}"
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-512}"
VAL_BATCH_SIZE="${VAL_BATCH_SIZE:-256}"
SHUFFLE="${SHUFFLE:-0}"  # 1: shuffle the training rows each epoch; 0 (the published recipe): file order
PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-256}"
MICRO_BATCH_PER_GPU="${MICRO_BATCH_PER_GPU:-8}"
ROLLOUT_N="${ROLLOUT_N:-5}"
LR="${LR:-1e-6}"
LR_WARMUP_RATIO="${LR_WARMUP_RATIO:-0.285}"
KL_COEF="${KL_COEF:-0.001}"
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-4096}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-3000}"
ROLLOUT_TP="${ROLLOUT_TP:-1}"  # the engine's tensor parallelism
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.5}"
ACTOR_OFFLOAD="${ACTOR_OFFLOAD:-0}"  # 1: the actor's parameters and optimizer wait in CPU memory (GPUs under 80 GB)
DYNAMIC_BSZ="${DYNAMIC_BSZ:-0}"  # 1: pack micro-batches by tokens (MAX_TOKEN_LEN_PER_GPU)
# the engine's max_model_len, and with DYNAMIC_BSZ=1 the tokens per GPU per micro-batch
MAX_TOKEN_LEN_PER_GPU="${MAX_TOKEN_LEN_PER_GPU:-15000}"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-1}"
SAVE_FREQ="${SAVE_FREQ:-100}"
TEST_FREQ="${TEST_FREQ:-50}"
LOGGER="${LOGGER:-[\"console\",\"wandb\",\"file\"]}"  # file: per-step metrics in RUN_DIR/metrics.jsonl
PROJECT_NAME="${PROJECT_NAME:-search_r1_like_async_rl}"
# a trailing trainer.experiment_name=... wins, so the run folder follows the name wandb shows
EXPERIMENT_NAME="$(vs_experiment_name "${EXPERIMENT_NAME:-qwen2.5-3b-instruct-grpo-search-${AGENT}}" "$@")"
RUN_DIR="$(vs_abs "${RUN_DIR:-runs/${EXPERIMENT_NAME}}")"  # tool config, checkpoints, metrics, validation generations
# a checkpoint to start from on purpose (a global_step_N folder, or a checkpoint folder: its latest step); empty:
# verl's resume_mode auto, which resumes only this experiment's own checkpoints
RESUME_FROM="${RESUME_FROM:-}"
# TRAINER=sync | one_step_off | fully_async | colocate_async and its knobs: see common.sh
set +a

vs_serve_retriever gpu

actor=actor_rollout_ref.actor
rollout=actor_rollout_ref.rollout
multi_turn=actor_rollout_ref.rollout.multi_turn
RECIPE=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.train_files="$TRAIN_DATA"
    data.val_files="$VAL_DATA"
    data.train_batch_size="$TRAIN_BATCH_SIZE"
    data.val_batch_size="$VAL_BATCH_SIZE"
    data.max_prompt_length="$MAX_PROMPT_LENGTH"
    data.max_response_length="$MAX_RESPONSE_LENGTH"
    data.filter_overlong_prompts=True
    data.truncation=error
    data.return_raw_chat=True
    data.shuffle="$(vs_bool "$SHUFFLE")"
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    "$actor".optim.lr="$LR"
    "$actor".optim.lr_warmup_steps_ratio="$LR_WARMUP_RATIO"
    "$actor".ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
    "$actor".ppo_micro_batch_size_per_gpu="$MICRO_BATCH_PER_GPU"
    "$actor".use_kl_loss=True
    "$actor".kl_loss_coef="$KL_COEF"
    "$actor".kl_loss_type=low_var_kl
    "$actor".entropy_coeff=0
    "$actor".fsdp_config.param_offload="$(vs_bool "$ACTOR_OFFLOAD")"
    "$actor".fsdp_config.optimizer_offload="$(vs_bool "$ACTOR_OFFLOAD")"
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$MICRO_BATCH_PER_GPU"
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    "$rollout".name="$ROLLOUT"
    "$rollout".mode=async
    "$rollout".tensor_model_parallel_size="$ROLLOUT_TP"
    "$rollout".gpu_memory_utilization="$GPU_MEMORY_UTILIZATION"
    "$rollout".max_model_len="$MAX_TOKEN_LEN_PER_GPU"
    "$rollout".log_prob_micro_batch_size_per_gpu="$MICRO_BATCH_PER_GPU"
    "$rollout".n="$ROLLOUT_N"
    "$multi_turn".enable=True
    "$multi_turn".format=hermes
    "$multi_turn".max_assistant_turns="$MAX_TURNS"
    "$multi_turn".max_tool_response_length="$MAX_TOOL_RESPONSE_LENGTH"
    "$multi_turn".tool_response_truncate_side=right
    "$multi_turn".tool_config_path="${RUN_DIR}/search_tool_config.yaml"
    "$rollout".agent.default_agent_loop="$AGENT"
    reward.custom_reward_function.path="$REWARD_FN_PATH"
    reward.custom_reward_function.name=compute_score
    trainer.critic_warmup=0
    trainer.val_before_train=False
    trainer.logger="$LOGGER"
    trainer.project_name="$PROJECT_NAME"
    trainer.experiment_name="$EXPERIMENT_NAME"
    trainer.n_gpus_per_node="$N_GPUS"
    trainer.nnodes="$NNODES"
    trainer.save_freq="$SAVE_FREQ"
    trainer.test_freq="$TEST_FREQ"
    trainer.total_epochs="$TOTAL_EPOCHS"
    trainer.default_local_dir="${RUN_DIR}/checkpoints"
    trainer.validation_data_dir="${RUN_DIR}/val_generations"
)
if [[ "$DYNAMIC_BSZ" == 1 ]]; then
    RECIPE+=("$actor".use_dynamic_bsz=True "$actor".ppo_max_token_len_per_gpu="$MAX_TOKEN_LEN_PER_GPU")
fi
if [[ "$AGENT" == search_r1_agent ]]; then
    RECIPE+=("$rollout".agent.agent_loop_config_path="$AGENT_LOOP_CONFIG")
    # the native loop matches its stop strings only with SGLang's own tokenizer, which verl skips by default
    [[ "$ROLLOUT" != sglang ]] || RECIPE+=("$rollout".skip_tokenizer_init=False)
fi

# the knobs checked, then the recipe, what Python adds (attention, trainer mode, resume), a Ray Serve retriever's
# overrides and the user's, checked by the preflight
vs_prepare gpu "${RECIPE[@]}" ${VS_RAY_ARGS[@]+"${VS_RAY_ARGS[@]}"} -- "$@"
echo "run folder: ${RUN_DIR} (tool config, checkpoints, metrics.jsonl, validation generations)"
vs_launch exec
