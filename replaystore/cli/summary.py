"""``replaystore inspect``: what a store holds, from its metadata and scalar arrays only.

No frame is decoded, so this is fast for any size: the scalars of a 1M-step store are ~19 MB.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.format.schema import Schema
from replaystore.format.spaces import BoxSpec, EntrySpec, space_attrs, stored_box
from replaystore.sampling.episodes import episode_table, move_flag_counts
from replaystore.store import ReplayStore


def episodes(store: ReplayStore, stream: int = 0) -> dict[str, np.ndarray]:
    """Per live episode of ``stream``, oldest first (sampling/episodes.py ``episode_table``)."""
    return episode_table(store.rings.streams[stream])


def episode_stats(store: ReplayStore) -> dict[str, Any]:
    """Count, return and length statistics of the complete episodes among the live steps (of every stream)."""
    per = [episodes(store, k) for k in range(store.num_streams)]
    eps = {key: np.concatenate([e[key] for e in per]) for key in per[0]}
    whole = eps["whole"]
    if whole.size == 0:
        return {"complete": 0, "partial": 0}
    out: dict[str, Any] = {"complete": int(whole.sum()), "partial": int(whole.size - whole.sum())}
    if whole.any():
        counts = [move_flag_counts(r) for r in store.rings.streams]
        terminated, truncated = sum(c[0] for c in counts), sum(c[1] for c in counts)
        r, n = eps["returns"][whole], eps["lengths"][whole]
        out.update(
            return_mean=float(r.mean()), return_min=float(r.min()), return_max=float(r.max()),
            return_last=float(r[-1]), length_mean=float(n.mean()), length_min=int(n.min()), length_max=int(n.max()),
            terminated=terminated, truncated=truncated,
        )
    return out


def inspect_store(path: str | Path) -> dict[str, Any]:
    """A JSON-ready summary of the store at ``path``.

    Example:
        >>> inspect_store("runs/quickstart/replay.zarr")["transitions"]  # doctest: +SKIP
        5000
    """
    store = ReplayStore.open(path, cache_bytes=0)  # (the scalars only: no chunk cache to hold)
    try:
        schema, layout, state = store.schema, store.layout, store.committed
        sizes = store.backend.stored_bytes()
        frame_bytes = schema.observation.frame_bytes
        obs_disk = sizes.get("obs", 0)
        states = store.stream_states()
        frames_written = sum(min(st.added, schema.stream_capacity) for st in states)
        rings = store.rings.streams
        return {
            "path": str(store.path),
            "format_version": store.backend.format_version,
            "schema": {
                "observation_space": _observations(schema),
                "action_space": {"type": "Box" if isinstance(schema.action, BoxSpec) else "Discrete",
                                 **dataclasses.asdict(schema.action)},
                "capacity": schema.capacity,
                "frame_stack": schema.frame_stack,
                "frame_padding": schema.frame_padding,
                "num_streams": schema.num_streams,
                "extras": {e.name: {"shape": list(e.shape), "dtype": e.dtype} for e in schema.extras},
            },
            "extras": extra_stats(store),
            "priorities": priority_stats(store),
            "transitions": len(store),
            "live_steps": store.rings.live_steps,
            "streams": [{"stream": k, "transitions": r.n_valid, "live_steps": r.live_steps, "added": st.added,
                         "oldest": st.live_start(schema.stream_capacity), "episodes": st.episodes,
                         "episode_in_progress": st.episode_in_progress, "last_write": st.updated}
                        for k, (r, st) in enumerate(zip(rings, states))],
            "episodes": episode_stats(store),
            "state": dataclasses.asdict(state),
            "layout": {
                "shard_len": layout.shard_len,
                "obs_chunk_len": layout.obs_chunk_len,
                "scalar_chunk_len": layout.shard_len,
                "codec": dataclasses.asdict(layout.codec),
                "checksum": "crc32c",
                "shards_per_array": -(-store.rings.size // layout.shard_len),
            },
            "bytes_on_disk": sum(sizes.values()),
            "bytes_by_array": sizes,
            "obs_compression_ratio": (frames_written * frame_bytes / obs_disk) if obs_disk else None,
            "last_write": state.updated,
        }
    finally:
        store.close()


def extra_stats(store: ReplayStore) -> dict[str, Any]:
    """Per extra (format/extras.py): the mean, min and max of its values over the live moves of every
    stream (an episode's last step holds no move), or None where there is no move yet; read a
    stretch of moves at a time, so an extra of many values a move needs no copy of all of them."""
    out: dict[str, Any] = {}
    for e in store.schema.extras:
        moves, count, total, low, high = 0, 0, 0.0, np.inf, -np.inf
        for ring in store.rings.streams:
            # a step holds a move unless it ends its episode or is the newest (an episode in progress)
            for first in range(ring.lo, max(ring.lo, ring.added - 1), STATS_STRETCH):
                slots = np.arange(first, min(first + STATS_STRETCH, ring.added - 1)) % ring.capacity
                slots = slots[~ring.is_last[slots]]
                values = ring.fields[e.field][slots].astype(np.float64).reshape(-1)
                values = values[np.isfinite(values)]
                moves += slots.size
                if values.size:
                    count, total = count + values.size, total + float(values.sum())
                    low, high = min(low, float(values.min())), max(high, float(values.max()))
        out[e.name] = {"moves": moves, "mean": total / count, "min": low, "max": high} if count else None
    return out


def priority_stats(store: ReplayStore) -> dict[str, Any] | None:
    """The priorities of the sampleable transitions of every stream (prioritized replay's, set by
    ``update_priorities``): their mean, min and max, and how many hold the max (new transitions are
    given the highest priority seen, so these are mostly the ones not sampled since they came);
    None where every transition has the same priority (prioritized replay not used, or nothing
    updated yet)."""
    total, count, low, high, at_max = 0.0, 0, np.inf, -np.inf, 0
    for ring in store.rings.streams:  # a stretch at a time: what it holds does not grow with the store
        for first in range(ring.lo, ring.added, STATS_STRETCH):
            slots = np.arange(first, min(first + STATS_STRETCH, ring.added)) % ring.capacity
            live = ring.priority[slots[ring.valid[slots]]]
            if not live.size:
                continue
            top = float(live.max())
            at_max = (0 if top > high else at_max) + (int(np.count_nonzero(live == top)) if top >= high else 0)
            total += float(live.sum(dtype=np.float64))
            count += int(live.size)
            low, high = min(low, float(live.min())), max(high, top)
    if count == 0 or low == high:
        return None
    return {"mean": total / count, "min": low, "max": high, "at_max": at_max, "transitions": count}


#: Moves ``extra_stats`` reads at a time.
STATS_STRETCH = 1 << 16


def _box(spec: BoxSpec) -> dict[str, Any]:
    return {"type": "Box", **dataclasses.asdict(spec), "shape": list(spec.shape)}


def _entry(spec: EntrySpec) -> dict[str, Any]:
    """A Dict entry for the summary: a Box as ``_box``; a Discrete, MultiBinary or MultiDiscrete as its space, with
    the shape and dtype it is given back in."""
    if isinstance(spec, BoxSpec):
        return _box(spec)
    box = stored_box(spec)
    return {**space_attrs(spec), "shape": list(box.shape), "dtype": box.dtype}


def _observations(schema: Schema) -> dict[str, Any]:
    """The observation space for the summary; a Dict's entries, and the frame a step is kept in."""
    if schema.observation_entry is not None:  # a Discrete, MultiBinary or MultiDiscrete space
        return _entry(schema.observation_entry)
    if schema.observation_dict is None:
        return _box(schema.observation)
    spec = schema.observation_dict
    out: dict[str, Any] = {"type": "Tuple" if spec.tree is not None and spec.tree[0] == "Tuple" else "Dict",
                           "spaces": {key: _entry(entry) for key, entry in spec.spaces},
                           "stored_as": {"shape": list(schema.observation.shape), "dtype": schema.observation.dtype}}
    if spec.tree is not None:  # a nested Dict or a Tuple: its leaves named by their paths above, its structure here
        out["structure"] = spec.describe()
    return out


def _describe_box(box: dict[str, Any]) -> str:
    return f"Box{tuple(box['shape'])} {box['dtype']} [{box['low']}, {box['high']}]"


def _describe_entry(entry: dict[str, Any]) -> str:
    if entry.get("type") == "Discrete":
        return f"Discrete({entry['n']}" + (f", start={entry['start']})" if entry["start"] else ")")
    if entry.get("type") == "MultiBinary":
        return f"MultiBinary({entry['n']})" if isinstance(entry["n"], int) else f"MultiBinary{tuple(entry['n'])}"
    if entry.get("type") == "MultiDiscrete":
        return f"MultiDiscrete{tuple(entry['shape'])}"
    return f"{entry['dtype']}{tuple(entry['shape'])}"


def _describe_observations(obs: dict[str, Any]) -> str:
    if obs.get("type") in ("Discrete", "MultiBinary", "MultiDiscrete"):
        return f"{_describe_entry(obs)}, kept as {obs['dtype']}{tuple(obs['shape'])}"
    if obs.get("type") not in ("Dict", "Tuple"):
        return _describe_box(obs)
    entries = ", ".join(f"{key}: {_describe_entry(box)}" for key, box in obs["spaces"].items())
    stored = obs["stored_as"]
    return f"{obs.get('structure') or f'Dict({entries})'}, each step kept as one frame of {stored['shape'][0]} {stored['dtype']}"


def _actions(space: dict[str, Any]) -> str:
    if space.get("type") == "Box":
        return _describe_box(space)
    return f"Discrete({space['n']}, start={space['start']})"


def format_summary(info: dict[str, Any]) -> list[str]:
    """The summary as lines for a terminal."""
    s, lay, st, ep = info["schema"], info["layout"], info["state"], info["episodes"]
    obs = s["observation_space"]
    codec = lay["codec"]
    codec_name = f"{codec['name']}-{codec['level']}" if codec["name"] == "zstd" else f"blosc-{codec['cname']}-{codec['level']}"
    lines = [
        f"replay store      {info['path']}  (format version {info['format_version']}"
        + (f", {s['num_streams']} streams)" if s["num_streams"] > 1 else ")"),
        f"observations      {_describe_observations(obs)}, frame_stack {s['frame_stack']}"
        + (f" ({s['frame_padding']} padding)" if s["frame_stack"] > 1 else ""),
        f"actions           {_actions(s['action_space'])}",
        f"capacity          {s['capacity']:,} steps; {info['live_steps']:,} live; {info['transitions']:,} sampleable transitions",
        (f"committed state   added={st['added']:,} oldest={st['oldest']:,} episodes_started={st['episodes']:,} "
        f"episode_in_progress={st['episode_in_progress']}"),
        f"episodes (live)   {ep['complete']:,} complete, {ep['partial']:,} partial",
    ]
    if s["num_streams"] > 1:
        lines.append("streams           stream  transitions   live steps        added   episodes  last write")
        for row in info["streams"]:
            lines.append(f"                  {row['stream']:>6}  {row['transitions']:>11,}  {row['live_steps']:>11,}  "
                         f"{row['added']:>11,}  {row['episodes']:>9,}  {row['last_write'] or 'never'}")
    if "return_mean" in ep:
        lines.append(
            f"  returns         mean {ep['return_mean']:.2f}  min {ep['return_min']:.2f}  max {ep['return_max']:.2f}  "
            f"last {ep['return_last']:.2f}"
        )
        lines.append(
            f"  lengths         mean {ep['length_mean']:.1f}  min {ep['length_min']}  max {ep['length_max']}  "
            f"(terminated {ep['terminated']}, truncated {ep['truncated']})"
        )
    for i, (name, spec) in enumerate(s["extras"].items()):
        shape = f"{tuple(spec['shape'])}" if spec["shape"] else ""
        got = info["extras"].get(name)
        values = (f"mean {got['mean']:.4g}  min {got['min']:.4g}  max {got['max']:.4g}" if got else "no moves yet")
        lines.append(f"{'extras' if i == 0 else '':<18}{name} {spec['dtype']}{shape}: {values}")
    pr = info.get("priorities")
    if pr:
        lines.append(f"priorities        mean {pr['mean']:.4g}  min {pr['min']:.4g}  max {pr['max']:.4g}  ({pr['at_max']:,} of "
                     f"{pr['transitions']:,} transitions at the max: mostly new, not sampled since they came)")
    ratio = info["obs_compression_ratio"]
    lines += [
        (f"layout            shards of {lay['shard_len']} steps ({lay['shards_per_array']} per array), frame chunks of "
        f"{lay['obs_chunk_len']}, {codec_name} + {lay['checksum']}"),
        f"on disk           {info['bytes_on_disk'] / 1e6:,.2f} MB"
        + (f"; frames compressed {ratio:.1f}x" if ratio else ""),
        f"last write        {info['last_write'] or 'never'}",
    ]
    return lines
