#!/usr/bin/env bash
# GRPO on Qwen2.5-3B-Instruct with a search tool (the Search-R1 recipe) on the installed verl, FSDP + SGLang or vLLM
# (ROLLOUT, async).
#
#   RETRIEVER_URL=http://127.0.0.1:8000 nohup bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh > train.log 2>&1 &
#   DRY_RUN=1 bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh     # checks only, no GPU needed
#
# Every knob is an environment variable (listed below); any other verl setting goes at the end as a hydra override, e.g.
#   bash run_scripts/run_qwen2.5-3b_instruct_search_multiturn.sh trainer.total_epochs=2 trainer.save_freq=50
# Before launching, a preflight composes the full config from the installed verl and checks the keys, the data, the
# tool YAML, the retriever (a real /retrieve probe), the reward function, the tokenizer and the GPUs.
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Every knob (MODEL_PATH, DATA_DIR, TRAIN_DATA, VAL_DATA, TOOL_CONFIG, RETRIEVER_URL, RETRIEVER=url|serve, N_GPUS,
# NNODES, MAX_TURNS, AGENT=tool_agent|search_r1_agent, ROLLOUT=sglang|vllm, ATTN_IMPLEMENTATION, PROJECT_NAME,
# EXPERIMENT_NAME, RUN_DIR, AGENT_LOOP_CONFIG, REWARD_FN_PATH, TRAIN_BATCH_SIZE, PPO_MINI_BATCH_SIZE, ROLLOUT_N, LR,
# LR_WARMUP_RATIO, KL_COEF, MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH, MAX_TOOL_RESPONSE_LENGTH, ROLLOUT_TP,
# GPU_MEMORY_UTILIZATION, MICRO_BATCH_PER_GPU, MAX_TOKEN_LEN_PER_GPU, TOTAL_EPOCHS, SAVE_FREQ, TEST_FREQ, LOGGER) is
# declared once, with its default (the published recipe's) and meaning, in verl_search/launch/gpu_run.py
# (GpuRunKnobs), which also maps them to verl's overrides. Resolve them here:
# A trainer.experiment_name=... among the trailing overrides names the experiment (it wins over EXPERIMENT_NAME), so
# the run folder, its checkpoints and its metrics follow the name wandb shows.
KNOBS="$("$PYTHON" -m verl_search.launch.gpu_run -- "$@")" || vs_die "fix the knob named above"
eval "$KNOBS"

vs_serve_retriever
vs_prepare_run
# every override the knobs mean (the recipe's, the engine and the actor's attention, the search tool's, the trainer
# mode's), then a Ray Serve retriever's and the user's
ARGS=("${VS_OVERRIDES[@]}" ${VS_RAY_ARGS[@]+"${VS_RAY_ARGS[@]}"} "$@")

echo "run folder: ${RUN_DIR} (tool config, checkpoints, metrics.jsonl, validation generations)"
vs_preflight --agent "$AGENT" -- "${ARGS[@]}"
vs_metrics_file
exec "${VS_COMMAND[@]}"
