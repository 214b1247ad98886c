# Convenience targets; scripts/ hold the real logic.
FUZZ_SECONDS ?= 60

.PHONY: test fuzz fuzz-seeds man deb

test:
	bash scripts/test.sh

# Runs every fuzz target for FUZZ_SECONDS seconds (needs a nightly toolchain).
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

fuzz-seeds:
	bash fuzz/seed.sh fuzz/seeds

# Man pages from the clap definitions: target/man/cryptblk.8, cryptblk-COMMAND.8.
man:
	cargo build --release -p cryptblk
	target/release/cryptblk generate-man target/man

# The Debian package: target/debian/cryptblk_VERSION_ARCH.deb (scripts/build-deb.sh).
deb:
	cargo build --release -p cryptblk
	bash scripts/build-deb.sh target/release/cryptblk target/debian
