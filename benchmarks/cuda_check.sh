#!/usr/bin/env bash
# The CUDA checks in one call of a lent GPU machine. Its image has torch, numpy, sympy,
# hypothesis, pytest, transformers, … but nothing can be installed from a registry there,
# so gptspec travels as a wheel built here (`.nox/tests/bin/python -m pip wheel --no-deps
# --no-build-isolation -w .whl .`, with .whl/ in .git/info/exclude and carried).
# Every stage has a time limit, and all of them together stay inside TOTAL seconds, so
# the run ends inside the lease and its logs come back.
#
#   bash benchmarks/cuda_check.sh            # on the GPU machine
#   DEVICE=cpu TOTAL=900 bash benchmarks/cuda_check.sh   # dry run of the plumbing
#
# 1. conformance (the float64 reference on the CPU, the backend on the GPU) at the default
#    profile in float32, bfloat16 and float16, the forced SDPA kernels, and thorough in
#    float32 and bfloat16 (one process per area), beside the project's CUDA tests and a
#    short compiled training run, resumed, and generation from it;
# 2. then, alone on the device, the GPU benchmark: training MFU, decoding against the
#    bandwidth limit, transformers' generate as the peer.
# Writes to $OUT (./out/cuda when unset): summary.txt, bench.md, conformance.tar.gz (the
# JSON reports) and all.log (every log; the device tool brings back 8 files at most).
set -u
OUT=${OUT:-out/cuda}
DEVICE=${DEVICE:-cuda}
TOTAL=${TOTAL:-560}
PHASE1=${PHASE1:-240}  # seconds for stage 1; the benchmark gets the rest
LOG=/tmp/gptspec-cuda
WORK=/tmp/gptspec-work
mkdir -p "$OUT"; rm -rf "$LOG" "$WORK"; mkdir -p "$LOG/reports" "$WORK"
export PYTHONUNBUFFERED=1
cap() { local left=$((TOTAL - SECONDS - 20)); echo $(( $1 < left ? $1 : (left > 1 ? left : 1) )); }
note() { echo "$*" >> "$LOG/summary.txt"; }

if ls .whl/gptspec-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/gptspec-*.whl || exit 1
  export PATH=/tmp/site/bin:$PATH
  SITE=/tmp/site
else
  SITE=$PWD/src
fi
# tests, benchmarks and the suite's tooling (meta/) run from a copy beside the wheel
cp -r tests benchmarks meta "$WORK"
export PYTHONPATH="$WORK:$SITE"
gptspec() { python3 -m gptspec "$@"; }
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c "import torch, numpy, sympy, hypothesis, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'sympy', sympy.__version__, 'hypothesis', hypothesis.__version__, 'transformers', transformers.__version__)"
  echo "cpus $(nproc)"
} > "$LOG/env.txt" 2>&1
cat "$LOG/env.txt"

# --- 1. conformance, tests, a training run (all in parallel; the CPU does the reference)
conformance() {  # name profile backend dtype area
  OMP_NUM_THREADS=1 timeout -k 10 "$(cap "$PHASE1")" python3 -m gptspec conformance \
    --backend "$3" --device "$DEVICE" --dtype "$4" --profile "$2" --area "$5" \
    --timeout 240 --report "$LOG/reports/$1.json" \
    > "$LOG/conformance-$1.log" 2>&1
  note "conformance $1 ($2 $4 $5): exit $?"
}
for dtype in float32 bfloat16 float16; do
  conformance "default-$dtype" default torch $dtype all &
done
conformance default-flash-bfloat16 default meta.sdpa_kernels:flash bfloat16 forward &
conformance default-efficient-float16 default meta.sdpa_kernels:efficient float16 forward &
thorough() {  # dtype: every check as a pytest item, 6 at a time (pytest-xdist)
  # (interrupted at the limit, pytest still writes the JUnit XML of the checks done)
  (cd "$WORK" && OMP_NUM_THREADS=1 timeout -s INT -k 15 "$(cap "$PHASE1")" python3 -m pytest \
     -q -p no:cacheprovider --pyargs gptspec.conformance -n 6 \
     --gptspec-backend=gptspec.fast.backend:TorchBackend --gptspec-device="$DEVICE" \
     --gptspec-dtype="$1" --gptspec-profile=thorough \
     --gptspec-timeout=240 --junitxml="$LOG/reports/thorough-$1.xml" \
     > "$LOG/conformance-thorough-$1.log" 2>&1
   note "conformance thorough-$1 (pytest plugin): exit $?")
}
thorough float32 &
thorough bfloat16 &
(cd "$WORK" && OMP_NUM_THREADS=1 timeout -k 10 "$(cap "$PHASE1")" python3 -m pytest -q \
   -p no:cacheprovider tests/test_fast.py tests/test_conformance_sdpa_kernels.py tests/test_training_loop.py \
   tests/test_bench_harness.py -k "$DEVICE or gpu_code" > "$LOG/pytest.log" 2>&1
 note "pytest -k $DEVICE: exit $?") &
