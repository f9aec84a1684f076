"""Minari datasets in and out of a replay store: ``store_from_minari`` and ``minari_from_store``.

Minari (Farama) is the common format of offline-RL datasets: d3rlpy, TorchRL and CORL read it. A
dataset is a list of episodes, each ``observations`` ``(T + 1, ...)`` (the one each move was made
from, then the last), ``actions``, ``rewards``, ``terminations`` and ``truncations`` ``(T, ...)``,
which is exactly how a stream of the store keeps an episode (sampling/episodes.py).

**In** (``store_from_minari``): every episode of the dataset, in its order, becomes an episode of a
new store of one stream, through ``ReplayStore.add``, so every value is checked as a writer's would
be. Uniform, n-step and prioritized batches, sequences, ``as_dataset`` and ``jax_blocks`` then come
straight from the compressed chunks, out of core, which is what offline DQN-style learners on an
Atari dataset need (Minari reads whole episodes; its HDF5 is not compressed). Observations that are
frame stacks (a dataset recorded behind ``FrameStackObservation`` or ``VecFrameStack``) are found as
``ReplayStoreBuffer`` finds them (stacking.py) and stored once a frame; every episode is checked to
be such stacks before any of it is written. The store is built beside ``path`` and renamed onto it
when whole (``Backend.staging``/``publish``, as ``compact`` does): an error, or a crash, leaves no
store at ``path``.

- An episode whose last move is neither terminated nor truncated (a dataset cut short) is closed as
  truncated: nothing of it continues, so its last observation is not bootstrapped as terminal.
- An episode that ends before its last move, or whose arrays disagree in length, is refused, naming
  the episode; so is an observation or action outside the space, or a reward beyond float32.
- ``infos`` are kept as extras of the moves (format/extras.py; ``infos=`` picks the keys, by default
  every one of numbers of a fixed shape): move ``t`` keeps ``infos[key][t + 1]``, the info its step
  returned. The reset's info, nested dicts, strings and episode seeds are not kept.

**Out** (``minari_from_store``): each whole episode of the store (its first and last steps live),
stream by stream, oldest first, into a new Minari dataset that ``minari.load_dataset`` reads. The
observations are the stored frames, or with ``stacks=True`` the frame stacks the agent saw, padded
as the store pads them. Episodes the ring has cut at their start, and episodes in progress, are
left out and counted. The store's extras become ``infos`` (the reset's, which the store does not
keep, as zeros). The dataset is written in a hidden folder under Minari's datasets root and
renamed to its id when whole, so a failure leaves no dataset behind. Its images are stored raw
(``jpeg_encoding=False``; Minari's own default, JPEG, is lossy).

Needs ``pip install 'replaystore[minari]'`` (Minari with h5py); Minari is imported only when one of
these functions runs.
"""

from replaystore.integrations.minari.exporting import MinariExport, minari_from_store
from replaystore.integrations.minari.importing import MinariImport, store_from_minari

__all__ = ["MinariExport", "MinariImport", "minari_from_store", "store_from_minari"]
