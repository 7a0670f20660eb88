tar xzf .devpack/pack.tgz
export LD_LIBRARY_PATH=$PWD/.devlib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
mkdir -p $OUT
( timeout 150 build/bench/gemm_lab 2>&1 | tail -n 45 ) | tee $OUT/gemm_lab.log
( timeout 200 sh tests/run.sh build/tests/gpu/test_gemm 2>&1 | tail -n 6 )
( timeout 120 sh tests/run.sh build/tests/gpu/test_decode 2>&1 | tail -n 4 )
( QWEN35_GEMM=tma timeout 200 sh tests/run.sh build/tests/gpu/test_prefill 2>&1 | grep -E "timing|FAIL|passed" | tail -n 12 )
