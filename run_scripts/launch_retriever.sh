#!/usr/bin/env bash
# Start the wiki-18 e5 retriever in the background from the files download.py saved, wait until /health says it is
# ready, and print the URL to give the training script as RETRIEVER_URL.
#
#   python local_dense_retriever/download.py --save_path $HOME/data/wiki-18        # once (~60-70 GB)
#   DATA_DIR=$HOME/data/wiki-18 bash run_scripts/launch_retriever.sh                 # GPUs if visible, else CPU
#   CUDA_VISIBLE_DEVICES=7 FAISS_GPU=1 bash run_scripts/launch_retriever.sh          # faiss sharded over GPU 7
#   EMBEDDED=1 bash run_scripts/launch_retriever.sh                                  # toy corpus, for smoke tests
#   SERVE=1 RAY_ADDRESS=auto REPLICAS=4 bash run_scripts/launch_retriever.sh         # a Ray Serve fleet, one URL
#   DEVICE=cuda SERVERS=4 bash run_scripts/launch_retriever.sh                        # 4 servers on this GPU
#
# SERVERS=N starts N server processes on ports PORT..PORT+N-1, each with its own copy of the index on the same
# devices, and prints their URLs as one comma-separated RETRIEVER_URL: the search tool sends each call to the server
# with the fewest requests in flight. One server's Python interpreter, not the GPU, bounds its throughput on a GPU;
# on one H200 under 256 clients, 4 servers answered 3.2-3.6x one server's queries/s (benchmarks/RESULTS.md). Each
# copy of the index takes its full size in device memory (wiki-18 under e5 in float16: 32 GB). With SERVERS > 1 the
# log of the server on port P is LOG_FILE with -P before its .log (default retriever-P.log), and each server gets
# nproc / SERVERS CPU threads unless the arguments give --num_threads.
#
# SERVE=1 deploys the same server as a Ray Serve application (python -m local_dense_retriever.serve) into the Ray
# cluster at RAY_ADDRESS (empty: a local Ray instance that lives as long as the command): REPLICAS replicas (or
# MIN_REPLICAS..MAX_REPLICAS autoscaled), REPLICA_CPUS and REPLICA_GPUS each, at most REPLICAS_PER_NODE per node,
# SHARDS > 1 splits the flat index, GATEWAYS > 0 puts gateways in front that retry a request whose replica died;
# HOST:PORT is Serve's proxy (one on every node with a replica).
#
# Extra arguments are passed to local_dense_retriever/retrieval_server.py (e.g. --max_batch_size 512).
# The last line printed is RETRIEVER_URL=http://HOST:PORT; the server keeps running (stop it with the printed kill).
set -euo pipefail

# shellcheck source=run_scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DATA_DIR="${DATA_DIR:-${HOME}/data/wiki-18}"
RETRIEVER_NAME="${RETRIEVER_NAME:-e5}"
RETRIEVER_MODEL="${RETRIEVER_MODEL:-intfloat/e5-base-v2}"
INDEX_PATH="${INDEX_PATH:-${DATA_DIR}/e5_Flat.index}"
CORPUS_PATH="${CORPUS_PATH:-${DATA_DIR}/wiki-18.jsonl}"
# EMBEDDED=1 serves the generated toy corpus with the bundled MiniLM instead (no download needed)
EMBEDDED="${EMBEDDED:-0}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
TOPK="${TOPK:-3}"
# auto: torch matmul search for a flat index (GPU if visible), faiss otherwise; or torch, faiss, bm25
BACKEND="${BACKEND:-auto}"
# 1: faiss with the index sharded in fp16 over the visible GPUs
FAISS_GPU="${FAISS_GPU:-0}"
# auto, cpu or cuda (the query encoder and, for the torch backend, the index)
DEVICE="${DEVICE:-auto}"
# 1: a Ray Serve fleet (the knobs below) instead of one server process
SERVE="${SERVE:-0}"
RAY_ADDRESS="${RAY_ADDRESS:-}"
REPLICAS="${REPLICAS:-1}"
MIN_REPLICAS="${MIN_REPLICAS:-}"
MAX_REPLICAS="${MAX_REPLICAS:-}"
REPLICAS_PER_NODE="${REPLICAS_PER_NODE:-}"
REPLICA_CPUS="${REPLICA_CPUS:-1}"
# GPUs per replica; 0 keeps the replicas off the GPUs (Ray hides them from the replica)
REPLICA_GPUS="${REPLICA_GPUS:-0}"
SHARDS="${SHARDS:-1}"
# gateways in front of the replicas: 1+ retries a request whose replica dies mid-flight (one more Serve hop per request)
GATEWAYS="${GATEWAYS:-0}"
SERVERS="${SERVERS:-1}"
LOG_FILE="$(vs_abs "${LOG_FILE:-retriever-${PORT}.log}")"
# loading the 60 GB wiki-18 index from disk takes minutes; the embedded default takes seconds
STARTUP_TIMEOUT="${STARTUP_TIMEOUT:-3600}"
POLL_INTERVAL="${POLL_INTERVAL:-2}"

