# make demo: set up and run the daemon on the built-in emulated fabric.
# make test: set up and run the whole test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEBS := ibsim-utils libibumad3 infiniband-diags opensm mosquitto prometheus chromium

.PHONY: demo test lint system-deps fixtures clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Debian packages the tests drive (ibsim, diags, OpenSM, mosquitto, Prometheus, chromium).
# Installed only when running as root and only when something is missing.
system-deps:
	@if [ "$$(id -u)" = 0 ]; then \
	  missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  fi; \
	else echo "not root: skipping Debian packages ($(DEBS))"; fi

demo: $(STAMP)
	@echo "ibfm daemon on the built-in emulated fabric (2-level fat-tree, 32 hosts). Open:"
	@echo "  http://127.0.0.1:9690/                                                the fabric page"
	@echo "  http://127.0.0.1:9690/api/v1/health                                   subnet health"
	@echo "  http://127.0.0.1:9690/api/v1/routes?src=host-00000&dst=host-00031     a route"
	@echo "  http://127.0.0.1:9690/api/v1/nodes                                    topology"
	@echo "  http://127.0.0.1:9690/api/v1/openapi.json                             the API"
	@echo "  http://127.0.0.1:9690/metrics                                         Prometheus"
	@echo "Ctrl-C stops it. 'ibfm demo' instead runs the SM once and prints what it did."
	$(VENV)/bin/ibfm serve

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy fabric sm exporters ibfm
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy fabric sm exporters ibfm

fixtures: $(STAMP) system-deps
	$(PY) scripts/capture_fixtures.py

clean:
	rm -rf $(VENV) build *.egg-info
