#!/bin/bash
# The GPU checks on a lent CUDA machine (one H200 image: Python 3.12, torch with CUDA, transformers, peft, accelerate,
# pandas; no nbdev, no diffusers, no model hub). Two steps:
#   1. here, where pip reaches PyPI:   bash tests/gpu_check.sh wheels
#      (Python 3.12 wheels of what that image lacks, at the versions the CPU tests use, into .whl/, which git ignores)
#   2. there, through the device tool: run(command="bash tests/gpu_check.sh", carry=[".whl"], timeout_s=540)
# It prints one line per check and writes $OUT/gpu_check.json: the `mini` preset's GRPO steps on CUDA (i.i.d. and
# camera SDE draws), a CUDA rollout against the CPU's from the same draws, the camera noise at Wan2.1's size, and the
# wan2.1-1.3b preset's GRPO step on the real-size 1.3B (random weights, bf16) at two sizes with its peak memory against
# worldlab.memory's plan (realsize_memory), the mini-steer-nft preset's DiffusionNFT steps on CUDA, and VBench's
# dimensions (tiny backbones) on CUDA against the CPU (vbench_parity; needs torchvision in the image).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS="diffusers==0.42.1 fastcore==2.2.41 roma==1.8.0 kornia==0.9.0 kornia_rs==0.2.0 lpips==0.1.4
        importlib_metadata==10.2.0 transformers==5.25.0 peft==0.21.2 accelerate==1.16.0"
if [ "${1:-}" = wheels ]; then
    rm -rf .whl && mkdir -p .whl
    for w in $WHEELS; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .whl "$w" || exit 1
    done
    du -sh .whl; exit 0
fi
[ -d .whl ] || { echo "no .whl/: run 'bash tests/gpu_check.sh wheels' on the CPU machine first, and carry .whl"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT="${OUT:-outputs/gpu_check}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 tests/gpu_check.py --device cuda --preset mini --steps 2 --out "$OUT"
