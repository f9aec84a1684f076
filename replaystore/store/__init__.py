"""ReplayStore: the public face, a thin facade over its parts (facade.py; the parts they share,
parts.py; its writing and reading halves, writing.py and reading.py, which it holds, not inherits).
It checks arguments, takes its lock, and hands the work to the part whose job it is:

    backend   storage/backend.py    where the bytes live: files (storage/local) or objects (storage/objects)
    rings     storage/rings.py      every stream's per-step scalars in RAM, and what is sampleable
    view      storage/view.py       the commits read, and following writers in other processes (refresh)
    writers   storage/stream.py     one per stream written here: moves, episode ends, commits
    reader    storage/reader.py     chunk-aware frame reads with a compressed-chunk cache
    samplers  sampling/samplers.py  which steps a batch holds (uniform, prioritized, sequences,
                                    hindsight relabelling: sampling/hindsight.py)
    feeds     feed/                 blocks of batches drawn ahead, for numpy, tf.data and JAX

docs/design.md draws how they fit together.

Example:
    >>> import gymnasium as gym, numpy as np
    >>> from replaystore import ReplayStore, Layout
    >>> env = gym.make("CartPole-v1")
    >>> with ReplayStore.create("/tmp/doc.zarr", capacity=64, observation_space=env.observation_space,
    ...                         action_space=env.action_space, frame_stack=2, overwrite=True,
    ...                         layout=Layout(shard_len=16, obs_chunk_len=4)) as store:
    ...     obs, _ = env.reset(seed=0)
    ...     for _ in range(40):
    ...         nxt, r, term, trunc, _ = env.step(env.action_space.sample())
    ...         store.add(obs, 0, r, nxt, term, trunc)
    ...         obs = nxt if not (term or trunc) else env.reset()[0]
    >>> ReplayStore.open("/tmp/doc.zarr").sample(8, rng=np.random.default_rng(0)).obs.shape
    (8, 2, 4)
"""

from replaystore.sampling.memory import DEFAULT_CACHE_BYTES
from replaystore.store.facade import ReplayStore

__all__ = ["DEFAULT_CACHE_BYTES", "ReplayStore"]
