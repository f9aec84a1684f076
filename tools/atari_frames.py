"""Real ALE frames for the benchmarks: a random policy on an Atari game, AtariPreprocessing (84x84 gray).

Frames are cached as .npy under tools/out/ so repeated benchmark runs do not replay the game.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "out"


def record(steps: int, *, game: str = "ALE/Breakout-v5", seed: int = 0) -> dict[str, np.ndarray]:
    """``steps`` transitions: obs_index, action, reward, terminated, truncated and the frames they index."""
    cache = OUT / f"{game.replace('/', '_')}_{steps}_{seed}.npz"
    if cache.exists():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.wrappers.AtariPreprocessing(gym.make(game, frameskip=1))
    rng = np.random.default_rng(seed)
    frames = []
    rows = []
    obs, _ = env.reset(seed=seed)
    frames.append(obs)
    for _ in range(steps):
        a = int(rng.integers(env.action_space.n))
        nxt, r, te, tr, _ = env.step(a)
        frames.append(nxt)
        rows.append((len(frames) - 2, a, r, te, tr))
        if te or tr:
            obs, _ = env.reset()
            frames.append(obs)
    idx, act, rew, term, trunc = (np.array(c) for c in zip(*rows))
    data = dict(frames=np.stack(frames), obs_index=idx, action=act, reward=rew.astype(np.float32),
                terminated=term.astype(bool), truncated=trunc.astype(bool))
    OUT.mkdir(exist_ok=True)
    np.savez(cache, **data)
    return data


def replay_into(store, data: dict[str, np.ndarray], transitions: int) -> None:
    """Add ``transitions`` recorded transitions to ``store``, tiling the recording if it is shorter
    (the recording's last transition is marked truncated so each tile is a whole set of episodes)."""
    frames, idx = data["frames"], data["obs_index"]
    n = idx.size
    for t in range(transitions):
        i = t % n
        j = int(idx[i])
        store.add(frames[j], int(data["action"][i]), float(data["reward"][i]), frames[j + 1],
                  bool(data["terminated"][i]), bool(data["truncated"][i]) or (i == n - 1))
