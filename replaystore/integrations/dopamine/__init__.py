"""Dopamine's replay checkpoints (the DQN Replay Dataset) into a store: ``store_from_dopamine``.

The DQN Replay Dataset (Agarwal et al., "An Optimistic Perspective on Offline Reinforcement
Learning") is the replay buffers of DQN runs on 60 Atari games, 5 runs a game, ~50M transitions a
run, saved by Dopamine's ``OutOfGraphReplayBuffer`` as ~50 checkpoints of a 1M-row ring each
(checkpoints.py says what the files hold). Dopamine's own ``FixedReplayBuffer`` loads a few
checkpoints into RAM at a time and samples those; a store holds every checkpoint of every run,
compressed on disk, and samples all of it uniformly.

``store_from_dopamine(runs, path)`` makes a new store with one stream per run: every checkpoint,
oldest first, one at a time, its observations streamed from the gzip in blocks of 32 MB (plan.py
says how rows become steps). Rows that two checkpoints share are stored once, after checking that
both agree. What a batch then holds is what Dopamine's buffer samples from a checkpoint holding
the same rows: the same stacks of ``k`` frames (zeros before an episode's first frame), the same
n-step returns (``sample(n_step=n, gamma=g)``, summed as the buffer of the dataset's time sums them,
``discounts.dot(rewards)``; Dopamine 4's ``np.sum`` in float32 differs in the last bit of some), ``terminated`` where
Dopamine's ``terminal`` is 1, and the same set of transitions to draw from, with two exceptions,
both at a *gap* (rows the buffer overwrote between two saves, which no checkpoint holds): the
``k - 1`` moves after a gap are sampled with their stacks padded by zeros, where Dopamine's
buffer, which lacks the frames before them too, does not sample them; and with ``n_step`` > 1
the last moves before a gap are sampled with the shorter returns of a truncated episode, where
Dopamine's buffer waits for rows it will never get.

Dopamine's checkpoints do not say how an episode ended: every end, time limits included, is
``terminal``, and is stored as ``terminated``. Nothing is unpickled: the six files of a checkpoint
are ``.npy`` arrays, read as numbers only. The store is built beside ``path`` and renamed onto it
when whole: an error, or a crash, leaves no store at ``path``.
"""

from replaystore.integrations.dopamine.importing import DopamineImport, RunImport, store_from_dopamine

__all__ = ["DopamineImport", "RunImport", "store_from_dopamine"]
