#!/bin/sh
# Builds the step-trace binary at each probe point (src/cuda/common.cuh Q35_T1_AT): build-trace/qwen35
# (t1 after the wait) first, then build-traceN/qwen35 for each N given (default 1 2 3 4 5 6) by copying
# build-trace and recompiling only the kernels with probe points (deltanet, attention, mlp, dn_layer; or
# those named in PROBE_KERNELS, e.g. PROBE_KERNELS=dn_layer). Then
# `scripts/devpack.sh trace` packs build-trace only; pack the others by hand (each ~6 MB compressed; the
# carry limit is 64 MiB in all). On the GPU machine: QWEN35_TRACE_CSV=t.csv build-traceN/qwen35 bench
# --dummy qwen3.5-0.8b --backend cuda --ctx-list 128 --prefill-list 1, then tools/step_trace.py t.csv:
# its "release" column is then the time at probe N (docs/PERF_NOTES.md §15).
set -e
cd "$(dirname "$0")/.."
make -s TRACE=1 BUILD=build-trace build-trace/qwen35
for n in ${*:-1 2 3 4 5 6}; do
    rm -rf "build-trace$n"
    cp -a build-trace "build-trace$n"
    for k in ${PROBE_KERNELS:-deltanet attention mlp dn_layer}; do rm -f "build-trace$n/src/cuda/$k.o"; done
    make -s TRACE=1 T1_AT="$n" BUILD="build-trace$n" "build-trace$n/qwen35"
    echo "build-trace$n/qwen35"
done
