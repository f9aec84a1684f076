"""``ReplayStore.torch_blocks``: sampled blocks as torch tensors, for PyTorch learners that are not
TorchRL's (a cleanrl-style script), moved ahead of the learner by devicefeed.py's feeder thread.

On a CUDA device each array is copied into pinned (page-locked) host memory and from there to the
device without blocking; the feeder waits for the copies to finish before it hands the block over,
so the pinned memory is never reused under a transfer. On the CPU the tensors are the block's numpy
memory itself (``torch.from_numpy``, no copy), which the prefetcher reuses only once no tensor
holds it (storage/pool.py). ``index`` stays a numpy array (it is for ``update_priorities``).

The module imports torch only when a feeder is made, and never TensorFlow.
"""

from __future__ import annotations

from typing import Any

from replaystore.errors import ConfigError
from replaystore.feed.devicefeed import Feeder
from replaystore.feed.prefetch import Source
from replaystore.sampling.samplers import Sampler


def torch_blocks(source: Source, sampler: Sampler, batch_size: int, *, device: Any = None, pin_memory: bool | None = None,
                 depth: int = 2, **block_kwargs: Any) -> Feeder:
    """An endless iterator of blocks (dicts of ``torch.Tensor`` shaped ``(batches_per_block,
    batch_size, ...)``) on ``device`` (default: the first CUDA device where there is one, else the
    CPU); ``pin_memory`` (default: on a CUDA device) stages them in pinned memory."""
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("torch_blocks needs torch: pip install 'replaystore[torch]'") from exc
    try:
        target = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device is {device!r}: {exc}; pass a torch device such as 'cuda:0' or 'cpu'") from None
    pin = target.type == "cuda" if pin_memory is None else bool(pin_memory)
    if (pin or target.type == "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{'pin_memory' if pin else f'device {device!r}'} needs a CUDA device and torch sees none; "
                          "leave device and pin_memory out to feed the CPU")

    def tensor(value: Any) -> Any:
        if isinstance(value, dict):  # a Dict store's observations
            return {key: tensor(v) for key, v in value.items()}
        t = torch.from_numpy(value)
        if pin:
            t = t.pin_memory()
        return t if target.type == "cpu" else t.to(target, non_blocking=pin)

    def move(host: dict[str, Any]) -> dict[str, Any]:
        moved = {name: tensor(value) for name, value in host.items()}
        if target.type == "cuda":
            torch.cuda.current_stream(target).synchronize()  # the copies are done: the pinned memory may go
        return moved

    return Feeder(source, sampler, batch_size, move=move, depth=depth, device=target,
                  name="replaystore-torch-feeder", **block_kwargs)
