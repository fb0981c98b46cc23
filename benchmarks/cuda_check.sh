#!/usr/bin/env bash
# The CUDA checks in one call of a lent GPU machine. Its image has torch, numpy, sympy,
# hypothesis, pytest, … but nothing can be installed from a registry there, so gptspec
# travels as a wheel built here (`pip wheel --no-deps --no-build-isolation -w .whl .`).
# Every stage has a time limit, and all of them together stay inside TOTAL seconds, so
# the run ends inside the lease and its logs come back.
#
#   bash benchmarks/cuda_check.sh            # on the GPU machine
#   DEVICE=cpu MODEL="--preset shakespeare-char" bash benchmarks/cuda_check.sh  # dry run
#
# Writes to $OUT (./out/cuda when OUT is unset): conformance-<target>.json, bench.md and
# all.log (every log, one after another; the device tool brings back 8 files at most).
set -u
OUT=${OUT:-out/cuda}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-500}
MODEL=${MODEL:---preset gpt2 --vocab-size 256 --n-ctx 256}  # GPT-2-small width, short context
LOG=/tmp/gptspec-cuda
WORK=/tmp/gptspec-work
mkdir -p "$OUT"; rm -rf "$LOG" "$WORK"; mkdir -p "$LOG" "$WORK"
export PYTHONUNBUFFERED=1
cap() { local left=$((TOTAL - SECONDS - 15)); echo $(( $1 < left ? $1 : (left > 1 ? left : 1) )); }
note() { echo "$*" >> "$LOG/summary.txt"; }

if ls .whl/gptspec-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/gptspec-*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
# Tests and benchmarks run from a copy: in the source tree ./gptspec, which lacks the
# subpackages that package-dir maps in (spec, reference, fast, …), would shadow the wheel.
cp -r tests benchmarks "$WORK"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c "import torch, numpy, sympy, hypothesis; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'sympy', sympy.__version__, 'hypothesis', hypothesis.__version__)"
  echo "cpus $(nproc)"
} > "$LOG/env.txt" 2>&1
cat "$LOG/env.txt"

# 1. Conformance: the built-in backend in every dtype and the forced SDPA kernels, in
#    parallel (the float64 reference runs on the CPU: a few threads each), and the
#    project's device-parametrised tests beside them.
conformance() {  # name backend dtype area
  PYTHONPATH="$WORK" OMP_NUM_THREADS=3 timeout -k 10 "$(cap 200)" gptspec conformance --backend "$2" \
    --device "$DEVICE" --dtype "$3" --profile quick --area "$4" --timeout 120 \
    --adjudicate-with none --report "$OUT/conformance-$1.json" > "$LOG/conformance-$1.log" 2>&1
  note "conformance $1: exit $?"
}
conformance torch-float32 torch float32 all &
conformance torch-bfloat16 torch bfloat16 all &
conformance torch-float16 torch float16 all &
conformance flash-bfloat16 meta.sdpa_kernels:flash bfloat16 forward &
conformance efficient-float16 meta.sdpa_kernels:efficient float16 forward &
(cd "$WORK" && OMP_NUM_THREADS=2 timeout -k 10 "$(cap 200)" python3 -m pytest -q -x \
   -p no:cacheprovider tests/test_fast.py tests/test_conformance_sdpa_kernels.py \
   -k "$DEVICE" > "$LOG/pytest.log" 2>&1; note "pytest -k $DEVICE: exit $?") &
wait

# 2. Training with autocast (bf16; fp16 with loss scaling) and fused AdamW, a resume,
#    and generation from the checkpoint.
RUN=/tmp/gptspec-train
train() {  # log-name precision steps [--resume]
  timeout -k 10 "$(cap 90)" gptspec train $MODEL --steps "$3" --batch-size 8 \
    --eval-interval 20 --eval-batches 4 --device "$DEVICE" --precision "$2" \
    --out "$RUN-$2" --no-progress ${4:-} > "$LOG/train-$1.log" 2>&1
  note "train $1: exit $?"
}
train bfloat16 bfloat16 40
train float16 float16 40
train resume bfloat16 60 --resume
for dtype in bfloat16 float32; do
  timeout -k 10 "$(cap 60)" gptspec generate --checkpoint "$RUN-bfloat16/checkpoint" \
    --prompt "def f(x):" --max-new-tokens 64 --temperature 0 --device "$DEVICE" \
    --dtype $dtype > "$LOG/generate-$dtype.log" 2>&1
  note "generate $dtype: exit $?"
done

# 3. The GPU benchmark, alone on the device (MFU of GPT-2-small training, generation
#    throughput), with the device's measured matmul rate and copy bandwidth beside it.
(cd "$WORK" && timeout -k 10 "$(cap 240)" python3 - "$LOG/bench" > "$LOG/bench.log" 2>&1 <<'EOF'
import sys
from pathlib import Path

from benchmarks import gpu, machine, run

modules = [m for m in run.discover() if m.name == "gpu"]
result = run.run_all(modules, rounds=1, quick=False)
report = result.rounds[0]
if gpu.torch.cuda.is_available():
    for label, dtype in (("float32", gpu.torch.float32), ("bf16", gpu.torch.bfloat16)):
        rate = machine.matmul_rate("cuda", dtype, 8192, 5)
        report.metric("machine", f"{label} matmul (cuda)", rate / 1e9, "GFLOP/s", "8192³")
    report.metric("machine", "memory copy (cuda)",
                  machine.copy_bandwidth("cuda", 2 << 30, 5) / 1e9, "GB/s", "read + write")
summary = {"environment": run.environment(), "quick": False, "modules": ["gpu"],
           **run.merge(result)}
_, md = run.write(summary, Path(sys.argv[1]))
print(md.read_text())
EOF
); note "bench gpu: exit $?"
cp "$LOG/bench/bench.md" "$OUT/bench.md" 2>/dev/null

for f in "$LOG"/*.txt "$LOG"/*.log; do echo "===== $f"; cat "$f"; done > "$OUT/all.log"
echo "===== summary ($SECONDS s)"; cat "$LOG/summary.txt"
for f in "$LOG"/conformance-*.log; do
  echo "== $f"; grep -E "^(FAIL|ERR|BLKD)| passed, " "$f" | head -12
done
grep -E "passed|failed|rror" "$LOG/pytest.log" | tail -4
tail -n 3 "$LOG"/train-*.log "$LOG"/generate-*.log
grep -E "cuda|MFU|failed" "$OUT/bench.md" 2>/dev/null
