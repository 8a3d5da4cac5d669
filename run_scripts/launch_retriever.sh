#!/usr/bin/env bash
# Start the wiki-18 e5 retriever in the background from the files download.py saved, wait until /health says it is
# ready, and print the URL to give the training script as RETRIEVER_URL.
#
#   python local_dense_retriever/download.py --save_path $HOME/data/wiki-18        # once (~60-70 GB)
#   DATA_DIR=$HOME/data/wiki-18 bash run_scripts/launch_retriever.sh                 # every GPU if any, else CPU
#   GPUS=6,7 bash run_scripts/launch_retriever.sh                                    # the index split over GPUs 6, 7
#   GPUS=none bash run_scripts/launch_retriever.sh                                   # CPU only
#   GPUS=none INDEX_PATH=$HOME/data/wiki-18/e5_ivf_sq8.index bash run_scripts/launch_retriever.sh   # compressed, CPU
#   CUDA_VISIBLE_DEVICES=7 FAISS_GPU=1 bash run_scripts/launch_retriever.sh          # faiss sharded over GPU 7
#   EMBEDDED=1 bash run_scripts/launch_retriever.sh                                  # toy corpus, for smoke tests
#   SERVE=1 RAY_ADDRESS=auto REPLICAS=4 bash run_scripts/launch_retriever.sh         # a Ray Serve fleet, one URL
#   DEVICE=cuda SERVERS=4 bash run_scripts/launch_retriever.sh                        # 4 servers on this GPU
#
# GPUS=all (default) | none | 0,1,...: the GPUs the retriever takes. all: every GPU visible to this shell (the CPU
# when there is none); none: the CPU only (the server sees no GPU); a list: those GPUs, numbered as torch numbers the
# visible ones (under CUDA_VISIBLE_DEVICES=4,5,6,7, GPUS=0,1 is GPUs 4 and 5), handed to the server as its
# CUDA_VISIBLE_DEVICES. The index is split into one shard per GPU taken, with DEVICE=auto or cuda and with
# FAISS_GPU=1 alike (DEVICE=cuda:N only chooses the encoder's GPU among them). The server logs the memory each GPU
# will hold before it loads, and /health reports what it holds on each (local_dense_retriever/README.md, GPUs).
# Why all is the default on a node that also trains (SGLang rollout reserving gpu_memory_utilization=0.5 of each GPU,
# FSDP actor on the rest): wiki-18's e5 index (21M x 768) takes 30.1 GiB in fp16. Split over 8 GPUs, each holds
# 3.8 GiB + a 1 GiB score buffer (GPU 0 also the 0.2 GiB encoder) + its CUDA context: about 5 GiB, 6-7% of an 80 GB
# H100, taken evenly from every FSDP rank (each keeps ~34 GiB beside the rollout's half). On one GPU it is about
# 32 GiB, 40% of it: that rank keeps ~8 GiB where the others keep ~40 GiB, and FSDP needs the same room on every rank,
# so that one GPU bounds (or OOMs) the actor. GPUS=none maps the 60.1 GiB float32 file and scans all of it for every
# batch (32 GFLOP per query): a training step's thousands of searches take minutes instead of seconds on a GPU. To
# take no GPU and stay fast, serve a compressed index on the CPU: `build_index.py --from_index e5_Flat.index
# --index_type ivf_sq8 --output e5_ivf_sq8.index` builds one from the downloaded flat index (about a quarter of its size,
# its recall against flat stored beside it), then INDEX_PATH=.../e5_ivf_sq8.index GPUS=none serves it.
#
# SERVERS=N starts N server processes on ports PORT..PORT+N-1, each with its own copy of the index on the same
# devices, and prints their URLs as one comma-separated RETRIEVER_URL: the search tool sends each call to the server
# with the fewest requests in flight: one server's Python interpreter, not the GPU, bounds its throughput on a GPU.
# Each copy of the index takes its full size in device memory (wiki-18 under e5 in float16: 32 GB). With SERVERS > 1 the
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
# While the servers load, the loader's lines from their logs (memory plan, stages, progress) are shown here.
# The last line printed is RETRIEVER_URL=http://HOST:PORT; the server keeps running (stop it with the printed kill).
# DRY_RUN=1 prints the server commands and starts nothing.
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
# auto, cpu, cuda or cuda:N (the query encoder and, for the torch backend, the index; cuda:N: the encoder's GPU)
DEVICE="${DEVICE:-auto}"
# all, none or 0,1,...: the GPUs the retriever takes (see above)
GPUS="${GPUS:-all}"
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