[[ "$PORT" =~ ^[1-9][0-9]*$ && "$PORT" -le 65535 ]] || vs_die "PORT=${PORT}: give a fixed port number from 1 to 65535 (the URL must be known)"
[[ "$SERVERS" =~ ^[1-9][0-9]*$ ]] || vs_die "SERVERS=${SERVERS}: give the number of server processes (1 or more)"
if [[ "$SERVE" == 1 && "$SERVERS" != 1 ]]; then
    vs_die "SERVERS=${SERVERS} with SERVE=1: a Ray Serve fleet sizes itself with REPLICAS (one URL); SERVERS starts plain processes"
fi
((PORT + SERVERS - 1 <= 65535)) || vs_die "PORT=${PORT} SERVERS=${SERVERS}: the ports would pass 65535"

SERVER_ARGS=(--host "$HOST" --topk "$TOPK" --backend "$BACKEND" --device "$DEVICE")
if [[ "$EMBEDDED" != 1 ]]; then
    if [[ "$RETRIEVER_NAME" == bm25 && "$INDEX_PATH" == "${DATA_DIR}/e5_Flat.index" ]]; then
        INDEX_PATH="${DATA_DIR}/bm25"
    fi
    [[ -e "$INDEX_PATH" ]] || vs_die "INDEX_PATH=${INDEX_PATH} does not exist (python local_dense_retriever/download.py --save_path ${DATA_DIR})"
    [[ -f "$CORPUS_PATH" ]] || vs_die "CORPUS_PATH=${CORPUS_PATH} does not exist (python local_dense_retriever/download.py --save_path ${DATA_DIR})"
    SERVER_ARGS+=(--index_path "$INDEX_PATH" --corpus_path "$CORPUS_PATH"
        --retriever_name "$RETRIEVER_NAME" --retriever_model "$RETRIEVER_MODEL")
fi
if [[ "$FAISS_GPU" == 1 ]]; then
    SERVER_ARGS+=(--faiss_gpu)
fi
SERVER_ARGS+=("$@")
if ((SERVERS > 1)) && [[ " $* " != *" --num_threads "* && " $* " != *" --num_threads="* ]]; then
    # each server its share of the cores (a server's default is all of them: N servers would oversubscribe N times)
    SERVER_ARGS+=(--num_threads "$(( $(nproc) / SERVERS > 0 ? $(nproc) / SERVERS : 1 ))")
fi
SERVER_CMD=("$PYTHON" "${VS_REPO_DIR}/local_dense_retriever/retrieval_server.py")
if [[ "$SERVE" == 1 ]]; then
    SERVER_CMD=("$PYTHON" -m local_dense_retriever.serve --num_replicas "$REPLICAS" --num_cpus "$REPLICA_CPUS"
        --num_gpus "$REPLICA_GPUS" --shards "$SHARDS" --gateway_replicas "$GATEWAYS"
        --startup_timeout_s "$STARTUP_TIMEOUT")
    [[ -z "$RAY_ADDRESS" ]] || SERVER_CMD+=(--address "$RAY_ADDRESS")
    [[ -z "$REPLICAS_PER_NODE" ]] || SERVER_CMD+=(--replicas_per_node "$REPLICAS_PER_NODE")
    if [[ -n "$MIN_REPLICAS$MAX_REPLICAS" ]]; then
        SERVER_CMD+=(--min_replicas "${MIN_REPLICAS:-1}" --max_replicas "${MAX_REPLICAS:-$REPLICAS}")
    fi
