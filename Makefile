# Two commands on a fresh machine (Python 3.11, 3.12 or 3.13, Node 20 + npm, make):
#   make demo   run the orders consumer against Azurite with an at-least-once stream
#   make test   lint, types, delivery checks, checkov, every test not marked long, two at a time
#               (Azurite started by the tests); ARGS go to pytest: make test ARGS="tests/unit/test_keys.py -k body_field"
#   make test-long  what CI adds: the tests marked long, the other Pythons, the adopters' paths
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Python's own default (a machine may switch it off): each test process and command reuses the
# compiled modules and pytest's rewritten tests instead of compiling them again.
unexport PYTHONDONTWRITEBYTECODE
# A target that drives the example says so once make remove-example deleted it.
example = @test -e $(1) || { echo "make $@ drives the example, which make remove-example deleted" >&2; exit 2; }

.PHONY: install demo test lint typecheck chaos bench prove check-retention check-leases scan-infra worker recipe recipe-off \
	remove-example test-long test-versions test-adopters clean

install: $(VENV)/.installed lab/node_modules/.installed

$(VENV)/.installed: requirements.txt tests/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r tests/requirements.txt
	touch $@

.venv-checkov/.installed: lab/requirements-checkov.txt
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install --quiet --upgrade pip
	.venv-checkov/bin/python -m pip install --quiet -r lab/requirements-checkov.txt
	touch $@

lab/node_modules/.installed: lab/package.json lab/package-lock.json
	npm ci --prefix lab --no-audit --no-fund
	touch $@

demo: install
	$(call example,lab/demo.py)
	$(PY) -m lab.demo

# Switch a recipe on (recipes/README.md): its module moves into consumers/, its name into
# infra/recipes.json (what the next deployment creates for it). make recipe NAME=eventhubs;
# make recipe-off NAME=eventhubs moves both back.
recipe: $(VENV)/.installed
	$(call example,recipes)
	$(PY) -m lab.recipe $(NAME)

recipe-off: $(VENV)/.installed
	$(call example,recipes)
	$(PY) -m lab.recipe --off $(NAME)

# The long fault-injection run; knobs: CHAOS_MESSAGES CHAOS_WORKERS CHAOS_DUP_RATE
# CHAOS_FAULT_RATE CHAOS_SEED CHAOS_OUTAGE (see docs/reliability.md).
chaos: install
	$(call example,lab/chaos.py)
	$(PY) -m lab.chaos

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy shared consumers function_app.py lab $(wildcard recipes)

# A consumer's proof bigger than its test (docs/testing.md): PROOF=module:name of a Proof, MESSAGES,
# STORE (table-lean, table-sdk, memory), SEED (random unless given; printed); exit 1 on a violation.
MESSAGES ?= 2000
STORE ?= table-lean
prove: install
	@if [ -z "$(PROOF)" ]; then echo "make prove: name the proof, PROOF=module:name (e.g. tests.test_stock:PROOF)" >&2; exit 2; fi
	$(PY) -m shared.idempotency.testing $(PROOF) --messages $(MESSAGES) --store $(STORE) $(if $(SEED),--seed $(SEED))

# Store round trips and throughput per scenario, the purge, and the consumer through the real
# Functions worker (fetched by `make worker` unless FUNCTIONS_PYTHON_WORKER names it);
# writes lab/bench/results/latest.{json,md,png}.
bench: install
	$(call example,lab/bench)
	$(if $(FUNCTIONS_PYTHON_WORKER),,$(MAKE) worker)
	$(PY) -m lab.bench

# Dedup markers must outlive every redelivery infra/ allows; a dead step owner's claim
# must lapse while the broker still has deliveries left (lab/delivery_checks.py).
check-retention: install
	$(PY) -m lab.delivery_checks retention

check-leases: install
	$(PY) -m lab.delivery_checks leases

# checkov on infra/: every check it fails is fixed or skipped in the template with a reason
# (infra/.checkov.yaml); the project's own policies (lab/infra_checks.py) run in pytest.
scan-infra: .venv-checkov/.installed
	.venv-checkov/bin/checkov --config-file infra/.checkov.yaml

# The real Azure Functions Python worker for tests/runtime (online: GitHub release 4.34.0,
# every file checked against lab/runtime/python-worker-4.34.0.sha256). Offline, set
# FUNCTIONS_PYTHON_WORKER to the release archive or folder instead.
worker: install
	$(PY) -m lab.runtime.build

