# Every target bootstraps .venv itself (torch pinned to the local CPU build via constraints.txt).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= all,dev
PIPELINES ?= $(wildcard pipelines/*.toml)

.PHONY: venv shards test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	# noisebase 1.1.1 is the tests' reference loader; its declared deps (pyfvvdp, ...) would pull
	# CUDA torch, so it goes in without them plus the few it really imports
	$(PY) -m pip install -q -c constraints.txt --no-deps noisebase==1.1.1
	$(PY) -m pip install -q -c constraints.txt "hydra-core>=1.3" "omegaconf>=2.3" "imageio>=2.30" requests tqdm
	touch $(STAMP)

shards: $(STAMP)
	@set -e; for spec in $(PIPELINES); do $(VENV)/bin/wdsprep pipeline $$spec --quiet; done

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf shards/*/ data/ bench-work/
