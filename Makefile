# Convenience targets; scripts/ hold the real logic.
FUZZ_SECONDS ?= 60

.PHONY: test fuzz fuzz-seeds

test:
	bash scripts/test.sh

# Runs every fuzz target for FUZZ_SECONDS seconds (needs a nightly toolchain).
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

fuzz-seeds:
	bash fuzz/seed.sh fuzz/seeds
