#!/usr/bin/env bash
# Start the wiki-18 e5 retriever in the background from the files download.py saved, wait until /health says it is
# ready, and print the URL to give the training script as RETRIEVER_URL.
#
#   python local_dense_retriever/download.py --save_path $HOME/data/wiki-18        # once (~60-70 GB)
#   DATA_DIR=$HOME/data/wiki-18 bash run_scripts/launch_retriever.sh                 # GPUs if visible, else CPU
#   CUDA_VISIBLE_DEVICES=7 FAISS_GPU=1 bash run_scripts/launch_retriever.sh          # faiss sharded over GPU 7
#   EMBEDDED=1 bash run_scripts/launch_retriever.sh                                  # toy corpus, for smoke tests
#   SERVE=1 RAY_ADDRESS=auto REPLICAS=4 bash run_scripts/launch_retriever.sh         # a Ray Serve fleet, one URL
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
LOG_FILE="$(vs_abs "${LOG_FILE:-retriever-${PORT}.log}")"
# loading the 60 GB wiki-18 index from disk takes minutes; the embedded default takes seconds
STARTUP_TIMEOUT="${STARTUP_TIMEOUT:-3600}"
POLL_INTERVAL="${POLL_INTERVAL:-2}"

[[ "$PORT" =~ ^[0-9]+$ && "$PORT" -gt 0 ]] || vs_die "PORT=${PORT}: give a fixed port number (the URL must be known)"

SERVER_ARGS=(--host "$HOST" --port "$PORT" --topk "$TOPK" --backend "$BACKEND" --device "$DEVICE")
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

# health_status: prints the HTTP status of GET /health (000 when nothing answers)
health_status() {
    "$PYTHON" - "http://${PROBE_HOST}:${PORT}/health" <<'EOF'
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

if [[ "$(health_status)" != 000 ]]; then
    vs_die "something already answers on ${PROBE_HOST}:${PORT}; stop it or pick another PORT"
fi

mkdir -p "$(dirname "$LOG_FILE")"
echo "starting the retriever (log: ${LOG_FILE}):"
vs_print_command "${SERVER_CMD[@]}" "${SERVER_ARGS[@]}"
nohup "${SERVER_CMD[@]}" "${SERVER_ARGS[@]}" >"$LOG_FILE" 2>&1 &
PID=$!
echo "$PID" >"${LOG_FILE}.pid"

deadline=$((SECONDS + STARTUP_TIMEOUT))
while true; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "error: the retriever exited during start-up; last lines of ${LOG_FILE}:" >&2
        tail -n 20 "$LOG_FILE" >&2
        exit 1
    fi
    status="$(health_status)"
    if [[ "$status" == 200 ]]; then
        break
    fi
    if ((SECONDS >= deadline)); then
        kill "$PID" 2>/dev/null || true
        echo "error: the retriever was not ready after ${STARTUP_TIMEOUT} s (last /health status ${status}); stopped it. Last lines of ${LOG_FILE}:" >&2
        tail -n 20 "$LOG_FILE" >&2
        exit 1
    fi
    sleep "$POLL_INTERVAL"
done

echo "the retriever is ready (pid ${PID}; stop it with: kill ${PID})"
echo "RETRIEVER_URL=http://${URL_HOST}:${PORT}"
