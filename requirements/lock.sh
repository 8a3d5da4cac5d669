#!/usr/bin/env bash
# Regenerate the GPU lock files requirements/gpu-<rollout>-cu<cuda>-py<version>.txt with uv's resolver (`make lock`).
#
# One lock per rollout engine, CUDA major and Python version, for linux x86_64: the package with its retriever, gpu,
# report, cupy-cu<cuda> and training extras.
#   cu13: verl 0.9.1's own engine extras (train-<rollout>): torch 2.11.0, whose PyPI wheels need a driver with CUDA 13
#         (>= 580); sglang 0.5.12 ships only manylinux_2_34 wheels (glibc >= 2.34).
#   cu12: train-<rollout>-cu12, the newest engine releases on a CUDA 12.8 torch (vllm 0.19.1 on torch 2.10.0, whose
#         wheel is manylinux_2_31; sglang 0.5.10.post1 on torch 2.9.1), for drivers with CUDA 12.x (>= 525).
#         These engines leave their GPU kernel libraries open (KERNEL_LIBS); the cu12 locks take the releases that were
#         out when the engine was (CU12_KERNELS_BEFORE): today's need CUDA 13 libraries (nvidia-cudnn-frontend >= 1.29
#         asks for nvidia-cutlass-dsl[cu13]) and were never run with these engines or this torch.
# Both sglang routes need requirements/sglang-overrides.txt (their sglang pins a transformers that verl excludes).
# faiss-gpu replaces faiss-cpu in these environments (both install the module `faiss`), so faiss-cpu is left out of
# the locks. The platform tag in each lock's header is the glibc install_gpu.sh requires.
# Without UV set, uv is installed into a throwaway virtual environment under LOCK_TOOLS_DIR.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
UV_VERSION="${UV_VERSION:-0.13.9}"
LOCK_TOOLS_DIR="${LOCK_TOOLS_DIR:-${REPO_DIR}/.cache/lock-tools}"
UV="${UV:-}"
PYTHON_VERSIONS="${PYTHON_VERSIONS:-3.10 3.11 3.12}"
ROLLOUTS="${ROLLOUTS:-sglang vllm}"
CUDA_VERSIONS="${CUDA_VERSIONS:-12 13}"
SGLANG_PLATFORM="${SGLANG_PLATFORM:-x86_64-manylinux_2_34}"
VLLM_PLATFORM="${VLLM_PLATFORM:-x86_64-manylinux_2_28}"
SGLANG_CU12_PLATFORM="${SGLANG_CU12_PLATFORM:-x86_64-manylinux_2_28}"
VLLM_CU12_PLATFORM="${VLLM_CU12_PLATFORM:-x86_64-manylinux_2_31}"
KERNEL_LIBS="${KERNEL_LIBS:-flash-attn-4 quack-kernels nvidia-cudnn-frontend nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base
    nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-cu13 apache-tvm-ffi cuda-tile
    torch-c-dlpack-ext}"
# the day after each cu12 engine's release (sglang 0.5.10.post1: 2026-04-08; vllm 0.19.1: 2026-04-18)
SGLANG_CU12_KERNELS_BEFORE="${SGLANG_CU12_KERNELS_BEFORE:-2026-04-09T00:00:00Z}"
VLLM_CU12_KERNELS_BEFORE="${VLLM_CU12_KERNELS_BEFORE:-2026-04-19T00:00:00Z}"
# package left out of every lock (replaced by faiss-gpu, see above)
NO_EMIT="${NO_EMIT:-faiss-cpu}"

die() {
    echo "error: $*" >&2
    exit 1
}

if [[ -z "$UV" ]]; then
    if [[ ! -x "${LOCK_TOOLS_DIR}/bin/uv" ]]; then
        echo "installing uv==${UV_VERSION} into ${LOCK_TOOLS_DIR} (throwaway)"
        "$PYTHON" -m venv "$LOCK_TOOLS_DIR" || die "cannot create a virtual environment at ${LOCK_TOOLS_DIR}"
        "${LOCK_TOOLS_DIR}/bin/pip" install -q "uv==${UV_VERSION}" || die "cannot install uv==${UV_VERSION}"
    fi
    UV="${LOCK_TOOLS_DIR}/bin/uv"
fi

cd "$REPO_DIR"
for cuda in $CUDA_VERSIONS; do
    for rollout in $ROLLOUTS; do
        flags=()
        before=""
        case "${rollout}-cu${cuda}" in
            sglang-cu13) platform="$SGLANG_PLATFORM" train=train-sglang ;;
            vllm-cu13) platform="$VLLM_PLATFORM" train=train-vllm ;;
            sglang-cu12) platform="$SGLANG_CU12_PLATFORM" train=train-sglang-cu12 before="$SGLANG_CU12_KERNELS_BEFORE" ;;
            vllm-cu12) platform="$VLLM_CU12_PLATFORM" train=train-vllm-cu12 before="$VLLM_CU12_KERNELS_BEFORE" ;;
            *) die "no lock for ${rollout} on CUDA ${cuda} (ROLLOUTS: sglang vllm; CUDA_VERSIONS: 12 13)" ;;
        esac
        [[ "$rollout" == sglang ]] && flags+=(--override requirements/sglang-overrides.txt)
        if [[ -n "$before" ]]; then
            for lib in $KERNEL_LIBS; do flags+=(--exclude-newer-package "${lib}=${before}"); done
        fi
        for version in $PYTHON_VERSIONS; do
            out="requirements/gpu-${rollout}-cu${cuda}-py${version}.txt"
            echo "resolving ${out} (${platform})"
            "$UV" pip compile setup.py \
                --extra retriever --extra gpu --extra report --extra "cupy-cu${cuda}" --extra "$train" \
                --python-version "$version" --python-platform "$platform" ${flags[@]+"${flags[@]}"} \
                --no-emit-package "$NO_EMIT" \
                --custom-compile-command "make lock  (Python ${version}, CUDA ${cuda}, ${platform})" \
                --quiet -o "$out" \
                || die "${out}: the resolver found no solution (output above)"
        done
    done
done
