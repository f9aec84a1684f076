"""The RAM a store needs, estimated up front from its configuration, and the budget check.

Everything a store keeps in RAM is sized by a knob the user controls:

==================  ============================================  =====================================
part                size                                          knob
==================  ============================================  =====================================
per-step scalars    capacity x 8 bytes (a Discrete action of at    ``capacity``
                    most 256 values: flags 1, action 1, reward
                    4 (1 while it has at most 256 distinct
                    values), priority code 1; extras as stored)
priority tree       32 bytes x 2**ceil(log2(capacity / 64)),      ``capacity`` (built on first use)
                    and 3 bytes a step to widen the priorities
write buffer        per stream written: the shard being filled,   ``layout.shard_len``
                    compressed, and one chunk raw; counted as
                    2 x shard_len x frame bytes, what frames
                    that do not compress would take
chunk cache         at most ``cache_bytes``: compressed chunks,   ``cache_bytes``
                    and for frames <= 1 KiB the ring decoded
                    where it fits in half (storage/mirror.py)
cache lookup        8 bytes per chunk of a ring of at most 1M     ``capacity``, ``layout.obs_chunk_len``
                    chunks (past that: none)
decode areas        128 chunks per decoding thread                ``decode_threads``, ``obs_chunk_len``
shard indexes       16 bytes per chunk of the shards read last,   ``capacity`` (or ``layout.obs_chunk_len``)
                    at most 64 MB
sampling buffers    a thread's recycled outputs for batches of    the threads that call ``sample``
                    32 (16 of them) and its scratch
prefetch blocks     (depth + 4) blocks of batches_per_call        ``batches_per_call``, ``prefetch``,
                    batches' frames (as_dataset / Prefetcher)     ``threads``
decode processes    per process: the interpreter and numpy, a     ``threads``, or ``processes=False``
                    batch's decoded chunks, a request's bytes
==================  ============================================  =====================================

Frames are never held in RAM beyond these: that is the point of the store. ``check_budget`` refuses a
configuration whose estimate exceeds ``memory_budget`` (or, with no budget, the memory this process
may use: the machine's RAM, or the limit of its cgroup where one is lower: a container's, a Slurm
job's), naming the part that is largest and the knob that shrinks it. A prefetcher's parts are
checked, against the same budget, when it starts.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, SampleError
from replaystore.format.extras import PREFIX as EXTRAS
from replaystore.format.schema import Layout, Schema, scalar_fields, slot_count
from replaystore.format.spaces import DiscreteSpec
from replaystore.sampling.priority import BLOCK as PRIORITY_BLOCK
from replaystore.storage.areas import OUTPUT_POOL
from replaystore.storage.backend import KNOWN_INDEX_BYTES
from replaystore.storage.chunkcache import LIST_CHUNKS
from replaystore.storage.columns import action_ram_dtype

DECODE_AREA_CHUNKS = 128
#: A decode process before its buffers: the interpreter, numpy and libzstd (private memory, measured).
DECODE_PROCESS_BASE = 24 * 2**20
MB = 2**20

_KNOBS = {
    "scalars": "capacity",
    "priority_tree": "capacity",
    "write_buffer": "layout.shard_len",
    "chunk_cache": "cache_bytes",
    "cache_lookup": "capacity (or layout.obs_chunk_len)",
    "decode_areas": "decode_threads (or layout.obs_chunk_len)",
    "shard_indexes": "capacity (or layout.obs_chunk_len)",
    "sampling_buffers": "the number of threads that call sample",
    "prefetch_blocks": "batches_per_call (or prefetch, threads)",
    "decode_processes": "threads, or pass processes=False",
}


def estimate(schema: Schema, layout: Layout, *, writable: bool | int, cache_bytes: int, decode_threads: int) -> dict[str, int]:
    """Bytes of RAM each part of a store with this configuration can use (one sampling thread);
    ``writable``: how many streams this process writes (True: one)."""
    cap = slot_count(schema, layout)
    frame = schema.observation.frame_bytes
    per_step = ram_bytes_per_step(schema)
    blocks = -(-cap // PRIORITY_BLOCK)
    tree_blocks = 1 << max(0, int(blocks - 1).bit_length())
    chunks_per_shard = layout.shard_len // layout.obs_chunk_len
    n_shards = -(-cap // layout.shard_len)
    n_chunks = n_shards * chunks_per_shard
    batch_frames = max(256, 2 * 32 * schema.frame_stack)  # obs and next_obs of a batch of 32
    return {
        "scalars": cap * per_step,
        # the tree over blocks, and the priorities widened from codes to float32 (columns.py)
        "priority_tree": 2 * 2 * tree_blocks * 8 + 3 * cap,
        "write_buffer": 2 * layout.shard_len * frame * int(writable),
        "chunk_cache": int(cache_bytes),
        "cache_lookup": 8 * n_chunks if n_chunks <= LIST_CHUNKS else 0,  # (past that: a dict of what is cached)
        "decode_areas": max(1, decode_threads) * DECODE_AREA_CHUNKS * layout.obs_chunk_len * frame,
        "shard_indexes": min(n_chunks * 16, KNOWN_INDEX_BYTES),
        "sampling_buffers": (OUTPUT_POOL + 1) * batch_frames * frame,
    }


def ram_bytes_per_step(schema: Schema) -> int:
    """The RAM a step's scalars take (columns.py): a byte for the four flags, the action's narrowest
    type, a byte for the priority's code, the reward as float32 (its code takes one byte, but a
    reward of more than 256 distinct values widens to four: the estimate takes the larger), the
    extras as stored; ``ep_step`` is an index of episode starts (8 bytes an episode, not counted)."""
    fields = scalar_fields(schema.action, schema.extras)
    action = schema.action
    per_step = 1 + 1 + 4  # the flags' byte, the priority's code, the reward
    per_step += action_ram_dtype(action).itemsize if isinstance(action, DiscreteSpec) else _nbytes(fields["action"])
    return per_step + sum(_nbytes(spec) for name, spec in fields.items() if name.startswith(EXTRAS))


def _nbytes(spec: tuple[tuple[int, ...], str]) -> int:
    shape, dtype = spec
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def prefetch_estimate(schema: Schema, layout: Layout, *, block_nbytes: int, batches_per_block: int,
                      frames_per_batch: int, threads: int, blocks: int, processes: bool,
                      chunk_payload_bytes: int) -> dict[str, int]:
    """Bytes of RAM a prefetcher over a store of ``schema`` holds: its ``blocks`` frame blocks of
    ``block_nbytes`` (shared with the decode processes when there are any, so counted once) and each
    decode process's own memory. ``frames_per_batch`` frames each batch gathers (every frame field's);
    ``chunk_payload_bytes`` is the mean compressed size of a frame chunk (for a request's bytes)."""
    frame = schema.observation.frame_bytes
    chunks_per_batch = frames_per_batch  # at most: every frame in a chunk of its own
    per_process = (DECODE_PROCESS_BASE + chunks_per_batch * layout.obs_chunk_len * frame
                   + batches_per_block * chunks_per_batch * chunk_payload_bytes)
    return {
        "prefetch_blocks": blocks * block_nbytes,
        "decode_processes": threads * per_process if processes else 0,
    }


def physical_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


#: The memory-limit file of each cgroup version: v2's ``memory.max`` ("max": none), v1's
#: ``memory.limit_in_bytes`` (a number near 2**63: none).
LIMIT_FILES = {"cgroup2": "memory.max", "cgroup": "memory.limit_in_bytes"}


def cgroup_limit_files(proc: str | Path = "/proc/self") -> list[str]:
    """The memory-limit files of this process's cgroup and of every cgroup above it that this process
    can see, in cgroup v2 and in v1's memory hierarchy. Its place in each hierarchy is in
    ``/proc/self/cgroup``; where each hierarchy is mounted, and which part of it, in
    ``/proc/self/mountinfo``. A container with its own cgroup namespace sees its limit at the
    mount's root; a Slurm job, a systemd unit or a container without one has it on a cgroup below."""
    proc = Path(proc)
    try:
        places = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    wanted: list[tuple[str, str]] = []  # (filesystem type, the process's cgroup path in it)
    for line in places:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            wanted.append(("cgroup2", parts[2]))
        elif "memory" in parts[1].split(","):
            wanted.append(("cgroup", parts[2]))
    files: list[str] = []
    for line in mounts:
        left, sep, right = line.partition(" - ")
        fields, info = left.split(), right.split()
        if not sep or len(fields) < 5 or len(info) < 3:
            continue
        fstype, root, mount = info[0], _unescape(fields[3]), Path(_unescape(fields[4]))
        if fstype not in LIMIT_FILES or (fstype == "cgroup" and "memory" not in info[2].split(",")):
            continue
        for kind, path in wanted:
            if kind != fstype or not (path == root or path.startswith(root.rstrip("/") + "/")):
                continue
            here = mount / path[len(root):].lstrip("/")
            while True:
                name = str(here / LIMIT_FILES[fstype])
                if name not in files:
                    files.append(name)
                if here == mount or here.parent == here:
                    break
                here = here.parent
    return files


def _unescape(field: str) -> str:
    """A mountinfo path field: spaces, tabs, newlines and backslashes are written as octal escapes."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def cgroup_limit(files: Sequence[str] | None = None) -> int | None:
    """The lowest memory limit set on this process's cgroups (``cgroup_limit_files``; or on
    ``files``), or None where none is set."""
    limits = []
    for name in cgroup_limit_files() if files is None else files:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with a huge number, v2 with "max"
            limits.append(int(text))
    return min(limits, default=None)


def memory_limit() -> tuple[int | None, str]:
    """What this process may use, and how to say it: its cgroup's memory limit (a container's, a
    Slurm job's) where one is set below the machine's RAM, else the RAM."""
    ram, limit = physical_ram(), cgroup_limit()
    if limit is not None and (ram is None or limit < ram):
        return limit, f"this process's cgroup (its container's or job's) limits it to {limit / MB:.0f} MB"
    return ram, f"this computer has {(ram or 0) / MB:.0f} MB of RAM"


#: The compressed-chunk cache of a store opened or created without ``cache_bytes``, where there is room.
DEFAULT_CACHE_BYTES = 256 * MB


def default_cache_bytes(budget: int | None) -> int:
    """The chunk cache a store gets when no ``cache_bytes`` is passed: 256 MB, or a quarter of
    ``budget`` (a ``memory_budget``), or of the memory this process may use, where that is below
    1 GB (a small container or job), so that the default alone never fills it."""
    if isinstance(budget, numbers.Integral) and not isinstance(budget, bool) and budget > 0:
        limit: int | None = int(budget)
    else:  # none, or a bad one (check_config refuses that)
        limit = memory_limit()[0]
    return DEFAULT_CACHE_BYTES if limit is None else min(DEFAULT_CACHE_BYTES, limit // 4)


def check_episode(nbytes: int, budget: int | None, *, what: str) -> None:
    """Refuse to read ``nbytes`` of one episode's frames into RAM at once where they would take more
    than half of ``budget`` (a store's ``memory_budget``) or of the memory this process may use: an
    episode of a task that never ends can be the whole ring (~7 GB of Atari frames a 1M steps)."""
    limit, said = (budget, f"memory_budget is {budget / MB:,.0f} MB") if budget is not None else memory_limit()
    if limit is None or nbytes <= limit // 2:
        return
    raise SampleError(f"{what} would take {nbytes / MB:,.0f} MB of frames in RAM at once, more than half of what "
                      f"this process may use ({said}); read part of it: episode(..., moves=slice(A, B)), or "
                      "replaystore episodes PATH --save INDEX FILE --moves A:B")


def check_budget(parts: dict[str, int], budget: int | None, *, path: str, adding: dict[str, int] | None = None) -> None:
    """Raise ``ConfigError`` when ``parts`` cannot fit in ``budget`` bytes (or in the memory this
    process may use). With ``adding`` (the parts of something being added, such as a prefetcher,
    already in ``parts``), the error names the largest of those and its knob."""
    total = sum(parts.values())
    limit, what = (budget, f"memory_budget is {budget / MB:.0f} MB") if budget is not None else memory_limit()
    if limit is None or total <= limit:
        return
    largest = max(adding or parts, key=lambda k: (adding or parts)[k])
    listing = ", ".join(f"{k.replace('_', ' ')} {v / MB:.1f} MB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    raise ConfigError(
        f"the replay store at {path} would need about {total / MB:.0f} MB of RAM ({listing}) but {what}; "
        + ("the prefetcher's largest part is " if adding else "the largest part is ")
        + f"the {largest.replace('_', ' ')}: lower {_KNOBS[largest]}"
        + (", or raise memory_budget" if budget is not None else "")
    )


def check_config(schema: Schema, layout: Layout, root: str | Path, *, writable: bool | int, cache_bytes: Any,
                  memory_budget: Any, decode_threads: Any) -> None:
    """Validate the RAM knobs of ``create``/``open``, then refuse a configuration over ``memory_budget``."""
    for name, value, low in (("cache_bytes", cache_bytes, 0), ("decode_threads", decode_threads, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ConfigError(f"{name} is {value!r}; it must be an int >= {low}")
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Integral)
                                      or memory_budget <= 0):
        raise ConfigError(f"memory_budget is {memory_budget!r}; it must be a positive number of bytes, or None")
    parts = estimate(schema, layout, writable=writable, cache_bytes=int(cache_bytes), decode_threads=int(decode_threads))
    check_budget(parts, None if memory_budget is None else int(memory_budget), path=str(root))
