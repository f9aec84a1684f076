"""What the store gives back, as one part of the facade: ``Reading``, the methods that sample
batches (``sample``, ``sample_sequences``, ``sampler``, ``plan``), read episodes (``episode``,
``iter_episodes``), feed learners (``blocks``, ``as_dataset``, ``jax_blocks``, and the RAM their
prefetchers may take: ``memory_estimate``, ``admit_prefetcher``) and set priorities.
``ReplayStore`` (facade.py) holds one and hands these methods to it (parts.py's ``delegated``); each
takes the store's lock for the part that reads the rings and decodes frames outside it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.format.schema import Layout, Schema
from replaystore.sampling.assemble import Batch
from replaystore.sampling.episodes import Episode, episode_table, plan_episode, plan_span, stream_ring
from replaystore.sampling.memory import check_budget, estimate
from replaystore.sampling.pending import Pending
from replaystore.sampling.priority import check_priorities, check_slots
from replaystore.sampling.samplers import PrioritizedSampler, Sampler, UniformSampler, check_batch_size
from replaystore.sampling.sequences import SequenceBatch, SequenceSampler
from replaystore.storage.reader import FrameReader
from replaystore.store.parts import Parts

#: The defaults of the arguments that describe a sampler (``sampler=`` replaces them all).
_SAMPLER_DEFAULTS: dict[str, Any] = {"n_step": 1, "gamma": 0.99, "prioritized": False, "alpha": 0.6, "beta": 0.4,
                                     "sequence_length": None}


class Reading:
    """The reading half of ``ReplayStore``: it holds the store's ``Parts`` (parts.py) and nothing else."""

    def __init__(self, parts: Parts) -> None:
        self._p = parts

    # What a prefetcher draws from (feed/prefetch.py's ``Source``): a feed holds this half, and so the
    # parts, alive (and not the facade: the parts are closed when neither is left, facade.py)
    @property
    def schema(self) -> Schema:
        return self._p.schema

    @property
    def layout(self) -> Layout:
        return self._p.layout

    @property
    def reader(self) -> FrameReader:
        return self._p.reader

    def sample(self, batch_size: int, *, rng: np.random.Generator | None = None, n_step: int = 1,
               gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
               sampler: Sampler | None = None) -> Batch:
        """Sample ``batch_size`` transitions with replacement: uniformly, or by priority.

        ``n_step`` > 1 returns the discounted n-step reward, the observation up to ``n_step`` moves
        ahead and ``discount = gamma**k`` (0 after a termination). With ``prioritized=True`` a
        transition is drawn with probability ``p**alpha / sum p**alpha`` and ``weight`` holds its
        importance weight ``(N P(i))**-beta``, normalised so the largest possible weight is 1; set
        priorities with ``update_priorities(batch.index, new_priorities)``. ``sampler``: a sampler
        made elsewhere in place of those arguments, such as a ``HindsightSampler`` (its batch type).
        Safe to call from several threads and alongside ``add`` (decoding runs outside the store's lock).

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").sample(4, rng=np.random.default_rng(1), n_step=3).discount.shape
            (4,)
        """
        sampler = self._chosen(sampler, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta)
        batch: Batch = self._viewed(self.plan(sampler, check_batch_size(batch_size), rng=rng).finish(self._p.reader))
        return batch

    def sample_sequences(self, batch_size: int, length: int, *, rng: np.random.Generator | None = None) -> SequenceBatch:
        """Sample ``batch_size`` windows of ``length`` consecutive transitions, each inside one episode
        of one stream, uniformly (with replacement) over every valid window start: for recurrent
        agents and world models. ``obs`` is ``(batch, length + 1, frame_stack, *obs_shape)`` (the
        window's observations and the one after its last move), ``action``, ``reward``,
        ``terminated`` and ``truncated`` are ``(batch, length)``, ``index`` the slot of each window's
        first step. Episodes shorter than ``length`` moves are never drawn; a store with no window
        raises ``SampleError``. A draw costs what the window costs, not what the store holds.

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").sample_sequences(4, 3, rng=np.random.default_rng(0)).obs.shape
            (4, 4, 2, 4)
        """
        batch: SequenceBatch = self._viewed(self.plan(SequenceSampler(length), check_batch_size(batch_size),
                                                      rng=rng).finish(self._p.reader))
        return batch

    def episode(self, index: int = -1, *, stream: int = 0, moves: slice | None = None) -> Episode:
        """Live episode ``index`` of ``stream``, oldest first (negative: from the newest; -1, the
        default, is the newest, which may be in progress), read whole: every observation (single
        frames, ``(moves + 1, *obs_shape)``), action, reward and how each move ended, and whether
        it ``ended`` terminated, truncated or is in progress (sampling/episodes.py). ``moves``
        (a slice, such as ``slice(0, 1000)``) reads those of its live moves and the observations
        around them instead. A stream or index the store does not have raises ``SampleError``, and
        so do frames that would take more than half of ``memory_budget`` (or of the memory this
        process may use): read such an episode in parts.

        Example:
            >>> ReplayStore.open("/tmp/doc.zarr").episode(0).obs.shape[1:]
            (4,)
        """
        with self._p.mutex:
            self._p.check_open()
            pending = plan_episode(self._p.rings, self._p.reader, index, stream, moves=moves, budget=self._p.memory_budget)
        episode: Episode = self._viewed(pending.finish(self._p.reader))
        return episode

    def iter_episodes(self, *, stream: int | None = None, whole: bool = False) -> Iterator[Episode]:
        """Every live episode of ``stream`` (None: of each stream in turn), oldest first, each read
        whole as ``episode`` reads it, one at a time; with ``whole``, only those whose first and
        last steps are both live and that hold a move (no episode in progress, none the ring has cut).
        Each stream's episodes are listed once, when the iteration reaches it: an episode the writer
        overwrites before it is read raises ``SampleError``, and so does one too large to read at
        once (``episode``).

        Example:
            >>> sum(len(e) for e in ReplayStore.open("/tmp/doc.zarr").iter_episodes()) > 0
            True
        """
        with self._p.mutex:
            self._p.check_open()
            if stream is not None:
                stream_ring(self._p.rings, stream)  # a stream the store does not have: SampleError here
            streams = range(self._p.num_streams) if stream is None else [int(stream)]
        return self._episodes_of(streams, whole)

    def _episodes_of(self, streams: Iterable[int], whole: bool) -> Iterator[Episode]:
        for k in streams:
            with self._p.mutex:
                self._p.check_open()
                table = episode_table(stream_ring(self._p.rings, k))
            for i in range(int(table["start_step"].size)):
                if whole and not (table["whole"][i] and table["lengths"][i]):
                    continue
                with self._p.mutex:
                    self._p.check_open()
                    pending = plan_span(stream_ring(self._p.rings, k), self._p.reader, k, i, table,
                                        budget=self._p.memory_budget)
                episode: Episode = self._viewed(pending.finish(self._p.reader))
                yield episode

    def sampler(self, *, n_step: int = 1, gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6,
                beta: float = 0.4, sequence_length: int | None = None) -> Sampler:
        """The sampler these arguments describe (sampling/samplers.py), checked: transitions drawn
        uniformly or by priority (this store's priorities), or windows of ``sequence_length``. Made
        once per set of arguments (``sample`` asks for one per call)."""
        key = (type(n_step), n_step, type(gamma), gamma, prioritized, alpha, beta, sequence_length)  # (True != 1)
        try:
            return self._p.samplers[key]
        except (KeyError, TypeError):  # (TypeError: unhashable arguments, refused below)
            pass
        sampler: Sampler
        if sequence_length is not None:
            sampler = SequenceSampler(sequence_length)
        elif prioritized:
            sampler = PrioritizedSampler(self._p.priorities, alpha=alpha, beta=beta, n_step=n_step, gamma=gamma)
        else:
            sampler = UniformSampler(n_step=n_step, gamma=gamma)
        if len(self._p.samplers) < 64:
            self._p.samplers[key] = sampler
        return sampler

    def _chosen(self, sampler: Sampler | None, **arguments: Any) -> Sampler:
        """``sampler`` bound to this store, or (None) the one ``arguments`` describe."""
        if sampler is None:
            return self.sampler(**arguments)
        if not isinstance(sampler, Sampler):
            raise ConfigError(f"sampler is {sampler!r}; pass a replaystore sampler (such as HindsightSampler) or None")
        given = [name for name, value in arguments.items() if value != _SAMPLER_DEFAULTS[name]]
        if given:
            raise ConfigError(f"sampler= was passed together with {', '.join(given)}, which describe another sampler; "
                              f"give the sampler its own settings (it samples as {sampler.describe()})")
        return sampler.bind(self._p.schema)

    def plan(self, sampler: Sampler, batch_size: int, *, rng: np.random.Generator | None = None, batches: int = 1,
             out: list[np.ndarray] | None = None) -> Pending:
        """The locked half of sampling, for callers that decode the frames elsewhere (the
        prefetcher): ``sampler`` draws ``batches`` batches and plans them (``Sampler.plan``). The
        returned ``Pending`` is finished with ``pending.finish(store.reader)`` without the lock."""
        rng = rng if rng is not None else np.random.default_rng()
        with self._p.mutex:
            self._p.check_open()
            return sampler.plan(self._p.rings, self._p.reader, batch_size, rng, batches=batches, out=out)

    def blocks(self, batch_size: int, *, batches_per_block: int = 8, n_step: int = 1, gamma: float = 0.99,
               prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4, threads: int = 2, depth: int = 4,
               seed: int | None = None, processes: bool | None = None, sequence_length: int | None = None,
               sampler: Sampler | None = None) -> Any:
        """An endless iterator of sampled *blocks*, drawn in the background: each a ``feed.blocks.Block``
        (a mapping of numpy arrays with the ``Batch`` fields, or with ``sequence_length`` the
        ``SequenceBatch`` fields) shaped ``(batches_per_block, batch_size, ...)``: row ``i`` is batch
        ``i``. For any learner, whatever its framework: one that runs ``batches_per_block`` gradient
        steps per compiled call takes a block at a time. ``threads``, ``depth`` (blocks in flight),
        ``seed`` and ``processes`` are as for ``as_dataset``; the same seed gives the same blocks as
        ``as_dataset(..., batches_per_call=batches_per_block)`` cuts into batches. ``sampler``: a
        sampler made elsewhere (a ``HindsightSampler``) in place of the sampling arguments.

        ``block.release()`` (or ``with block:``) hands a block's memory back for the next one; a
        released block's fields raise ``BlockReleasedError``, and an array taken from it keeps its
        values for as long as it is held (its memory is reused only once nothing refers to it).
        Returns a ``feed.blocks.BlockIterator``; ``close()`` (or ``with``) stops its workers.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr").blocks(8, batches_per_block=4, seed=0) as it:  # doctest: +SKIP
            ...     next(it)["obs"].shape
            (4, 8, 2, 4)
        """
        from replaystore.feed.blocks import BlockIterator

        self._p.check_open()
        sampler = self._chosen(sampler, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta,
                               sequence_length=sequence_length)
        return BlockIterator(self, sampler, batch_size, batches_per_block=batches_per_block, threads=threads,
                             depth=depth, seed=seed, processes=processes)

    def as_dataset(self, batch_size: int, *, n_step: int = 1, gamma: float = 0.99, prioritized: bool = False,
                   alpha: float = 0.6, beta: float = 0.4, prefetch: int = 4, threads: int = 2,
                   batches_per_call: int = 8, seed: int | None = None, device: str | None = "auto",
                   processes: bool | None = None, blocks: bool = False, sequence_length: int | None = None,
                   sampler: Sampler | None = None) -> Any:
        """An endless ``tf.data.Dataset`` of sampled batches, drawn in the background (imports TensorFlow).

        Each element is a dict with the ``Batch`` fields (with ``sequence_length``, the
        ``SequenceBatch`` fields; with ``blocks=True``, whole blocks of ``batches_per_call``
        batches) and a fixed ``element_spec``. ``threads`` workers draw ``batches_per_call`` batches
        per call ahead of the consumer, ``prefetch`` batches are kept ready; ``processes`` (None:
        where possible, unless the store keeps its small frames decoded) decodes in child processes
        instead of on the threads, with the same batches.
        ``device="auto"`` places batches on the first GPU when there is one. With a ``seed`` and a
        store that is not being written, the batches are the same every run; it works while this
        process ``add``s to the store. ``sampler``: as for ``blocks``. RAM and speed of each knob:
        docs/sampling.md.

        Returns a ``tfdata.ReplayDataset``, a ``tf.data.Dataset`` whose ``prefetcher`` owns the
        workers (``dataset.prefetcher.close()`` stops them; so does the end of this process).

        Example:
            >>> ds = ReplayStore.open("/tmp/doc.zarr").as_dataset(8, seed=0)  # doctest: +SKIP
            >>> next(iter(ds))["obs"].shape  # doctest: +SKIP
            TensorShape([8, 2, 4])
        """
        from replaystore.feed.tfdata import as_dataset

        self._p.check_open()
        sampler = self._chosen(sampler, n_step=n_step, gamma=gamma, prioritized=prioritized, alpha=alpha, beta=beta,
                               sequence_length=sequence_length)
        return as_dataset(self, sampler, batch_size, prefetch=prefetch, threads=threads,
                          batches_per_call=batches_per_call, seed=seed, device=device, processes=processes,
                          blocks=blocks)

    def jax_blocks(self, batch_size: int, *, batches_per_block: int = 32, device: Any = None, depth: int = 2,
                   **kwargs: Any) -> Any:
        """``blocks`` already on a JAX device: a feeder thread puts each block on ``device`` (default:
        JAX's first device, a GPU where there is one) with ``jax.device_put`` while the learner
        trains on the one before, ``depth`` blocks ahead. Each item is a dict of ``jax.Array``
        shaped ``(batches_per_block, batch_size, ...)``, ready for a compiled call that runs a
        block's gradient steps (``lax.scan``); ``index`` stays a numpy array (it is for
        ``update_priorities``). Host memory is not reused before its copy is done.
        Other arguments as for ``blocks``. Returns a ``feed.devicefeed.Feeder``; ``close()`` (or
        ``with``) stops it. Needs JAX (``pip install 'replaystore[jax]'``).
        """
        from replaystore.feed.jaxfeed import device_blocks

        self._p.check_open()
        names = ("n_step", "gamma", "prioritized", "alpha", "beta", "sequence_length")
        sampler = self._chosen(kwargs.pop("sampler", None), **{name: kwargs.pop(name) for name in names if name in kwargs})
        return device_blocks(self, sampler, batch_size, device=device, depth=depth,
                             batches_per_block=batches_per_block, **kwargs)

    def torch_blocks(self, batch_size: int, *, batches_per_block: int = 8, device: Any = None,
                     pin_memory: bool | None = None, depth: int = 2, **kwargs: Any) -> Any:
        """``blocks`` as torch tensors for a PyTorch learner, moved ahead by a feeder thread: on a CUDA
        ``device`` (the default where there is one) through pinned memory, on the CPU without a copy.
        Each item is a dict of ``torch.Tensor`` shaped ``(batches_per_block, batch_size, ...)``
        (``block["obs"][i]`` is batch ``i``); ``index`` stays a numpy array. Other arguments as for
        ``blocks``. Returns a ``feed.devicefeed.Feeder``; ``close()`` (or ``with``) stops it. Needs
        torch (``pip install 'replaystore[torch]'``), never TensorFlow.

        Example:
            >>> with ReplayStore.open("/tmp/doc.zarr").torch_blocks(8, batches_per_block=4, seed=0) as it:  # doctest: +SKIP
            ...     next(it)["obs"].shape
            torch.Size([4, 8, 2, 4])
        """
        from replaystore.feed.torchfeed import torch_blocks

        self._p.check_open()
        names = ("n_step", "gamma", "prioritized", "alpha", "beta", "sequence_length")
        sampler = self._chosen(kwargs.pop("sampler", None), **{name: kwargs.pop(name) for name in names if name in kwargs})
        return torch_blocks(self, sampler, batch_size, device=device, pin_memory=pin_memory, depth=depth,
                            batches_per_block=batches_per_block, **kwargs)

    def update_priorities(self, index: Any, priority: Any) -> None:
        """Set the priorities of the transitions at ``index`` (``batch.index``) to ``priority``.

        Priorities must be finite and >= 0 (typically ``|td_error| + eps``); they are clipped below to
        1e-6 so no transition is starved. A writer saves them with its next flush, so a reopened store
        samples with them; a read-only store keeps them in RAM only.
        """
        idx, prio = check_priorities(index, priority, self._p.rings.size)
        if idx.size == 0:
            return
        with self._p.mutex:
            self._p.check_open()
            self._p.priorities.update(idx, prio)

    def priorities(self, index: Any) -> np.ndarray:
        """The current priorities (before ``alpha``) of the slots in ``index``, as float32."""
        idx = check_slots(index, self._p.rings.size)
        with self._p.mutex:
            return self._p.rings.priority[idx].copy()

    def warm_cache(self) -> int:
        """Read the store's compressed frame chunks into the cache now, shard by shard (up to
        ``cache_bytes``), so sampling never waits on a disk read; returns the bytes loaded. A 1M-frame
        Atari store is ~65 MB and loads in about a second."""
        with self._p.mutex:
            self._p.check_open()
            return self._p.reader.warm(range(-(-self._p.rings.size // self._p.layout.shard_len)))

    def _viewed(self, result: Any) -> Any:
        """A batch, sequence batch or episode with its frames as the store gives them (a Dict
        store's as dicts of arrays)."""
        if self._p.schema.observation_dict is None:
            return result
        names = [name for name in ("obs", "next_obs") if hasattr(result, name)]
        return dataclasses.replace(result, **{name: self._p.schema.obs_view(getattr(result, name)) for name in names})

    # ---------------------------------------------------------------------------------------------
    # Memory

    def memory_estimate(self) -> dict[str, int]:
        """Bytes of RAM each part of this store can use, its live prefetchers' (``as_dataset``) blocks
        and decode processes included (sampling/memory.py); ``sum(...values())`` for the total."""
        parts = estimate(self._p.schema, self._p.layout, writable=len(self._p.writing),
                         cache_bytes=self._p.reader.cache_bytes, decode_threads=self._p.reader.decode_threads)
        for prefetcher in list(self._p.prefetchers):
            for name, nbytes in prefetcher.memory.items():
                parts[name] = parts.get(name, 0) + nbytes
        return parts

    def admit_prefetcher(self, prefetcher: Any) -> None:
        """Count a new prefetcher's RAM (``prefetcher.memory``) as this store's: refused with
        ``ConfigError`` when the total would exceed the store's memory budget (or the memory this
        process may use), before the prefetcher starts anything."""
        parts = self.memory_estimate()
        for name, nbytes in prefetcher.memory.items():
            parts[name] = parts.get(name, 0) + nbytes
        check_budget(parts, self._p.memory_budget, path=str(self._p.path), adding=prefetcher.memory)
        self._p.prefetchers.add(prefetcher)
