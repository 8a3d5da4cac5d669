#!/usr/bin/env bash
# GRPO on Qwen2.5-3B-Instruct with a search tool (the Search-R1 recipe) on the installed verl, FSDP + SGLang or vLLM
# (ROLLOUT, async).
#
#   RETRIEVER_URL=http://127.0.0.1:8000 nohup bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh > train.log 2>&1 &
#   DRY_RUN=1 bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh     # checks only, no GPU needed
#
# Every knob below is an environment variable; any other verl setting goes at the end as a hydra override, e.g.
#   bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh trainer.total_epochs=2 trainer.save_freq=50
# Before launching, a preflight composes the full config from the installed verl and checks the keys, the data, the
# tool YAML, the retriever (a real /retrieve probe), the reward function, the tokenizer and the GPUs.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}"
DATA_DIR="${DATA_DIR:-${HOME}/data/searchR1_processed_direct}"
TRAIN_DATA="${TRAIN_DATA:-${DATA_DIR}/train.parquet}"
# validation on the per-source subsample written by `preprocess_searchR1_dataset.py --val_per_source N`
VAL_DATA="${VAL_DATA:-${DATA_DIR}/val_subset.parquet}"
TOOL_CONFIG="${TOOL_CONFIG:-${VS_REPO_DIR}/tool_config/search_tool_config.yaml}"
# one URL, or several separated by commas (the tool balances over them)
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
# url: use RETRIEVER_URL; serve: start a Ray Serve retriever fleet in verl's Ray cluster first (RETRIEVER_REPLICAS,
# RETRIEVER_GPUS per replica, default 0 = CPU, RETRIEVER_CPUS, RETRIEVER_PORT, RAY_ADDRESS; see common.sh)
RETRIEVER="${RETRIEVER:-url}"
N_GPUS="${N_GPUS:-8}"
NNODES="${NNODES:-1}"
# assistant turns per trajectory: 4 = up to 3 searches and a final answer, as in the published recipes
MAX_TURNS="${MAX_TURNS:-4}"
# tool_agent: verl's hermes <tool_call> loop; search_r1_agent: the native <search>/<information> loop
AGENT="${AGENT:-tool_agent}"
# rollout engine: sglang (the recipe's) or vllm; each has a locked environment (make install-gpu ROLLOUT=...)
ROLLOUT="${ROLLOUT:-sglang}"
# the actor's attention: auto (flash_attention_2 when flash-attn imports, else sdpa), or any transformers name
ATTN_IMPLEMENTATION="${ATTN_IMPLEMENTATION:-auto}"
PROJECT_NAME="${PROJECT_NAME:-search_r1_like_async_rl}"
EXPERIMENT_NAME="${EXPERIMENT_NAME:-qwen2.5-3b-instruct-grpo-search-${AGENT}}"
RUN_DIR="$(vs_abs "${RUN_DIR:-runs/${EXPERIMENT_NAME}}")"
AGENT_LOOP_CONFIG="${AGENT_LOOP_CONFIG:-${VS_REPO_DIR}/tool_config/search_r1_agent.yaml}"
# verl imports pkg:// paths as modules (the installed or checked-out verl_search); a file path also works
REWARD_FN_PATH="${REWARD_FN_PATH:-pkg://verl_search.reward}"

TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-512}"
PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-256}"
ROLLOUT_N="${ROLLOUT_N:-5}"
LR="${LR:-1e-6}"
LR_WARMUP_RATIO="${LR_WARMUP_RATIO:-0.285}"
KL_COEF="${KL_COEF:-0.001}"
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-4096}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-3000}"
# verl cuts tool text at this many characters (its default, 256, cuts the first passage). One query's top-3 wiki-18
# passages are ~2,300 characters; the tool caps one call at max_result_chars (6,000 in the shipped tool YAML), so
# this matches that cap and verl never cuts mid-passage. Lower both together to save response tokens.
MAX_TOOL_RESPONSE_LENGTH="${MAX_TOOL_RESPONSE_LENGTH:-6000}"
ROLLOUT_TP="${ROLLOUT_TP:-1}"
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.5}"
MICRO_BATCH_PER_GPU="${MICRO_BATCH_PER_GPU:-8}"
MAX_TOKEN_LEN_PER_GPU="${MAX_TOKEN_LEN_PER_GPU:-15000}"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-1}"
SAVE_FREQ="${SAVE_FREQ:-100}"
TEST_FREQ="${TEST_FREQ:-50}"
LOGGER="${LOGGER:-[\"console\",\"wandb\"]}"

vs_rollout_overrides
vs_serve_retriever
vs_prepare_run
vs_search_overrides
vs_trainer_overrides "$N_GPUS" "$TRAIN_BATCH_SIZE" "$PPO_MINI_BATCH_SIZE" cuda

ARGS=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    "data.train_files=${TRAIN_DATA}"
    "data.val_files=${VAL_DATA}"
    "data.train_batch_size=${TRAIN_BATCH_SIZE}"
    "data.max_prompt_length=${MAX_PROMPT_LENGTH}"
    "data.max_response_length=${MAX_RESPONSE_LENGTH}"
    data.filter_overlong_prompts=True
    data.truncation=error
    data.return_raw_chat=True
    "actor_rollout_ref.model.path=${MODEL_PATH}"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    "actor_rollout_ref.actor.optim.lr=${LR}"
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=${LR_WARMUP_RATIO}"
    "actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}"
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${MICRO_BATCH_PER_GPU}"
    actor_rollout_ref.actor.use_dynamic_bsz=True
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${MAX_TOKEN_LEN_PER_GPU}"
    actor_rollout_ref.actor.use_kl_loss=True
    "actor_rollout_ref.actor.kl_loss_coef=${KL_COEF}"
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.fsdp_config.param_offload=True
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=${MICRO_BATCH_PER_GPU}"
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    "${VS_ROLLOUT_ARGS[@]}"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEMORY_UTILIZATION}"
    "actor_rollout_ref.rollout.max_model_len=${MAX_TOKEN_LEN_PER_GPU}"
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${MICRO_BATCH_PER_GPU}"
    "actor_rollout_ref.rollout.n=${ROLLOUT_N}"
    "${VS_SEARCH_ARGS[@]}"
    "${VS_RAY_ARGS[@]}"
    trainer.critic_warmup=0
    trainer.val_before_train=False
    "trainer.logger=${LOGGER}"
    "trainer.project_name=${PROJECT_NAME}"
    "trainer.experiment_name=${EXPERIMENT_NAME}"
    "trainer.n_gpus_per_node=${N_GPUS}"
    "trainer.nnodes=${NNODES}"
    "trainer.save_freq=${SAVE_FREQ}"
    "trainer.test_freq=${TEST_FREQ}"
    "trainer.total_epochs=${TOTAL_EPOCHS}"
    "trainer.default_local_dir=${RUN_DIR}/checkpoints"
    "trainer.validation_data_dir=${RUN_DIR}/val_generations"
)
ARGS+=("${VS_TRAINER_ARGS[@]}" "$@")

echo "run folder: ${RUN_DIR} (tool config, checkpoints, validation generations)"
vs_preflight --agent "$AGENT" -- "${ARGS[@]}"
exec "${VS_COMMAND[@]}"
