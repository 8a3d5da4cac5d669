# Shared by the verl-search run scripts (sourced, never run): locate the checkout, prepare the run folder, run the
# preflight, print the exact command and launch it. Every function exits non-zero with a one-line cause.
# shellcheck shell=bash

VS_REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${DRY_RUN:-0}"
SKIP_PREFLIGHT="${SKIP_PREFLIGHT:-0}"
# seconds the preflight waits for the retriever's answer to its one probe query
PROBE_TIMEOUT="${PROBE_TIMEOUT:-10}"
# The trainer: TRAINER=sync (default) | one_step_off | fully_async | colocate_async, and its knobs MAX_STALENESS,
# STALENESS_STRATEGY, WARMUP_BATCHES, PARAMETER_SYNC_STEP, ROLLOUT_GPUS, ROLLOUT_NODES, PARTIAL_ROLLOUT,
# CHECKPOINT_ENGINE, SEARCH_MONITOR (1, default: verl's trainer of the mode as its search_* twin, which logs search/*
# metrics every step and watches them for collapse, e.g. +search_monitor.alarms.stop_after=3). Their defaults and
# meaning are declared once, in verl_search/launch/trainer_mode.py (see vs_trainer_overrides); TRAINER_MODE=sync|
# colocate_async|separate_async, the older knob, still works (separate_async = fully_async).
# The checkout's verl_search wins over an installed copy, here and in every Ray worker started from this shell.
export PYTHONPATH="${VS_REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONUNBUFFERED=1

vs_die() {
    echo "error: $*" >&2
    exit 1
}

# vs_abs PATH: PATH made absolute against the current directory (the path need not exist yet).
vs_abs() {
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "${PWD}/$1" ;;
    esac
}

# vs_write_tool_config SRC DEST URL: DEST = SRC with retrieval_service_url set to URL (SRC is never modified).
vs_write_tool_config() {
    "$PYTHON" -m verl_search.launch.tool_yaml "$1" "$2" --url "$3" >/dev/null \
        || vs_die "cannot write the run's tool config $2 from $1"
}

# vs_prepare_run: check AGENT, create RUN_DIR and write the run's copy of TOOL_CONFIG with RETRIEVER_URL in it
# (sets RUN_TOOL_CONFIG; the user's file is never edited).
vs_prepare_run() {
    case "$AGENT" in
        tool_agent | search_r1_agent) ;;
        *) vs_die "AGENT=${AGENT}: choose tool_agent or search_r1_agent" ;;
    esac
    mkdir -p "$RUN_DIR"
    RUN_TOOL_CONFIG="${RUN_DIR}/search_tool_config.yaml"
    vs_write_tool_config "$TOOL_CONFIG" "$RUN_TOOL_CONFIG" "$RETRIEVER_URL"
}

# vs_rollout_overrides: check ROLLOUT and set VS_ROLLOUT_ARGS to the engine and attention overrides: the rollout
# engine (sglang or vllm, async), the actor's attention (ATTN_IMPLEMENTATION; auto = flash_attention_2 when
# transformers finds FlashAttention-2 in PYTHON, else sdpa) with the padding removal it supports
# (verl_search/launch/attention.py) and, for the native loop on SGLang, its tokenizer (SGLang matches stop strings
# only with it loaded; verl's default skips it). Call it before vs_prepare_run.
vs_rollout_overrides() {
    case "$ROLLOUT" in
        sglang | vllm) ;;
        *) vs_die "ROLLOUT=${ROLLOUT}: choose sglang or vllm" ;;
    esac
    local out attention
    out="$("$PYTHON" -m verl_search.launch.attention "$ATTN_IMPLEMENTATION")" \
        || vs_die "ATTN_IMPLEMENTATION=${ATTN_IMPLEMENTATION}: cannot choose the actor's attention"
    mapfile -t attention <<<"$out"
    VS_ROLLOUT_ARGS=(
        "actor_rollout_ref.rollout.name=${ROLLOUT}"
        actor_rollout_ref.rollout.mode=async
        "${attention[0]}"
        "${attention[1]}"
    )
    if [[ "$ROLLOUT" == sglang && "$AGENT" == search_r1_agent ]]; then
        VS_ROLLOUT_ARGS+=(actor_rollout_ref.rollout.skip_tokenizer_init=False)
    fi
    echo "rollout engine: ${ROLLOUT}; actor attention: ${attention[2]}"
}

