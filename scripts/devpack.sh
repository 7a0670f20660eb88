#!/bin/sh
# Packs what the GPU machine needs into .devpack/pack.tgz (ignored by git; carry ".devpack"):
# the binaries, the shared libraries they need (scripts/pack-devlib.sh) and the Qwen3 tokenizer data;
# `devpack.sh trace` adds build-trace/qwen35 (gpu-check.sh trace; the carry limit is 64 MiB in all).
set -e
cd "$(dirname "$0")/.."
rm -rf .devlib && sh scripts/pack-devlib.sh >/dev/null
mkdir -p .devpack
tar czf .devpack/pack.tgz --exclude='*.d' build/qwen35 build/tests/gpu $(ls -d build/bench 2>/dev/null) .devlib \
    $(ls -d .cache/qwen3-tokenizer 2>/dev/null) $([ "${1:-}" = trace ] && ls build-trace/qwen35 2>/dev/null)
ls -la .devpack/pack.tgz