# The example (orders, its recipes, and what drives them: demo, chaos, bench, the smoke client),
# deleted at once with the order_events subscription in infra/main.bicep: what stays is the
# library, its tests (on tests/app.py) and your consumers; what is left to edit is listed.
EXAMPLE := consumers/orders.py consumers/order_events.py recipes tests/example lab/order_effects.py \
	lab/demo.py lab/chaos.py lab/chain.py lab/eventhub.py lab/sessions.py lab/other_triggers.py \
	lab/soak.py lab/outbox_cost.py lab/queue_chaos.py lab/balances_chaos.py lab/blob_import_run.py lab/recipe.py lab/findings.py lab/delay_proxy.py lab/bench lab/client docs/requests.http
# The example's block in infra/main.bicep (through the blank line after it), deleted with it.
SUBSCRIPTION_BLOCK := \/\/ The example's: the order_events function's subscription
# Refused while a recipe is switched on: its module in consumers/ (your code by then) may use the example's
# consumers (their handlers and schemas: the http, topic and cloudevents-http recipes do).
USING_EXAMPLE = $(shell grep -lE 'from consumers[.](orders|order_events) import' \
	$(filter-out $(EXAMPLE),$(wildcard consumers/*.py)) 2>/dev/null)
remove-example:
	@if [ -n "$(USING_EXAMPLE)" ] || [ "$$(tr -d ' \n' < infra/recipes.json)" != "[]" ]; then \
		echo "make remove-example: switch the recipes off first, make recipe-off NAME=<name> for each" \
			"(infra/recipes.json: $$(tr -d ' \n' < infra/recipes.json);" \
			"in consumers/ and using consumers/orders.py or order_events.py: $(or $(USING_EXAMPLE),none))" >&2; exit 2; fi
	@if grep -q "^$(SUBSCRIPTION_BLOCK)" infra/main.bicep; then \
		sed "/^$(SUBSCRIPTION_BLOCK)/,/^$$/d" infra/main.bicep > infra/main.bicep.new && mv infra/main.bicep.new infra/main.bicep \
		&& echo "Removed the order_events function's Event Grid subscription from infra/main.bicep."; fi
	@rm -rf $(EXAMPLE)
	@echo "Removed the example. Left for you to edit (docs/pattern.md#without-the-example):"
	@echo "  the orders queue: rename it for a consumer of yours, or leave it unused (infra/modules/servicebus.bicep,"
	@echo "    ORDERS_QUEUE in infra/main.bicep and local.settings.json.example, infra/emulator/servicebus-config.json)"
	@echo "  README.md: the default app, the ORDERS_QUEUE setting and the recipes describe the example"

# Two lanes. make test, the adopter's loop: every test not marked long, on pytest-xdist workers
# (JOBS; each its own Azurite), a module's tests on one worker (they share its servers).
# make test-long, the rest of the proof (.ci/run runs it after make test): the tests marked long,
# each with its reason (pytest.mark.long), the other Pythons, the adopters' paths; all three run,
# and what failed is named at the end.
JOBS ?= 2
PYTEST = $(PY) -m pytest -q -n $(JOBS) --dist loadfile
test: lint typecheck check-retention check-leases scan-infra
	$(PYTEST) -m "not long" $(ARGS)

test-long: install .venv-checkov/.installed
	@failed=""; $(PYTEST) -m long $(ARGS) || failed="$$failed pytest"; \
	$(MAKE) --no-print-directory test-versions || failed="$$failed test-versions"; \
	$(MAKE) --no-print-directory test-adopters || failed="$$failed test-adopters"; \
	if [ -n "$$failed" ]; then echo "make test-long: failed:$$failed" >&2; exit 1; fi

# The template as its adopters change it, each in a copy: README "Start your own app" followed,
# names of the adopter's own, every recipe switched on, the example removed; then make test there,
# and the walkthroughs (lab/adopters.py).
test-adopters: install .venv-checkov/.installed
	$(PY) -m lab.adopters

# The other supported Pythons (of 3.11, 3.12, 3.13): make test with each, in .venv-X.Y
# (lab/pythons.py; a missing interpreter is named in one line).
test-versions: install
	$(PY) -m lab.pythons

clean:
	rm -rf $(VENV) .venv-3.* .venv-checkov lab/node_modules .pytest_cache .mypy_cache .ruff_cache .hypothesis .runtime
