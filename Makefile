# Every target bootstraps .venv itself (torch pinned to the local CPU build via constraints.txt).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= all,dev
PIPELINES ?= $(wildcard pipelines/*.toml)

AZURITE := $(VENV)/node/node_modules/.bin/azurite-blob

.PHONY: venv shards test bench bench-remote bench-smoke verify-shards clean azurite

venv: $(STAMP)

# noisebase 1.1.1 is the tests' reference loader; its declared deps (pyfvvdp, pytorch-msssim) would
# pull CUDA torch, so it goes in without them, after the few it really imports, and LAST: pip skips
# its dependency check for a --no-deps install, while any later plain install would complain about
# those two undeclared packages although nothing failed (so a re-install removes it first).

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip uninstall -q -y noisebase 2>/dev/null || true  # a re-install: keep it last again
	$(PY) -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q -c constraints.txt "hydra-core>=1.3" "omegaconf>=2.3" "imageio>=2.30" requests tqdm
	$(PY) -m pip install -q -c constraints.txt --no-deps noisebase==1.1.1
	touch $(STAMP)

shards: $(STAMP)
	@set -e; for spec in $(PIPELINES); do $(VENV)/bin/wdsprep pipeline $$spec --quiet; done

# Azurite (the az:// tests' emulator, an npm package) into .venv/node; without npm the az:// tests
# skip, saying so
azurite: $(AZURITE)

$(AZURITE): | $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
		npm install --no-audit --no-fund --loglevel=error --prefix $(VENV)/node azurite@3.37.0; \
	else echo "npm not found: Azurite not installed, the az:// tests will skip"; fi

test: $(STAMP) $(AZURITE)
	$(PY) -m pytest -q

BENCH_STAMP := $(VENV)/.bench-stamp

# the peers of benchmarks/bench_peers.py: without their declared deps (torchvision would replace
# the pinned torch), then the modules they really import
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[bench-imports]"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) $(AZURITE)
	$(PY) benchmarks/run.py

# the remote read path's bench, wdsprep alone over HTTP (unshaped and 40 ms, 0 and 2 workers, 3 runs):
# re-run it whenever stream/remote.py, stream/worker.py, stream/read.py or storage/ change; prints its table
bench-remote: $(STAMP)
	BENCH_REMOTE_QUICK=1 $(PY) benchmarks/run.py --one bench_remote

# every benchmark at tiny sizes: proves `make bench` still runs (no speed is asserted)
bench-smoke: $(STAMP) $(AZURITE)
	$(PY) benchmarks/run.py --smoke

# each pipeline's manifest exists and every shard verifies (sha256, counts, members decode)
verify-shards: $(STAMP)
	@set -e; for spec in $(PIPELINES); do \
		out=$$($(PY) -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['output'])" $$spec); \
		test -f $$out/manifest.json || { echo "$$spec: no manifest at $$out/manifest.json"; exit 1; }; \
		printf '%s: ' $$out; $(VENV)/bin/wdsprep verify $$out --quiet; \
	done

clean:
	rm -rf shards/*/ data/ bench-work/ bench-work-smoke/
