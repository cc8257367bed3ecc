"""Where the producer kit reads GPU memory: ``torch.cuda`` when torch with CUDA is there.

Without it every value is None, which the records write as ``null``: "not measured", never
0 (a CPU-only process, or one whose GPU was not visible). torch is imported only when it is
installed, and only when a trace or device file is first made: the kit itself costs a
training process nothing it has not already imported.

The caching allocator's figures (``max_memory_allocated``/``reserved``) do not include what
NCCL or vLLM take outside it; ``mem_get_info`` does, at the device level, and samples carry
it as ``device_used_bytes``.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def torch_cuda() -> Any | None:
    """The ``torch.cuda`` module when torch is installed and CUDA is available, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            if importlib.util.find_spec("torch") is None:
                return None
        except (ImportError, ValueError):
            return None
        try:
            import torch  # type: ignore[import-not-found, no-redef, unused-ignore]
        except Exception:  # noqa: BLE001 - a broken torch install means "not measured"
            return None
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available():
            return None
    except Exception:  # noqa: BLE001 - e.g. a driver mismatch: not measured
        return None
    return cuda


class Memory:
    """The memory figures of this process's current CUDA device, or None for each."""

    def __init__(self, cuda: Any | None = None, *, probe: bool = True) -> None:
        self.cuda = cuda if cuda is not None or not probe else torch_cuda()

    @property
    def measured(self) -> bool:
        """Whether figures come from a GPU (else every value is None)."""
        return self.cuda is not None

    def reset_peaks(self) -> None:
        """Start a new peak window (at a phase's entry)."""
        if self.cuda is not None:
            try:
                self.cuda.reset_peak_memory_stats()
            except Exception:  # noqa: BLE001 - a peak not reset is still a peak (a higher one)
                pass

    def peaks(self) -> tuple[int | None, int | None]:
        """(peak allocated, peak reserved) bytes since the last reset."""
        if self.cuda is None:
            return None, None
        try:
            return int(self.cuda.max_memory_allocated()), int(self.cuda.max_memory_reserved())
        except Exception:  # noqa: BLE001 - unreadable is not measured
            return None, None

    def current(self) -> tuple[int | None, int | None, int | None]:
        """(allocated, reserved, device used) bytes now; the last from ``mem_get_info``
        (everything on the device, NCCL and other processes included)."""
        if self.cuda is None:
            return None, None, None
        try:
            allocated = int(self.cuda.memory_allocated())
            reserved = int(self.cuda.memory_reserved())
        except Exception:  # noqa: BLE001
            return None, None, None
        try:
            free, total = self.cuda.mem_get_info()
            used: int | None = int(total) - int(free)
        except Exception:  # noqa: BLE001
            used = None
        return allocated, reserved, used
