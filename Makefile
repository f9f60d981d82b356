# bootfsm developer entry points. Each target installs what it needs.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the simulator and tests use: makeself (runfiles), dpkg-deb (debs),
# xz (tar.xz), systemd (systemd-analyze verify), chromium (headless: trace --html and
# Mermaid render tests), npm (fetches the pinned Mermaid bundles), zsh and groff (the
# generated completion and man page are checked by the real tools).
APT_PKGS := makeself dpkg xz-utils systemd chromium
SKU     ?= gb300

.PHONY: all demo test test-booted lint fmt docs bench fuzz deps deps-sim mermaid mypy-tree _apt clean

all: test

# deps-sim: what the simulator needs (the demo); deps: everything the tests use.
deps-sim:
	@$(MAKE) --no-print-directory _apt WANT="makeself:makeself dpkg-deb:dpkg xz:xz-utils gpg:gpg gpg-agent:gpg-agent gpgv:gpgv"

deps:
	@$(MAKE) --no-print-directory _apt WANT="makeself:makeself dpkg-deb:dpkg xz:xz-utils gpg:gpg gpg-agent:gpg-agent gpgv:gpgv systemd-analyze:systemd chromium:chromium npm:npm zsh:zsh groff:groff-base readelf:binutils containerd:containerd modprobe:kmod lspci:pciutils curl:curl jq:jq"
	@$(MAKE) --no-print-directory mermaid

# Real Mermaid releases (their browser bundles) for the render test of `bootfsm graph`.
MERMAID_VERSIONS := 10.9.8 11.17.2
mermaid: $(STAMP)
	@for v in $(MERMAID_VERSIONS); do \
	  d=$(VENV)/mermaid/$$v; [ -f $$d/mermaid.min.js ] && continue; \
	  t=$$(mktemp -d) && (cd $$t && npm pack --silent mermaid@$$v >/dev/null) && \
	  mkdir -p $$d && tar -xzf $$t/mermaid-$$v.tgz -C $$t package/dist/mermaid.min.js && \
	  mv $$t/package/dist/mermaid.min.js $$d/ && rm -rf $$t || exit 1; done

_apt:
	@missing=""; \
	for c in $(WANT); do \
	  command -v $${c%%:*} >/dev/null 2>&1 || missing="$$missing $${c##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

# the venv also gets the build backend pyproject.toml names (a venv seeds an older
# setuptools, which cannot read PEP 639's license string): a test builds with it
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q $$($(PY) -c "import tomli; print(' '.join(tomli.load(open('pyproject.toml', 'rb'))['build-system']['requires']))")
	@$(MAKE) --no-print-directory mypy-tree
	touch $(STAMP)

demo: deps-sim $(STAMP)
	$(VENV)/bin/bootfsm demo --sku $(SKU)

test: deps $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile

# the shipped unit under a real systemd: Debian 12 and 13 and Ubuntu 22.04 and 24.04 images
# (mmdebstrap, cached under /var/cache/bootfsm-booted), booted with systemd-nspawn; the
# suite under each image's python3 (the whole of it under Ubuntu 22.04's 3.10); NVIDIA's
# real user-space from Ubuntu's archive against the stand-ins; needs root (docs/testing.md)
test-booted: $(STAMP)
	@$(MAKE) --no-print-directory _apt WANT="mmdebstrap:mmdebstrap systemd-nspawn:systemd-container dpkg-deb:dpkg git:git"
	@[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq debian-archive-keyring >/dev/null; }
	$(SUDO) $(PY) tests/booted/lane.py

# mypy reads source paths, not the editable install's import hook, so it finds
# bootfsm.states (states/, mapped by [tool.setuptools.package-dir]) through a link made
# here and never committed: build/mypy/bootfsm/states -> states/ ([tool.mypy] mypy_path).
# lint shows mypy's build/mypy/bootfsm/states/x.py as the source path states/x.py.
MYPY_TREE := build/mypy/bootfsm
mypy-tree:
	@mkdir -p $(MYPY_TREE) && touch $(MYPY_TREE)/__init__.py && ln -sfn ../../../states $(MYPY_TREE)/states

lint: $(STAMP) mypy-tree
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo $(VENV)/bin/mypy; $(VENV)/bin/mypy > build/mypy/report.txt; rc=$$?; \
	  sed 's#^$(MYPY_TREE)/states/#states/#' build/mypy/report.txt; exit $$rc

# regenerate docs/machine.md, docs/codes.md and the hook doc's CSE table from the code
docs: $(STAMP)
	$(PY) docs/generate.py

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	@$(MAKE) --no-print-directory _apt WANT="makeself:makeself dpkg-deb:dpkg xz:xz-utils curl:curl jq:jq strace:strace"
	$(PY) bench/run.py

# fuzz every reader of outside input for FUZZ_SECONDS (make fuzz FUZZ_SECONDS=3600)
FUZZ_SECONDS ?= 300
fuzz: $(STAMP)
	FUZZ_SECONDS=$(FUZZ_SECONDS) HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -p no:xdist -s \
	  tests/test_fuzz.py -k test_fuzz_for_a_set_time

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