# gpu_choice: from GPUS, DEVICE and FAISS_GPU, set SERVER_ENV (the server's CUDA_VISIBLE_DEVICES unless GPUS=all),
# SERVER_DEVICE (its --device) and GPU_NOTE (what was chosen, in words)
gpu_choice() {
    SERVER_ENV=() SERVER_DEVICE="$DEVICE"
    if [[ "$GPUS" != all && "$SERVE" == 1 ]]; then
        vs_die "GPUS=${GPUS} with SERVE=1: Ray gives each replica its GPUs (REPLICA_GPUS)"
    fi
    case "$GPUS" in
        all)
            GPU_NOTE="every visible GPU${CUDA_VISIBLE_DEVICES+ (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES})}, else the CPU"
            return 0
            ;;
        none)
            [[ "$DEVICE" == auto || "$DEVICE" == cpu ]] || vs_die "DEVICE=${DEVICE} with GPUS=none: the server sees no GPU"
            [[ "$FAISS_GPU" != 1 ]] || vs_die "FAISS_GPU=1 with GPUS=none: the server sees no GPU to shard faiss over"
            SERVER_ENV=(CUDA_VISIBLE_DEVICES=) SERVER_DEVICE=cpu GPU_NOTE="none, the CPU only"
            return 0
            ;;
    esac
    [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || vs_die "GPUS=${GPUS}: give all, none or GPU numbers separated by commas (e.g. 0,1)"
    local visible=() picked=() n
    [[ -z "${CUDA_VISIBLE_DEVICES+set}" ]] || IFS=, read -ra visible <<<"$CUDA_VISIBLE_DEVICES"
    for n in ${GPUS//,/ }; do
        n=$((10#$n))
        if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
            ((n < ${#visible[@]})) || vs_die "GPUS=${GPUS}: GPU ${n} is not among the ${#visible[@]} that CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES} makes visible (GPUS numbers them from 0)"
            n="${visible[n]}"
        fi
        [[ " ${picked[*]} " != *" ${n} "* ]] || vs_die "GPUS=${GPUS}: GPU ${n} is named twice"
        picked+=("$n")
    done
    case "$DEVICE" in
        auto) SERVER_DEVICE=cuda ;;  # fail loudly if the GPUs are not there, rather than load onto the CPU
        cpu) [[ "$FAISS_GPU" == 1 ]] || vs_die "DEVICE=cpu with GPUS=${GPUS}: nothing would use those GPUs (GPUS=none serves from the CPU)" ;;
    esac
    SERVER_ENV=("CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${picked[*]}")")
    GPU_NOTE="${SERVER_ENV[0]} for the server"
}
gpu_choice

SERVER_ARGS=(--host "$HOST" --topk "$TOPK" --backend "$BACKEND" --device "$SERVER_DEVICE")
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
# print_server_command PORT: the server's command line on PORT, with its environment, for pasting into a shell
print_server_command() {
    if ((${#SERVER_ENV[@]})); then printf '%s ' "${SERVER_ENV[@]}"; fi
    vs_print_command "${SERVER_CMD[@]}" "${SERVER_ARGS[@]}" --port "$1"
}

echo "retriever GPUs (GPUS=${GPUS}): ${GPU_NOTE}"
if [[ "$DRY_RUN" == 1 ]]; then
    for i in "${!PORTS[@]}"; do
        echo "the retriever on port ${PORTS[$i]} (log: ${LOGS[$i]}):"
        print_server_command "${PORTS[$i]}"
    done
    echo "DRY_RUN=1: not starting the retriever"
    exit 0
fi
for port in "${PORTS[@]}"; do
    if [[ "$(health_status "$port")" != 000 ]]; then
        vs_die "something already answers on ${PROBE_HOST}:${port}; stop it or pick another PORT"
    fi
done

# LOADER_LINES: the messages of the server's loader worth showing while it loads (its memory plan, each stage, each
# progress count, and any warning of the service), as grep -E matches its log lines
LOADER_LINES=' (INFO local_dense_retriever\.(engine|load_progress|index\.faiss_index)|WARNING local_dense_retriever[.a-z_]*): '

# show_loading I: print the loader's lines that server I's log gained since the last call (SHOWN[I] lines were read)
show_loading() {
    local log="${LOGS[$1]}" total prefix=""
    [[ -f "$log" ]] || return 0
    total="$(wc -l <"$log")"
    ((total > SHOWN[$1])) || return 0
    ((SERVERS == 1)) || prefix="[port ${PORTS[$1]}] "
    sed -n "$((SHOWN[$1] + 1)),${total}p" "$log" | sed 's/.*\r//' | { grep -a -E "$LOADER_LINES" || true; } \
        | sed -E "s/^.*(INFO|WARNING) local_dense_retriever[.a-z_]*: /  ${prefix}/"
    SHOWN[$1]="$total"
}

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
    print_server_command "${PORTS[$i]}"
    nohup env "${SERVER_ENV[@]}" "${SERVER_CMD[@]}" "${SERVER_ARGS[@]}" --port "${PORTS[$i]}" >"$log" 2>&1 &
    PIDS+=($!)
    echo "$!" >"${log}.pid"
done
SHOWN=()
for i in "${!PORTS[@]}"; do SHOWN[i]=0; done

deadline=$((SECONDS + STARTUP_TIMEOUT))
waiting=("${!PORTS[@]}")
while true; do
    still=()
    for i in "${waiting[@]}"; do
        show_loading "$i"
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

for i in "${!PORTS[@]}"; do show_loading "$i"; done
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
