"""``ReplayStore.jax_blocks``: sampled blocks already on a JAX device, put there ahead of the learner
by devicefeed.py's feeder thread with ``jax.device_put``.

``device_put`` releases the GIL while it copies, so the feeder runs beside the learner's Python; the
feeder lets go of a block's numpy arrays only after their copy is done (``block_until_ready``). On
the CPU backend ``device_put`` may use the numpy memory as the device array's own (no copy); the
device array then holds the numpy array, and its memory is reused only once the learner has dropped
it (storage/pool.py). Either way a block's values never change under the learner.

The module imports JAX only when a feeder is made (``import replaystore`` does not).
"""

from __future__ import annotations

from typing import Any

from replaystore.errors import ConfigError
from replaystore.feed.devicefeed import Feeder
from replaystore.feed.prefetch import Source
from replaystore.sampling.samplers import Sampler


def device_blocks(source: Source, sampler: Sampler, batch_size: int, *, device: Any = None, depth: int = 2,
                 **block_kwargs: Any) -> Feeder:
    """An endless iterator of blocks (dicts of ``jax.Array`` shaped ``(batches_per_block,
    batch_size, ...)``) on ``device`` (default: JAX's first), but for ``index``, which stays a
    numpy array (it is for ``store.update_priorities``); ``close()`` (or leaving a ``with`` block)
    stops the feeder and the prefetcher's workers."""
    try:
        import jax
    except ImportError as exc:
        raise ConfigError("jax_blocks needs JAX: pip install 'replaystore[jax]' (or jax[cuda12] for a GPU)") from exc
    target = jax.devices()[0] if device is None else device

    def move(host: dict[str, Any]) -> dict[str, Any]:
        return dict(jax.block_until_ready(jax.device_put(host, target)))

    return Feeder(source, sampler, batch_size, move=move, depth=depth, device=target, **block_kwargs)
