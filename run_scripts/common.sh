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
# meaning are declared once, in verl_search/launch/trainer_mode.py, and vs_prepare's Python step adds their
# overrides; TRAINER_MODE=sync|colocate_async|separate_async, the older knob, still works (separate_async = fully_async).
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

# vs_bool 0|1: the hydra boolean of a 0/1 knob (anything else is passed on for the knob check to name).
vs_bool() {
    case "$1" in
        1) echo True ;;
        0) echo False ;;
        *) printf '%s\n' "$1" ;;
    esac
}

# vs_experiment_name DEFAULT OVERRIDES...: the value of the last trainer.experiment_name= among OVERRIDES (+/++ and
# one pair of quotes removed), else DEFAULT: the run folder then follows the name verl logs under, as in plain verl.
vs_experiment_name() {
    local name="" arg key value
    local default="$1"
    shift
    for arg in "$@"; do
        [[ "$arg" == *=* ]] || continue
        key="${arg%%=*}"
        key="${key#+}"
        [[ "${key#+}" == trainer.experiment_name ]] || continue
        value="${arg#*=}"
        if ((${#value} >= 2)) && [[ "${value:0:1}" == "${value: -1}" && "${value:0:1}" == [\"\'] ]]; then
            value="${value:1:${#value}-2}"
        fi
        name="$value"
    done
    printf '%s\n' "${name:-$default}"
}

# vs_prepare RECIPE OVERRIDES... -- USER_OVERRIDES...: the one Python step before verl (python -m
# verl_search.launch.prepare): the exported knobs checked, the overrides a script cannot write literally added between
# its own and the user's, the run folder's tool config written, the preflight run; sets VS_COMMAND. A bad knob or a
# failed preflight ends the script (exit 1) with the cause.
vs_prepare() {
    local recipe="$1" out parts=() flags=(--probe-timeout "$PROBE_TIMEOUT")
    shift
    [[ "$DRY_RUN" != 1 ]] || flags+=(--dry-run)
    [[ "$SKIP_PREFLIGHT" != 1 ]] || flags+=(--skip-preflight)
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        parts+=("$1")
        shift
    done
    [[ $# -gt 0 ]] || vs_die "vs_prepare: missing -- before the user's overrides"
    shift
    out="$("$PYTHON" -m verl_search.launch.prepare "$recipe" "${flags[@]}" --user "$#" -- "${parts[@]}" "$@")" || exit 1
    eval "$out"
    VS_COMMAND=("$PYTHON" -m verl.trainer.main_ppo "${VS_ARGS[@]}")
}

# vs_show_command: print VS_COMMAND for pasting; DRY_RUN=1 ends the script here (exit 0), otherwise raise the
# open-file limit for the launch.
vs_show_command() {
    echo "command:"
    vs_print_command "${VS_COMMAND[@]}"
    if [[ "$DRY_RUN" == 1 ]]; then
        echo "DRY_RUN=1: checks passed; not launching"
        exit 0
    fi
    ulimit -n 65535 2>/dev/null || echo "warning: could not raise the open-file limit (ulimit -n)" >&2
}

# vs_launch exec|run: vs_show_command, then keep the previous launch's metrics (vs_metrics_file) and run the command
# (exec: in place of this shell).
vs_launch() {
    vs_show_command
    vs_metrics_file
    if [[ "$1" == exec ]]; then
        exec "${VS_COMMAND[@]}"
    fi
    "${VS_COMMAND[@]}"
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

# vs_metrics_file: the launch's per-step metrics go to RUN_DIR/metrics.jsonl (verl's file logger;
# VERL_FILE_LOGGER_PATH wins when set). verl empties the file when it starts, so a relaunch into the same run folder
# first moves the previous launch's file into metrics/ beside it, named by its time; `python -m verl_search.report
# RUN_DIR` reads them all, oldest first. A dry run moves nothing. vs_metrics_path: that file's absolute path.
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

# vs_serve_retriever RECIPE: RETRIEVER=serve puts the retrieval fleet into the Ray cluster verl trains in: it starts a Ray
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
    # every knob checked before Ray or the fleet starts (RECIPE: the script's knobs, as vs_prepare takes them)
    "$PYTHON" -m verl_search.launch.prepare "$1" --knobs-only || exit 1
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