(
  RUN=/tmp/gptspec-train
  MODEL="--preset gpt2 --n-layers 4 --vocab-size 256 --n-ctx 256"
  train() {  # log-name precision steps [flags]
    OMP_NUM_THREADS=1 timeout -k 10 "$(cap 150)" python3 -m gptspec train $MODEL \
      --steps "$3" --batch-size 8 --eval-interval 20 --eval-batches 4 --device "$DEVICE" \
      --precision "$2" --out "$RUN-$2" --no-progress ${4:-} > "$LOG/train-$1.log" 2>&1
    note "train $1: exit $?"
  }
  train bfloat16-compiled bfloat16 40 --compile
  train resume bfloat16 60 --resume
  train float16 float16 30
  timeout -k 10 "$(cap 60)" python3 -m gptspec generate \
    --checkpoint "$RUN-bfloat16/checkpoint" --prompt "def f(x):" --max-new-tokens 64 \
    --temperature 0 --device "$DEVICE" --dtype bfloat16 > "$LOG/generate.log" 2>&1
  note "generate bfloat16: exit $?"
) &
wait
note "stage 1 ended at ${SECONDS}s"

# --- 2. the GPU benchmark, alone on the device; a measurement starts only while 100 s
#        are left (benchmarks/gpu.py names what it skipped)
export GPTSPEC_BENCH_SECONDS=$((TOTAL - SECONDS - 100))
(cd "$WORK" && timeout -k 10 "$(cap 600)" python3 - "$LOG/bench" > "$LOG/bench.log" 2>&1 <<'EOF'
import sys
from pathlib import Path

from benchmarks import gpu, run

modules = [m for m in run.discover() if m.name == "gpu"]
result = run.run_all(modules, rounds=1, quick=False)
summary = {"environment": run.environment(), "quick": False, "modules": ["gpu"],
           **run.merge(result)}
_, md = run.write(summary, Path(sys.argv[1]))
print(md.read_text())
EOF
); note "bench gpu: exit $? at ${SECONDS}s"
cp "$LOG/bench/bench.md" "$OUT/bench.md" 2>/dev/null
cp "$LOG/bench/bench.json" "$OUT/bench.json" 2>/dev/null

# --- what comes back
(cd "$LOG" && tar czf "$OUT/conformance.tar.gz" reports)
for f in "$LOG"/reports/*.xml; do
  python3 - "$f" >> "$LOG/summary.txt" 2>&1 <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
props = [{p.get("name"): p.get("value") for p in c.iter("property")} | {"id": c.get("name")}
         for c in cases]
counts = collections.Counter(p.get("gptspec_status", "none") for p in props)
done = [p for p in props if p.get("gptspec_status") == "pass"]
worst = max(done, key=lambda p: float(p["gptspec_worst_fraction"]), default=None)
bad = [p["id"] for p in props if p.get("gptspec_status") in ("fail", "error", "blocked", None)]
print(sys.argv[1].rsplit("/", 1)[-1], dict(counts),
      f"worst pass {float(worst['gptspec_worst_fraction']):.3g} ({worst['id']})" if worst else "",
      "failed:", bad)
EOF
done
for f in "$LOG"/reports/*.json; do
  python3 - "$f" >> "$LOG/summary.txt" 2>&1 <<'EOF'
import collections, json, sys
for run in json.load(open(sys.argv[1]))["runs"]:
    checks = run["checks"]
    done = [c for c in checks if c["status"] == "pass"]
    worst = max(done, key=lambda c: c["worst_fraction"] or 0, default=None)
    bad = [c["id"] for c in checks if c["status"] in ("fail", "error", "blocked")]
    print(sys.argv[1].rsplit("/", 1)[-1], run["backend"]["device"], run["backend"]["dtype"],
          run["settings"]["profile"], run["counts"],
          f"worst pass {worst['worst_fraction']:.3g} ({worst['id']})" if worst else "",
          "failed:", bad)
EOF
done
for f in "$LOG"/*.txt "$LOG"/*.log; do echo "===== $f"; cat "$f"; done > "$OUT/all.log"
cp "$LOG/summary.txt" "$OUT/summary.txt"
echo "===== summary ($SECONDS s)"; cat "$LOG/summary.txt"
grep -E "passed|failed|rror" "$LOG/pytest.log" | tail -3
tail -n 2 "$LOG"/train-*.log "$LOG"/generate.log
grep -E "cuda|MFU|limit|transformers|failed" "$OUT/bench.md" 2>/dev/null
