#!/bin/sh
# Builds cinit_amd64.elf, the jail's standalone C init (cinit.c over the
# freestanding run-time cinit_rt.c), which the jail embeds, and
# cinit_amd64.sum: the SHA-256 of the sources it was built from and the
# compiler that built it. Run by `go generate ./mechanism/jail` after a
# change to either file. TestEmbeddedInitIsCurrent checks the sum against
# the sources, and with the same compiler rebuilds the program and checks
# it byte for byte. Needs gcc for x86-64.
set -eu
cd "$(dirname "$0")"
out=${1:-cinit_amd64.elf}
sum=${2:-cinit_amd64.sum}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# No C library, no start files, no stack protector (it needs the C
# library's canary), no fortified calls, no PIE (nothing to relocate
# it), no build id (the output depends on the sources alone).
${CC:-gcc} -std=gnu11 -O2 -static -nostdlib -nostartfiles -ffreestanding -fno-builtin \
	-fno-stack-protector -fno-asynchronous-unwind-tables -fno-pie -no-pie \
	-U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -DCI_STANDALONE \
	-Wall -Wno-unused-function \
	-Wl,--build-id=none -Wl,-z,noexecstack -Wl,-z,norelro -s \
	-o "$tmp/cinit" cinit.c cinit_rt.c
{
	echo "sources $(cat cinit.c cinit_rt.c gencinit.sh | sha256sum | cut -d' ' -f1)"
	echo "compiler $(${CC:-gcc} --version | head -n 1)"
} > "$tmp/sum"
mv "$tmp/cinit" "$out"
mv "$tmp/sum" "$sum"
