#!/bin/sh
# Packs what the GPU machine needs into .devpack/pack.txz (ignored by git; carry ".devpack"):
# the binaries (host debug info stripped; the device code and its line info stay), the shared libraries
# they need (scripts/pack-devlib.sh) and the Qwen3 tokenizer data; `devpack.sh trace` adds
# build-trace/qwen35 (gpu-check.sh trace); build-base/qwen35 and build-base/serve_step, an older build, when present
# (gpu-check.sh identity, ab.sh, ab-serve.sh). The carry limit is 64 MiB in all, working tree included: xz
# keeps the whole set near 35 MB where gzip needed ~60 (DEVPACK_GZ=1: .devpack/pack.tgz, faster to make).
# DEVPACK_TESTS="gemm serve_cuda": only those build/tests/gpu/test_* (default all); DEVPACK_EXTRA: more files to
# pack as they are named, e.g. "build-exp/qwen35 build-exp/bench/serve_step" of a measurement build (BUILD=build-exp).
set -e
cd "$(dirname "$0")/.."
rm -rf .devlib && sh scripts/pack-devlib.sh >/dev/null
mkdir -p .devpack
rm -f .devpack/pack.txz .devpack/pack.tgz
for f in $(ls build/bench/* 2>/dev/null); do # `make` alone does not build them: refresh any that are stale
    case $f in *.d | *.o) continue ;; esac
    make -s "$f"
done
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
tests=build/tests/gpu/test_*
[ -n "${DEVPACK_TESTS:-}" ] && tests=$(for t in $DEVPACK_TESTS; do echo "build/tests/gpu/test_$t"; done)
for f in build/qwen35 $tests $(ls build/bench/* 2>/dev/null) $(ls build-base/qwen35 build-base/serve_step 2>/dev/null) \
         $([ "${1:-}" = trace ] && ls build-trace/qwen35 2>/dev/null) ${DEVPACK_EXTRA:-}; do
    case $f in *.d | *.o) continue ;; esac
    [ -f "$f" ] || continue
    mkdir -p "$T/$(dirname "$f")"
    strip -o "$T/$f" "$f" 2>/dev/null || cp "$f" "$T/$f"
done
cp -r .devlib "$T/"
[ -d .cache/qwen3-tokenizer ] && mkdir -p "$T/.cache" && cp -r .cache/qwen3-tokenizer "$T/.cache/"
if [ "${DEVPACK_GZ:-0}" = 1 ]; then
    (cd "$T" && tar czf - .) > .devpack/pack.tgz
    ls -la .devpack/pack.tgz
else
    (cd "$T" && tar cf - . | xz -T2 -6) > .devpack/pack.txz
    ls -la .devpack/pack.txz
fi
