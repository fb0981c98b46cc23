"""The machine's limits, measured: float32 and bf16 matmul rate (torch.matmul of square
matrices, 2n³ FLOPs) and memory copy bandwidth (a large tensor copied: read + write),
on the CPU and, when present, on the CUDA device. Other benchmarks' throughputs are
reported as a fraction of these (see benchmarks/run.py).

For MFU the reference is the device's *datasheet* dense bf16 peak (DENSE_BF16_PEAK);
the measured matmul rate is recorded beside it.
"""

from __future__ import annotations

import torch

from benchmarks.report import Report, median_seconds

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets, FLOP/s.
DENSE_BF16_PEAK = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 80GB HBM3": 989e12,  # the SXM part's device name
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "L4": 121e12,
}


def dense_bf16_peak(device_name: str) -> float | None:
    """The datasheet peak for a CUDA device name, matching the longest known key."""
    matches = [k for k in DENSE_BF16_PEAK if k.lower() in device_name.lower()]
    return DENSE_BF16_PEAK[max(matches, key=len)] if matches else None


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device: str, dtype: torch.dtype, n: int, repeats: int) -> float:
    """FLOP/s of C = A B, n × n."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def step() -> None:
        torch.matmul(a, b, out=out)
        sync(device)

    return 2 * n**3 / median_seconds(step, repeats=repeats, warmup=2)


def copy_bandwidth(device: str, nbytes: int, repeats: int) -> float:
    """Bytes/s moved by dst.copy_(src): each byte read once and written once."""
    src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)

    def step() -> None:
        dst.copy_(src)
        sync(device)

    return 2 * src.numel() * 4 / median_seconds(step, repeats=repeats, warmup=2)


def run(report: Report, quick: bool) -> None:
    repeats = 5 if quick else 9
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        n = (1024 if quick else 2048) if device == "cpu" else 8192
        for label, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            rate = matmul_rate(device, dtype, n, repeats)
            report.metric("machine", f"{label} matmul ({device})", rate / 1e9, "GFLOP/s",
                          f"torch.matmul {n}×{n}")
        nbytes = (256 << 20) if device == "cpu" else (2 << 30)
        bw = copy_bandwidth(device, nbytes // (2 if quick else 1), repeats)
        report.metric("machine", f"memory copy ({device})", bw / 1e9, "GB/s",
                      "tensor copy, read + write")
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = dense_bf16_peak(name)
        if peak is not None:
            report.metric("machine", "bf16 dense peak (cuda, datasheet)", peak / 1e12,
                          "TFLOP/s (datasheet)", name)
