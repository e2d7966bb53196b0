#!/usr/bin/env bash
# One short check on a machine with NVIDIA GPUs (never part of CI): NCCL gang, CUDA device
# per local rank, Lightning on the GPU, a too-big gang refused, the CPU rehearsal of it.
# The GPU machine needs torch and lightning installed, and in .whl/ the wheels of metaflow,
# boto3, botocore, s3transfer, jmespath (pip download) and of this package (pip wheel .).
# Writes what it saw to $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 USERNAME=gpu METAFLOW_HOME=/tmp/mfhome
work=$(mktemp -d); cp tests/gpu/*_flow.py "$work"; cd "$work"
{
  nvidia-smi -L; ls /proc/driver/nvidia/gpus 2>&1
  python3 -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count(), 'lightning', lightning.__version__)"
} > "$OUT/env.txt" 2>&1
run() { name=$1; shift; start=$(date +%s.%N)
  timeout 240 "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "$name rc=$rc wall=$(echo "$(date +%s.%N) - $start" | bc)s" >> "$OUT/summary.txt"; }
run nccl python3 nccl_flow.py --no-pylint run
run nccl_exec env METAFLOW_TORCH_DISTRIBUTED_START_METHOD=exec python3 nccl_flow.py --no-pylint run
run lightning python3 lightning_flow.py --no-pylint run
run too_many python3 too_many_gpus_flow.py --no-pylint run
run rehearsal env METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1 python3 too_many_gpus_flow.py --no-pylint run
cat "$OUT/env.txt" "$OUT/summary.txt"; grep -h "GPU-REPORT" "$OUT"/*.log
grep -h -A3 "needs 4 GPUs\|Error\|error" "$OUT/too_many.log" | head -20
