tar xzf .devpack/pack.tgz
export LD_LIBRARY_PATH=$PWD/.devlib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
timeout 200 build/bench/gemm_lab 2>&1 | grep -vE "^  (wgmma|wgmmaP|mma|cublas) " | tail -n 70
timeout 200 sh tests/run.sh build/tests/gpu/test_gemm 2>&1 | tail -n 4
