tar xzf .devpack/pack.tgz
export LD_LIBRARY_PATH=$PWD/.devlib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
( timeout 200 sh tests/run.sh build/tests/gpu/test_prefill 2>&1 | grep -E "timing|FAIL|passed|GPU's own" | tail -n 24 )
( timeout 200 sh tests/run.sh build/tests/gpu/test_prefill_model 2>&1 | tail -n 8 )
( timeout 200 sh tests/run.sh build/tests/gpu/test_golden_cuda 2>&1 | tail -n 2 )
( timeout 200 build/qwen35 bench --dummy qwen3.5-0.8b --backend cuda --prefill-list 128,512,2048,8192 --ctx-list 128 --iters 50 2>&1 | grep -E "^\| [0-9]|^\| (deltanet|norm|gemm|attn)" )