fi

# the address to reach the server at: a wildcard bind is reached through this host's name
case "$HOST" in
    0.0.0.0 | ::) URL_HOST="$(hostname)"; PROBE_HOST=127.0.0.1 ;;
    *) URL_HOST="$HOST"; PROBE_HOST="$HOST" ;;
esac

# health_status PORT: prints the HTTP status of GET /health on PORT (000 when nothing answers)
health_status() {
    "$PYTHON" - "http://${PROBE_HOST}:${1}/health" <<'EOF'
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print("000")
EOF
}

PORTS=() LOGS=() PIDS=()
for ((i = 0; i < SERVERS; i++)); do
    PORTS+=($((PORT + i)))
    if ((SERVERS == 1)); then
        LOGS+=("$LOG_FILE")
    else
        LOGS+=("${LOG_FILE%.log}-$((PORT + i)).log")
    fi
done
for port in "${PORTS[@]}"; do
    if [[ "$(health_status "$port")" != 000 ]]; then
        vs_die "something already answers on ${PROBE_HOST}:${port}; stop it or pick another PORT"
    fi
done

# stop_all: stop every server started so far
stop_all() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
}

# interrupted during start-up (Ctrl-C, a job scheduler's SIGTERM): no server is left loading on its own
trap 'stop_all; echo "error: interrupted; stopped every retriever started" >&2; exit 130' INT TERM
for i in "${!PORTS[@]}"; do
    log="${LOGS[$i]}"
    mkdir -p "$(dirname "$log")"
    echo "starting the retriever on port ${PORTS[$i]} (log: ${log}):"
    vs_print_command "${SERVER_CMD[@]}" "${SERVER_ARGS[@]}" --port "${PORTS[$i]}"
    nohup "${SERVER_CMD[@]}" "${SERVER_ARGS[@]}" --port "${PORTS[$i]}" >"$log" 2>&1 &
    PIDS+=($!)
    echo "$!" >"${log}.pid"
done

deadline=$((SECONDS + STARTUP_TIMEOUT))
waiting=("${!PORTS[@]}")
while true; do
    still=()
    for i in "${waiting[@]}"; do
        if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
            stop_all
            echo "error: the retriever exited during start-up (port ${PORTS[$i]}); last lines of ${LOGS[$i]}:" >&2
            tail -n 20 "${LOGS[$i]}" >&2
            exit 1
        fi
        status="$(health_status "${PORTS[$i]}")"
        [[ "$status" == 200 ]] || still+=("$i")
    done
    ((${#still[@]} > 0)) || break
    waiting=("${still[@]}")
    if ((SECONDS >= deadline)); then
        i="${waiting[0]}"
        status="$(health_status "${PORTS[$i]}")"
        stop_all
        echo "error: the retriever was not ready after ${STARTUP_TIMEOUT} s (port ${PORTS[$i]}, last /health status ${status}); stopped every server started. Last lines of ${LOGS[$i]}:" >&2
        tail -n 20 "${LOGS[$i]}" >&2
        exit 1
    fi
    sleep "$POLL_INTERVAL"
done

trap - INT TERM
URLS=""
for port in "${PORTS[@]}"; do
    URLS+="${URLS:+,}http://${URL_HOST}:${port}"
done
if ((SERVERS == 1)); then
    echo "the retriever is ready (pid ${PIDS[0]}; stop it with: kill ${PIDS[0]})"
else
    echo "the ${SERVERS} retrievers are ready (pids ${PIDS[*]}; stop them with: kill ${PIDS[*]})"
fi
echo "RETRIEVER_URL=${URLS}"
