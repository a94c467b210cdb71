"""What a benchmark prints about the machine it ran on: the CPU (bf16 figures depend on whether
it computes bf16 natively) and the load (other work skews eager PyTorch's figures most)."""
import os
from pathlib import Path


def cpu_description():
    cpuinfo = Path("/proc/cpuinfo").read_text()
    name = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                "unknown")
    return f"CPU: {name}, avx512_bf16 {'yes' if 'avx512_bf16' in cpuinfo.split() else 'no'}"


def load_description():
    """The 1-minute load average against the cores: other work on them slows eager PyTorch's
    OpenMP threads far more than afterburner's (seen 20x at load 5 on 2 cores), so a loaded
    machine skews the ratio."""
    load, cores = os.getloadavg()[0], os.cpu_count()
    warning = ": other work is running, the figures are skewed" if load > cores - 0.5 else ""
    return f"load average {load:.1f} on {cores} cores{warning}"
