#!/usr/bin/env bash
# One session on a lent GPU (the device tool): gpu-check, the decode probe (tools/h200_probes.py),
# two of the committed bench points again and one under recompute op (torchtitan's policy on CUDA), everything under $OUT/h200 and packed into $OUT/h200.tgz
# after each part, so a run stopped at its time limit still brings back what finished.
#   usage (from the repository root, on the GPU machine): bash tools/h200_session.sh COMMIT
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null || exit 1  # editable: strategies/ maps to tspbench.strategies
R=$OUT/h200; mkdir -p "$R/bench"
echo "${1:-unknown}" > "$R/commit.txt"
pack() { tar czf "$OUT/h200.tgz" -C "$OUT" h200; }
nvidia-smi --query-gpu=name,memory.total,power.limit,driver_version --format=csv > "$R/nvidia_smi.csv"
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" > "$R/versions.txt"
T0=$SECONDS
timeout 420 tspbench gpu-check --out "$R/gc" --check-seconds 150 2>&1 | grep -v '^USDT' | tail -40
echo "gpu-check: $((SECONDS - T0)) s"; pack
timeout 100 python3 -m tools.h200_probes "$R/probes" decode_kernels 2>&1 | grep -v '^USDT' | tail -5; pack
echo "probes: $((SECONDS - T0)) s"
B="tspbench bench --device cuda --hardware h200 --json --dtype bfloat16 --strategy dp"
timeout 45 $B --model 1b --seq-len 8192 --steps 5 --warmup 2 --trace "$R/bench/b1_1b_8k_train.npz" > "$R/bench/b1_1b_8k_train.json"
timeout 50 $B --model 7b --seq-len 32768 --mode infer --steps 3 --warmup 1 --trace "$R/bench/b2_7b_32k_infer.npz" > "$R/bench/b2_7b_32k_infer.json"
timeout 45 $B --model 1b --seq-len 8192 --recompute op --steps 3 --warmup 1 --trace "$R/bench/b4_1b_8k_op.npz" > "$R/bench/b4_1b_8k_op.json"
echo "all: $((SECONDS - T0)) s"; pack
