"""Peak dense BF16/FP16 tensor throughput of common GPUs, for MFU.

MFU divides the model FLOP/s a run achieved by what the devices could do at most. The
figures below are the vendor's dense (no structured sparsity) BF16 tensor peaks, or
FP16 where the GPU has no BF16 (V100), with FP32 accumulation for the GeForce/RTX
parts, since that is what mixed-precision training uses. A spec's
``telemetry.peak_tflops`` overrides the table (other GPUs, clocks set by the user).

>>> peak_tflops("NVIDIA H100 80GB HBM3")
989.5
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PEAKS", "GpuPeak", "match_gpu", "peak_tflops"]


@dataclass(frozen=True, slots=True)
class GpuPeak:
    """One GPU model: how its NVML name looks and its dense tensor peak in TFLOP/s."""

    model: str
    pattern: str  # regular expression, searched case-insensitively in the NVML name
    tflops: float  # dense BF16 (FP16 for V100) tensor TFLOP/s of one device


# Order matters: the first pattern that matches wins, so the more specific names
# (H100 PCIe before H100, A100 before A10, L40S before L4) come first.
PEAKS: tuple[GpuPeak, ...] = (
    # https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200: FP16/BF16 4.5 PFLOPS with
    # sparsity per GPU; dense is half)
    GpuPeak("B200", r"\bB200\b", 2250.0),
    # https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (GH200: BF16 1,979
    # TFLOPS with sparsity)
    GpuPeak("GH200", r"\bGH200\b", 989.5),
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: BF16 1,979 TFLOPS with
    # sparsity; H200 NVL: 1,671)
    GpuPeak("H200 NVL", r"\bH200\b.*\bNVL\b", 835.5),
    GpuPeak("H200", r"\bH200\b", 989.5),
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe: BF16 1,513 TFLOPS with
    # sparsity; H100 NVL: 1,671; H100 SXM: 1,979)
    GpuPeak("H100 PCIe", r"\bH100\b.*\bPCIe\b", 756.5),
    GpuPeak("H100 NVL", r"\bH100\b.*\bNVL\b", 835.5),
    GpuPeak("H100 SXM", r"\bH100\b", 989.5),
    # https://www.nvidia.com/en-us/data-center/a100/ (BF16 312 TFLOPS dense, 40 GB and 80 GB)
    GpuPeak("A100 80GB", r"\bA100\b.*80\s*GB", 312.0),
    GpuPeak("A100 40GB", r"\bA100\b", 312.0),
    # https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (BF16 125 TFLOPS, 250 sparse)
    GpuPeak("A10", r"\bA10\b", 125.0),
    # https://www.nvidia.com/en-us/data-center/l40s/ (BF16 362.05 TFLOPS, 733 sparse)
    GpuPeak("L40S", r"\bL40S\b", 362.05),
    # https://www.nvidia.com/en-us/data-center/l4/ (BF16 121 TFLOPS, 242 sparse)
    GpuPeak("L4", r"\bL4\b", 121.0),
    # https://www.nvidia.com/en-us/data-center/v100/ (tensor 125 TFLOPS SXM2, 112 PCIe; FP16)
    GpuPeak("V100 PCIe", r"\bV100\b.*\bPCIE\b", 112.0),
    GpuPeak("V100", r"\bV100\b", 125.0),
    # https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
    # (RTX 4090: FP16/BF16 tensor with FP32 accumulate 165.2 TFLOPS dense)
    GpuPeak("RTX 4090", r"\bRTX\s*4090\b", 165.2),
    # https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (RTX 6000 Ada datasheet:
    # 1,457 TFLOPS FP8 with sparsity, i.e. 364.2 BF16 dense)
    GpuPeak("RTX 6000 Ada", r"\bRTX\s*6000\b.*\bAda\b", 364.2),
)


def match_gpu(name: str | None) -> GpuPeak | None:
    """The table entry for an NVML GPU name such as ``"NVIDIA A100-SXM4-80GB"``, or None."""
    if not name:
        return None
    for peak in PEAKS:
        if re.search(peak.pattern, name, re.IGNORECASE):
            return peak
    return None


def peak_tflops(name: str | None) -> float | None:
    """Dense BF16/FP16 tensor TFLOP/s of one device named ``name``; None when unknown."""
    found = match_gpu(name)
    return None if found is None else found.tflops
