# etcdwatch: `make test` is the test command CI runs; `make run` the demo.
GO ?= go
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
# The root module and the nested modules that need a real etcd.
# The bench module has no tests (vet only); it goes first so that the run
# closes on test results.
MODULES := internal/bench compat/etcd35/server compat/etcd36/server . etcdwatchtest etcdwatchprom clientv3watch internal/e2e examples compat/scenarios compat/etcd37 compat/etcd36 compat/etcd35 compat/etcd34
FUZZTIME ?= 30s
# staticcheck, pinned; fetched from the module proxy on first use.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
SOAK ?= 5m

.PHONY: test run fuzz lint soak bench

test:
	@set -e; for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...); \
	done

# ARGS passes flags to the example, e.g. make run ARGS="-endpoints 127.0.0.1:2379 -prefix app/"
run:
	cd examples && $(GO) run ./prefixwatch $(ARGS)

# A randomized mix of faults against a 3-member cluster for $(SOAK), then a
# check of every watch's whole history; prints a SOAK line with the totals.
soak:
	cd internal/e2e && ETCDWATCH_SOAK=$(SOAK) $(GO) test -race -count=1 -run '^TestSoak' -v -timeout 60m . 2>&1 | grep -v '^{"level"'

# raw, clientv3 and etcdwatch side by side; BENCH and RATIO lines. Sizes by
# flags: make bench ARGS="-reps 5 -create 20000". Go benchmarks of the
# dispatcher's hot paths: go test -bench . -benchmem (benchstat-friendly).
bench:
	cd internal/bench && $(GO) run . $(ARGS) 2>&1 | grep -v '^{"level"'

# Each fuzzer in turn, $(FUZZTIME) each: response sequences, the codec
# against generic protobuf both ways (and against responses the generated
# code writes, with unknown fields and merges), the views' copy-on-write map
# against a plain map (every old snapshot unchanged), and the loader of
# saved view states (what it accepts re-encodes byte for byte).
fuzz:
	@set -e; for f in FuzzDispatcher FuzzDecode FuzzDecodeAgreesWithProtobuf FuzzEncode; do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) .; \
	done
	$(GO) test -run '^$$' -fuzz '^FuzzMap$$' -fuzztime $(FUZZTIME) ./internal/cow
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) ./view

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	@set -e; for m in $(MODULES); do \
		echo "== lint $$m"; \
		(cd $$m && $(GO) vet ./... && $(GO) mod tidy -diff && $(GO) run $(STATICCHECK) ./...); \
	done
	@echo "== lint . on GOARCH=386, where int has 32 bits"; GOARCH=386 $(GO) vet ./...
