#!/usr/bin/env bash
# Install the locked GPU environment for one rollout engine into the current Python (`make install-gpu ROLLOUT=...`).
#
#   ROLLOUT=sglang bash requirements/install_gpu.sh        # or vllm; PYTHON picks the interpreter (default python3)
#   DRY_RUN=1 ROLLOUT=vllm bash requirements/install_gpu.sh   # what would be installed (pip fetches the wheels to check)
#   CUDA=12 ROLLOUT=vllm bash requirements/install_gpu.sh  # the CUDA 12 lock, whatever the driver (or without one)
#
# The lock is requirements/gpu-<rollout>-cu<CUDA>-py<version>.txt. Without CUDA set, nvidia-smi's "CUDA Version" (the
# newest CUDA the driver supports) chooses: 13.0 or newer -> the cu13 lock (torch 2.11.0), 12.x -> the cu12 lock
# (CUDA 12.8 builds: NVIDIA's minor-version compatibility runs a 12.x build on any 12.x driver, >= 525, except code
# that needs the driver to JIT newer PTX), older or no driver -> an error asking for CUDA=12|13.
# The lock is the complete set of packages, so it is installed with --no-deps: pip would otherwise re-check sglang's own
# transformers pin, which the lock overrides with verl's 5.9.0 (requirements/sglang-overrides.txt). Then this package
# goes in editable, without dependencies.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
ROLLOUT="${ROLLOUT:-sglang}"
CUDA="${CUDA:-}"
DRY_RUN="${DRY_RUN:-0}"
PIP_ARGS="${PIP_ARGS:-}"

die() {
    echo "error: $*" >&2
    exit 1
}

# The newest CUDA version the NVIDIA driver supports ("12.4"), empty when nvidia-smi is missing, fails or prints none.
driver_cuda() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    timeout 60 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1 || true
}

# The glibc a lock needs: the manylinux tag its header was resolved for (lock.sh), e.g. 2.34.
lock_glibc() {
    sed -n '2s/.*manylinux_\([0-9][0-9]*\)_\([0-9][0-9]*\).*/\1.\2/p' "$1"
}

# Whether this system's glibc ($glibc) is at least $1.
glibc_fits() {
    "$PYTHON" -c 'import sys; have, need = sys.argv[1].split("."), sys.argv[2].split(".")
sys.exit(not (have[0].isdigit() and tuple(map(int, have[:2])) >= tuple(map(int, need[:2]))))' "$glibc" "$1"
}

case "$ROLLOUT" in
    sglang | vllm) ;;
    *) die "ROLLOUT=${ROLLOUT}: choose sglang or vllm" ;;
esac
case "$CUDA" in
    12 | 13 | "") ;;
    *) die "CUDA=${CUDA}: choose 12 (drivers with CUDA 12.x, >= 525) or 13 (CUDA 13.0 or newer, >= 580)" ;;
esac

seen="$(driver_cuda)"
if [[ -z "$CUDA" ]]; then
    if [[ -z "$seen" ]]; then
        if command -v nvidia-smi >/dev/null 2>&1; then
            what="nvidia-smi printed no 'CUDA Version' (no driver loaded?)"
        else
            what="no nvidia-smi on PATH"
        fi
        die "${what}, so the driver's CUDA version is unknown: choose the lock with CUDA=13 (driver >= 580) or CUDA=12 (driver >= 525), e.g. make install-gpu ROLLOUT=${ROLLOUT} CUDA=12"
    fi
    major="${seen%%.*}"
    if ((major >= 13)); then
        CUDA=13
    elif ((major == 12)); then
        CUDA=12
    else
        die "nvidia-smi reports CUDA Version ${seen}; the locks need a driver with CUDA 12.0 or newer (>= 525): upgrade the driver, or choose a lock by hand with CUDA=12|13"
    fi
    echo "nvidia-smi reports CUDA Version ${seen}: the cu${CUDA} lock"
elif [[ -n "$seen" && "${seen%%.*}" -lt "$CUDA" ]]; then
    echo "warning: CUDA=${CUDA} chosen, but this node's driver supports CUDA ${seen}: torch will not use its GPUs" >&2
fi

version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" || die "cannot run PYTHON=${PYTHON}"
lock="${REPO_DIR}/requirements/gpu-${ROLLOUT}-cu${CUDA}-py${version}.txt"
[[ -f "$lock" ]] || die "no lock for Python ${version} (${lock}); use Python 3.10, 3.11 or 3.12"

glibc="$("$PYTHON" -c 'import platform; print(platform.libc_ver()[1] or "none")')"
need="$(lock_glibc "$lock")"
if [[ -n "$need" ]] && ! glibc_fits "$need"; then
    # the other locks for this Python that this driver runs (a cu13 driver runs the cu12 locks too) and this glibc fits
    others=()
    for cuda in 13 12; do
        ((cuda <= CUDA)) || continue
        for rollout in "$ROLLOUT" sglang vllm; do
            other="${REPO_DIR}/requirements/gpu-${rollout}-cu${cuda}-py${version}.txt"
            [[ "$other" != "$lock" && -f "$other" && " ${others[*]} " != *" ROLLOUT=${rollout} CUDA=${cuda} "* ]] || continue
            other_need="$(lock_glibc "$other")"
            if [[ -z "$other_need" ]] || glibc_fits "$other_need"; then
                others+=("ROLLOUT=${rollout} CUDA=${cuda}")
            fi
        done
    done
    hint="use a system with glibc >= ${need}"
    if ((${#others[@]})); then
        hint="use $(printf '%s, or ' "${others[@]}")"
        hint="${hint%, or }"
    fi
    die "$(basename "$lock") ships manylinux_${need/./_} wheels (glibc >= ${need}) and this system has glibc ${glibc}; ${hint}"
fi

# shellcheck disable=SC2086  # PIP_ARGS is a list of extra pip flags
if [[ "$DRY_RUN" == 1 ]]; then
    "$PYTHON" -m pip install --dry-run --no-deps $PIP_ARGS -r "$lock"
    echo "DRY_RUN=1: ${lock} resolves; then: pip install --no-deps -e ${REPO_DIR}"
    exit 0
fi
echo "installing ${lock}"
"$PYTHON" -m pip install --no-deps $PIP_ARGS -r "$lock"
"$PYTHON" -m pip install --no-deps -e "$REPO_DIR"
echo "installed the ${ROLLOUT} CUDA ${CUDA} environment; check it with: ${PYTHON} -m verl_search.launch.preflight --help"