# vs_search_overrides: set VS_SEARCH_ARGS to the overrides that plug our tool, agent loop and reward into verl's
# multi-turn rollout (from AGENT, MAX_TURNS, MAX_TOOL_RESPONSE_LENGTH, RUN_TOOL_CONFIG, REWARD_FN_PATH and
# AGENT_LOOP_CONFIG; the mapping is verl_search/launch/search_overrides.py, which make train uses too). Call
# vs_prepare_run first.
vs_search_overrides() {
    local out
    out="$("$PYTHON" -m verl_search.launch.search_overrides --agent "$AGENT" --max-turns "$MAX_TURNS" \
        --max-tool-response-length "$MAX_TOOL_RESPONSE_LENGTH" --tool-config "$RUN_TOOL_CONFIG" \
        --reward-fn-path "$REWARD_FN_PATH" --agent-loop-config "$AGENT_LOOP_CONFIG")" \
        || vs_die "cannot compose the search overrides (AGENT=${AGENT})"
    mapfile -t VS_SEARCH_ARGS <<<"$out"
}

# vs_trainer_overrides DEVICES TRAIN_BATCH_SIZE PPO_MINI_BATCH_SIZE DEVICE(cpu|cuda): set VS_TRAINER_ARGS to the
# overrides of TRAINER and its knobs (verl_search.launch.trainer_overrides; put them after the script's own, before "$@")
# and VS_ROLLOUT_GPUS to the devices per node of a separate rollout pool (0 unless one_step_off or fully_async).
vs_trainer_overrides() {
    local out arg
    out="$("$PYTHON" -m verl_search.launch.trainer_overrides --from-env --devices "$1" --train-batch-size "$2" \
        --mini-batch-size "$3" --device "$4")" || vs_die "the trainer knobs above cannot run (TRAINER=${TRAINER:-sync})"
    mapfile -t VS_TRAINER_ARGS <<<"$out"
    VS_ROLLOUT_GPUS=0
    for arg in "${VS_TRAINER_ARGS[@]}"; do
        case "$arg" in actor_rollout_ref.rollout.n_gpus_per_node=*) VS_ROLLOUT_GPUS="${arg#*=}" ;; esac
    done
    echo "trainer: ${VS_TRAINER_ARGS[0]#*=}${TRAINER:+ (TRAINER=${TRAINER})}"
}

# vs_print_command ARGV...: the command quoted for pasting into a shell: the program and its flags on the first line,
# then one override (key=value) per line.
vs_print_command() {
    local arg sep=""
    for arg in "$@"; do
        if [[ -n "$sep" && "$arg" == *=* ]]; then
            sep=$' \\\n    '
        fi
        printf '%s%q' "$sep" "$arg"
        sep=" "
    done
    printf '\n'
}

