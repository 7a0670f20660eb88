#!/bin/sh
# Copies the shared libraries build/qwen35 needs beyond glibc and the CUDA driver into .devlib/
# (ignored by git), so binaries built here run on the GPU machine (another distribution):
# carry .devlib with the build folder and set LD_LIBRARY_PATH=.devlib there.
set -e
mkdir -p .devlib
ldd build/qwen35 | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so*|libm.so*|libresolv.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libgcc_s.so*|libstdc++.so*) ;;
        *) cp -L "$lib" .devlib/ ;;
    esac
done
ls .devlib
