"""A digest of a model's trainable parameters (contract v1.2, "Parameter change"): whether
the final update changed anything, the independent proof seed ``002`` lacked.

Cheap by design: of each trainable tensor (``requires_grad``), sorted by name, a fixed sample
of :data:`SAMPLE_PER_TENSOR` elements at evenly spaced positions is copied to the host and
hashed with the tensor's name, shape and dtype; nothing is ever copied whole. An optimizer
step moves essentially every element, so a changed update changes the digest; one that
changed nothing (a zero learning rate, a frozen model, a skipped step) leaves it equal.
torch is imported only here, and only when a trainer passes a model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

SAMPLE_PER_TENSOR = 64


def _named(model: Any) -> list[tuple[str, Any]]:
    """(name, tensor) of a module's parameters, or of an iterable of tensors or pairs."""
    if hasattr(model, "named_parameters"):
        return list(model.named_parameters())
    items: Iterable[Any] = model
    return [(item[0], item[1]) if isinstance(item, tuple) else (str(index), item)
            for index, item in enumerate(items)]


def params_digest(model: Any) -> tuple[str, int, int]:
    """(SHA-256 hex digest, trainable tensors, bytes sampled) of ``model``'s parameters."""
    import torch  # (only a trainer that passes a model gets here: it has torch)

    digest = hashlib.sha256()
    tensors = sampled = 0
    with torch.no_grad():
        for name, tensor in sorted(_named(model), key=lambda item: item[0]):
            if not getattr(tensor, "requires_grad", False):
                continue
            flat = tensor.detach().reshape(-1)
            count = flat.numel()
            take = min(count, SAMPLE_PER_TENSOR)
            where = torch.linspace(0, max(count - 1, 0), take, device=flat.device).long()
            values = flat.index_select(0, where).to("cpu").contiguous()
            data = values.view(torch.uint8).numpy().tobytes() if take else b""
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            digest.update(data)
            tensors += 1
            sampled += len(data)
    return digest.hexdigest(), tensors, sampled