# vs_preflight [PREFLIGHT_FLAGS...] -- OVERRIDES...: run the preflight, print the verl command and set VS_COMMAND
# to it. With DRY_RUN=1 the script ends here (exit 0); a failed preflight ends it with exit 1. A real launch that
# passes is recorded in its checkpoint folder (the experiment that writes there), which the next launch's check reads.
vs_preflight() {
    local flags=(--probe-timeout "$PROBE_TIMEOUT")
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        flags+=("$1")
        shift
    done
    [[ $# -gt 0 ]] || vs_die "vs_preflight: missing -- before the overrides"
    shift
    VS_COMMAND=("$PYTHON" -m verl.trainer.main_ppo "$@")
    if [[ "$DRY_RUN" == 1 ]]; then
        flags+=(--dry-run)
    else
        flags+=(--record-run)
    fi
    if [[ "$SKIP_PREFLIGHT" == 1 ]]; then
        echo "warning: SKIP_PREFLIGHT=1: launching without checks" >&2
    else
        "$PYTHON" -m verl_search.launch.preflight "${flags[@]}" -- "$@" \
            || vs_die "preflight failed: fix the problems listed above (DRY_RUN=1 runs only the checks)"
    fi
    echo "command:"
    vs_print_command "${VS_COMMAND[@]}"
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "DRY_RUN=1: checks passed; not launching"
        exit 0
    fi
    ulimit -n 65535 2>/dev/null || echo "warning: could not raise the open-file limit (ulimit -n)" >&2
}

# vs_metrics_file: the launch's per-step metrics go to RUN_DIR/metrics.jsonl (verl's file logger;
# VERL_FILE_LOGGER_PATH wins when set). verl empties the file when it starts, so a relaunch into the same run folder
# first moves the previous launch's file into metrics/ beside it, named by its time; `python -m verl_search.report
# RUN_DIR` reads them all, oldest first. Call it after vs_preflight (a dry run moves nothing). vs_metrics_path: that
# file's absolute path.
vs_metrics_path() {
    vs_abs "${VERL_FILE_LOGGER_PATH:-${RUN_DIR}/metrics.jsonl}"
}

vs_metrics_file() {
    VERL_FILE_LOGGER_PATH="$(vs_metrics_path)"
    export VERL_FILE_LOGGER_PATH
    mkdir -p "$(dirname "$VERL_FILE_LOGGER_PATH")"
    if [[ "$DRY_RUN" != 1 && -s "$VERL_FILE_LOGGER_PATH" ]]; then
        local kept
        kept="$(dirname "$VERL_FILE_LOGGER_PATH")/metrics/$(date -r "$VERL_FILE_LOGGER_PATH" +%Y%m%d-%H%M%S)-$$.jsonl"
        mkdir -p "$(dirname "$kept")"
        mv "$VERL_FILE_LOGGER_PATH" "$kept" || vs_die "cannot keep the previous launch's metrics (${kept})"
        echo "the previous launch's metrics: ${kept}"
    fi
    echo "per-step metrics: ${VERL_FILE_LOGGER_PATH}"
}

# vs_serve_retriever: RETRIEVER=serve puts the retrieval fleet into the Ray cluster verl trains in: it starts a Ray
# head on this node unless RAY_ADDRESS names a running cluster, deploys the retriever there (launch_retriever.sh
# SERVE=1: RETRIEVER_REPLICAS replicas with RETRIEVER_GPUS GPUs each, 0 = CPU only so the training GPUs stay free),
# sets RETRIEVER_URL to the fleet's one address and VS_RAY_ARGS to the override that makes verl join that cluster
# (ray_kwargs.ray_init.address) instead of starting its own. RETRIEVER=url (the default) uses RETRIEVER_URL as given.
# DRY_RUN=1 prints the two commands and starts nothing (the preflight then probes RETRIEVER_URL as given).
vs_serve_retriever() {
    VS_RAY_ARGS=()
    case "$RETRIEVER" in
        url) return 0 ;;
        serve) ;;
        *) vs_die "RETRIEVER=${RETRIEVER}: choose url (use RETRIEVER_URL) or serve (a Ray Serve fleet in the trainer's Ray cluster)" ;;
    esac
    local address="${RAY_ADDRESS:-auto}" port="${RETRIEVER_PORT:-8000}" head=() launch=()
    if [[ -z "${RAY_ADDRESS:-}" ]]; then
        head=("${RAY:-ray}" start --head --num-gpus "$N_GPUS" --disable-usage-stats)
    fi
    launch=(env SERVE=1 RAY_ADDRESS="$address" PORT="$port" REPLICAS="${RETRIEVER_REPLICAS:-1}"
        REPLICA_GPUS="${RETRIEVER_GPUS:-0}" REPLICA_CPUS="${RETRIEVER_CPUS:-1}"
        bash "${VS_REPO_DIR}/run_scripts/launch_retriever.sh")
    # a cluster started before this script does not have its environment: the per-step metrics file is named to verl's
    # trainer through the job's runtime environment
    VS_RAY_ARGS=("+ray_kwargs.ray_init.address=${address}"
        "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=$(vs_metrics_path)")
    echo "retriever: a Ray Serve fleet in the trainer's Ray cluster (${address}):"
    if ((${#head[@]})); then vs_print_command "${head[@]}"; fi
    vs_print_command "${launch[@]}"
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "DRY_RUN=1: not starting Ray or the fleet; the checks probe RETRIEVER_URL=${RETRIEVER_URL}"
        return 0
    fi
    if ((${#head[@]})) && ! "${RAY:-ray}" status >/dev/null 2>&1; then
        "${head[@]}" || vs_die "could not start a Ray head on this node (${head[*]})"
    fi
    local out
    out="$("${launch[@]}")" || vs_die "the Serve retriever did not start (its log: retriever-${port}.log)"
    echo "$out"
    RETRIEVER_URL="${out##*RETRIEVER_URL=}/retrieve"
}
