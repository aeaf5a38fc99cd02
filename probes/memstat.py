"""Process memory counters for probes: peak RSS on Linux, the CUDA allocator's peaks (torch only inside).

    >>> reset_peak_memory(device); ...; peak_bytes(device)

CPU: VmRSS / VmHWM from /proc/self/status; the peak (VmHWM) is reset by writing 5 to
/proc/self/clear_refs (Linux >= 4.0, proc(5)). CUDA: ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``.
"""

from __future__ import annotations

from pathlib import Path


def vm_kib(field: str) -> int | None:
    """A ``VmXXX:`` line of /proc/self/status in KiB (Linux), or None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_memory(device) -> bool:
    """Start the peak-memory counter afresh; False when the CPU counter cannot be reset."""
    if device.type == "cuda":
        import torch

        torch.cuda.init()   # the counter exists once CUDA is initialised (a no-op after the first call)
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def current_bytes(device) -> float | None:
    """Allocated bytes (CUDA) or resident set size (CPU)."""
    if device.type == "cuda":
        import torch

        return float(torch.cuda.memory_allocated(device))
    kib = vm_kib("VmRSS")
    return None if kib is None else kib * 1024.0


def peak_bytes(device) -> float | None:
    """Peak allocated bytes (CUDA) or peak resident set size (CPU) since the last reset."""
    if device.type == "cuda":
        import torch

        return float(torch.cuda.max_memory_allocated(device))
    kib = vm_kib("VmHWM")
    return None if kib is None else kib * 1024.0


__all__ = ["current_bytes", "peak_bytes", "reset_peak_memory", "vm_kib"]
