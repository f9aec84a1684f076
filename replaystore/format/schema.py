"""What a store holds, as frozen dataclasses, and their round trip through the zarr group attributes.

The group's ``zarr.json`` carries one attribute, ``replaystore``::

    {"format_version": 2,
     "schema":  {"observation_space": {...}, "action_space": {...}, "capacity": N, "frame_stack": k,
                 "num_streams": M},
     "layout":  {"shard_len": 4096, "obs_chunk_len": 8, "codec": {"name": "zstd", "level": 3}}}

Each stream commits its own state in ``streams/<k>/zarr.json`` (``stream_doc``), so writers of
different streams never rewrite the same file. A store of one stream on a file system is version 1:
its one commit is ``"state"`` here, with no ``num_streams`` (storage/local reads it as stream 0's).
Version 3 is a store on object storage (storage/objects). A ``Dict`` observation space is written
as ``{"type": "Dict", "spaces": [[key, Box], ...]}`` in any version (format/dictobs.py). Everything
read back from disk is validated here, so a hostile or truncated ``zarr.json`` becomes a
``CorruptStoreError`` naming the bad key rather than a crash deep inside numpy (the spaces and the
typed fields are read by spacedoc.py). The spaces themselves (``BoxSpec``, ``DiscreteSpec``, from
and to gymnasium) are spaces.py's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import CorruptStoreError, FormatVersionError
from replaystore.format.dictobs import DictSpec
from replaystore.format.extras import PREFIX, ExtraSpec, check_requires, extras_attrs, parse_extras
from replaystore.format.spacedoc import get, get_int, parse_box, parse_dict, parse_entry
from replaystore.format.spaces import (
    MAX_ACTION_SIZE,
    ActionSpec,
    BoxSpec,
    DiscreteSpec,
    EntrySpec,
    StepField,
    space_attrs,
    stored_box,
)

FORMAT_VERSION = 3  # the newest format version written (and the highest read): see the versions below
ROOT_STATE_VERSION = 1  # one stream, its commit in the root zarr.json (read and appended to, no longer created)
LOCAL_FORMAT_VERSION = 2  # a store on a file system: a commit per stream under streams/<k>/
OBJECT_FORMAT_VERSION = 3  # a store on object storage: streams with generation-keyed shard objects
ATTR_KEY = "replaystore"
STREAM_ATTR_KEY = "replaystore_stream"
STREAMS_DIR = "streams"
MAX_STREAMS = 4096

#: Observation spaces kept as the Box of their values, given back as themselves (``Schema.observation_entry``).
ENTRY_TYPES = ("Discrete", "MultiBinary", "MultiDiscrete")
#: Scalar per-step fields: name -> dtype. ``obs`` is the frame array; the rest are 1-D over slots.
SCALAR_FIELDS: dict[str, str] = {
    "action": "int32",
    "reward": "float32",
    "terminated": "bool",
    "truncated": "bool",
    "is_last": "bool",
    "ep_step": "int32",
    "priority": "float32",
}
MAX_CAPACITY = 2**40
#: What a frame stack holds before its episode's first step (``Schema.frame_padding``).
FRAME_PADDINGS = ("reset", "zero")
#: Steps a stream may ever add (positions carry the stream in the bits above these: see storage/rings.py).
MAX_POSITION = 2**46 - 1


@dataclass(frozen=True)
class Schema:
    """The spaces, ring capacity (steps) and frame stack a store was created with."""

    observation: BoxSpec
    action: ActionSpec
    capacity: int
    frame_stack: int
    num_streams: int = 1
    #: what a stack holds before its episode's first step: ``"reset"`` (that first frame again,
    #: gymnasium's ``FrameStackObservation`` default) or ``"zero"`` (zeros, SB3's ``VecFrameStack``)
    frame_padding: str = "reset"
    #: a ``Dict`` observation space (dictobs.py): ``observation`` is then the flat frame each step's
    #: dict is kept in, and the store takes and gives dicts
    observation_dict: DictSpec | None = None
    #: per-move fields the user declared (format/extras.py), kept beside ``action`` and ``reward``
    extras: tuple[ExtraSpec, ...] = ()
    #: a ``Discrete``, ``MultiBinary`` or ``MultiDiscrete`` observation space: ``observation`` is the
    #: Box its values are kept as (spaces.stored_box), and the store gives this space back
    observation_entry: EntrySpec | None = None

    def observation_space(self) -> Any:
        """The gymnasium space of the observations the store takes and gives (a Box, or a Dict)."""
        return (self.observation_dict or self.observation_entry or self.observation).to_space()

    def obs_view(self, frames: np.ndarray) -> Any:
        """Stored frames ``(..., *observation.shape)`` as the store gives them: as they are, or a
        Dict store's as a dict of views (``DictSpec.unpack``)."""
        return frames if self.observation_dict is None else self.observation_dict.unpack(frames)

    @property
    def stream_capacity(self) -> int:
        """Steps in each stream's ring (``capacity`` is split evenly)."""
        return self.capacity // self.num_streams


def action_field(action: ActionSpec) -> StepField:
    """How one step's action is stored: one int32 for ``Discrete``; the Box's shape and dtype."""
    if isinstance(action, BoxSpec):
        return action.shape, action.dtype
    return (), SCALAR_FIELDS["action"]


def scalar_fields(action: ActionSpec, extras: tuple[ExtraSpec, ...] = ()) -> dict[str, StepField]:
    """Every per-step field but the frames, for a store of ``action``s and ``extras``: name -> (shape,
    dtype). Each is one array over the slots, kept whole in RAM (``SCALAR_FIELDS``, with the action's
    own, then each extra as ``extras/<name>``)."""
    fields: dict[str, StepField] = {name: ((), dtype) for name, dtype in SCALAR_FIELDS.items()}
    fields["action"] = action_field(action)
    fields.update({e.field: (e.shape, e.dtype) for e in extras})
    return fields


def array_names(schema: Schema) -> tuple[str, ...]:
    """Every array of the group: the frames, then each per-step field."""
    return ("obs", *scalar_fields(schema.action, schema.extras))


def batch_action(action: ActionSpec) -> StepField:
    """A sampled action's shape and dtype: int64 for ``Discrete`` (what losses index with), a Box's own."""
    return (action.shape, action.dtype) if isinstance(action, BoxSpec) else ((), "int64")


def item_ndim(schema: Schema, name: str) -> int:
    """Dimensions of one step of array ``name`` (the frames', a Box action's, else 0): its shard keys
    carry one ``/0`` per dimension (zarr v3 default key encoding)."""
    if name == "obs":
        return len(schema.observation.shape)
    if name.startswith(PREFIX):
        return next(len(e.shape) for e in schema.extras if e.field == name)
    return len(action_field(schema.action)[0]) if name == "action" else 0


@dataclass(frozen=True)
class CodecSpec:
    """The compressor of every array: ``zstd`` (level) or ``blosc`` (cname, level)."""

    name: str = "zstd"
    level: int = 3
    cname: str = "zstd"


@dataclass(frozen=True)
class Layout:
    """Chunking along time: ``shard_len`` steps per shard file; frames in ``obs_chunk_len`` chunks.

    Scalar fields use one chunk per shard (they are read whole into RAM at open).
    """

    shard_len: int = 4096
    obs_chunk_len: int = 8
    codec: CodecSpec = CodecSpec()


@dataclass(frozen=True)
class State:
    """The committed state: what a reader may trust.

    ``added`` counts steps ever written; step ``t`` lives in slot ``t % capacity``. Live steps are
    ``[max(oldest, added - capacity), added)``; ``oldest`` moves ahead *before* a shard that
    overwrites live steps is written, so a crash between the two never exposes overwritten slots.
    """

    added: int = 0
    oldest: int = 0
    episode_in_progress: bool = False
    episodes: int = 0
    updated: str = ""

    def live_start(self, capacity: int) -> int:
        return max(self.oldest, self.added - capacity)


# --------------------------------------------------------------------------------------------------
# Attributes <-> dataclasses


def stream_stride(schema: Schema, layout: Layout) -> int:
    """Slots between the starts of two streams in the arrays: a stream's capacity rounded up to whole
    shards (so no shard file holds two streams); with one stream, the capacity itself."""
    cap = schema.stream_capacity
    return cap if schema.num_streams == 1 else -(-cap // layout.shard_len) * layout.shard_len


def slot_count(schema: Schema, layout: Layout) -> int:
    """The arrays' length: every stream's region laid end to end."""
    return stream_stride(schema, layout) * schema.num_streams


def to_attrs(schema: Schema, layout: Layout, version: int) -> dict[str, Any]:
    """The ``replaystore`` attribute of a new store's root ``zarr.json`` (format ``version`` 2 or 3:
    each stream's state is in its own ``stream_doc``; version 1: add the state, ``with_root_state``)."""
    return {
        "format_version": version,
        "schema": {
            "observation_space": (schema.observation_dict.attrs() if schema.observation_dict is not None
                                  else space_attrs(schema.observation_entry or schema.observation)),
            "action_space": space_attrs(schema.action),
            "capacity": schema.capacity,
            "frame_stack": schema.frame_stack,
            **({} if version == ROOT_STATE_VERSION else {"num_streams": schema.num_streams}),
            **({} if schema.frame_padding == "reset" else {"frame_padding": schema.frame_padding}),
            **({"extras": extras_attrs(schema.extras), "requires": ["extras"]} if schema.extras else {}),
        },
        "layout": {
            "shard_len": layout.shard_len,
            "obs_chunk_len": layout.obs_chunk_len,
            "codec": dataclasses.asdict(layout.codec),
        },
    }


def group_doc(attributes: dict[str, Any]) -> dict[str, Any]:
    """A zarr v3 group document with these attributes."""
    return {"zarr_format": 3, "node_type": "group", "consolidated_metadata": None, "attributes": attributes}


def with_root_state(doc: dict[str, Any], state: State) -> dict[str, Any]:
    """A format version 1 root document with its (one stream's) commit replaced by ``state``."""
    attrs = dict(doc.get("attributes") or {})
    attrs[ATTR_KEY] = dict(attrs[ATTR_KEY], state=dataclasses.asdict(state))
    return dict(doc, attributes=attrs)


def stream_doc(stream: int, state: State) -> dict[str, Any]:
    """``streams/<k>/zarr.json`` of a store of streams: a zarr group whose attribute is the stream's commit."""
    return group_doc({STREAM_ATTR_KEY: {"stream": stream, "state": dataclasses.asdict(state)}})


def stream_state_from_doc(doc: Any, *, stream: int, path: str) -> State:
    """Validate and parse ``streams/<k>/zarr.json`` read from ``path``."""
    where = f"{path} attributes"
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    root = get(attrs, STREAM_ATTR_KEY, dict, where)
    if get(root, "stream", int, where) != stream:
        raise CorruptStoreError(f"{where}.stream is {root['stream']!r}, expected {stream}; the store is damaged")
    return _parse_state(get(root, "state", dict, where), f"{where}.state")


def from_attrs(attrs: Any, *, path: str) -> tuple[Schema, Layout, int]:
    """Validate and parse the ``replaystore`` attribute read from ``path``: the schema, the layout
    and the format version."""
    where = f"{path}/zarr.json attributes"
    if not isinstance(attrs, dict) or ATTR_KEY not in attrs:
        raise CorruptStoreError(f"{path} is a zarr group but not a replay store (no '{ATTR_KEY}' attribute)")
    root = attrs[ATTR_KEY]
    version = get(root, "format_version", int, where)
    if version > OBJECT_FORMAT_VERSION or version < 1:
        raise FormatVersionError(
            f"{path} has format version {version}, but this replaystore reads versions 1..{OBJECT_FORMAT_VERSION}; "
            "upgrade replaystore to open it"
        )
    s = get(root, "schema", dict, where)
    requires = check_requires(s["requires"], f"{where}.schema") if "requires" in s else ()
    extras = parse_extras(s["extras"], f"{where}.schema.extras") if "extras" in s else ()
    if bool(extras) != ("extras" in requires):
        raise CorruptStoreError(f"{where}.schema lists extras {[e.name for e in extras]} but requires {list(requires)}; "
                                "the store's zarr.json is damaged")
    obs = get(s, "observation_space", dict, f"{where}.schema")
    act = get(s, "action_space", dict, f"{where}.schema")
    if obs.get("type") not in ("Box", "Dict", "Tuple", *ENTRY_TYPES) or act.get("type") not in ("Discrete", "Box"):
        raise CorruptStoreError(f"{where}.schema holds space types {obs.get('type')!r}/{act.get('type')!r}, expected "
                                "Box, Discrete, MultiBinary, MultiDiscrete, Dict or Tuple observations and Discrete "
                                "or Box actions")
    obs_dict = parse_dict(obs, f"{where}.observation_space") if obs["type"] in ("Dict", "Tuple") else None
    entry = parse_entry(obs, f"{where}.observation_space") if obs["type"] in ENTRY_TYPES else None
    box = (obs_dict.stored if obs_dict is not None else stored_box(entry) if entry is not None
           else parse_box(obs, f"{where}.observation_space"))
    action: ActionSpec
    if act["type"] == "Box":
        action = parse_box(act, f"{where}.action_space")
        if np.prod(action.shape, dtype=np.int64) > MAX_ACTION_SIZE:
            raise CorruptStoreError(f"{where}.action_space.shape is {list(action.shape)}, more than "
                                    f"{MAX_ACTION_SIZE} values an action; the store's zarr.json is damaged")
    else:
        action = DiscreteSpec(
            n=get_int(act, "n", f"{where}.action_space", 1, 2**31 - 1),
            start=get_int(act, "start", f"{where}.action_space", -(2**31), 2**31 - 1),
        )
    capacity = get_int(s, "capacity", f"{where}.schema", 2, MAX_CAPACITY)
    frame_stack = get_int(s, "frame_stack", f"{where}.schema", 1, 1024)
    padding = get(s, "frame_padding", str, f"{where}.schema") if "frame_padding" in s else "reset"
    if padding not in FRAME_PADDINGS:
        raise CorruptStoreError(f"{where}.schema.frame_padding is {padding!r}, expected one of {FRAME_PADDINGS}; "
                                "the store's zarr.json is damaged, or was written by a newer replaystore")
    num_streams = 1 if version == ROOT_STATE_VERSION else get_int(s, "num_streams", f"{where}.schema", 1, MAX_STREAMS)
    if capacity % num_streams or capacity // num_streams < 2:
        raise CorruptStoreError(f"{where}.schema.capacity {capacity} does not split into {num_streams} streams")
    if box.frame_bytes * capacity > 2**50:
        raise CorruptStoreError(f"{where}.schema describes {box.frame_bytes * capacity} bytes of frames; absurd size")

    lay = get(root, "layout", dict, where)
    codec = get(lay, "codec", dict, f"{where}.layout")
    codec_spec = CodecSpec(
        name=get(codec, "name", str, f"{where}.layout.codec"),
        level=get_int(codec, "level", f"{where}.layout.codec", -100, 22),
        cname=get(codec, "cname", str, f"{where}.layout.codec"),
    )
    layout = Layout(
        shard_len=get_int(lay, "shard_len", f"{where}.layout", 1, 2**24),
        obs_chunk_len=get_int(lay, "obs_chunk_len", f"{where}.layout", 1, 2**24),
        codec=codec_spec,
    )
    if layout.shard_len % layout.obs_chunk_len or layout.shard_len > capacity // num_streams:
        raise CorruptStoreError(f"{where}.layout {layout} does not fit capacity {capacity}")
    if version == ROOT_STATE_VERSION:
        root_state(attrs, path=path)  # checked now: the store's one commit
    return (Schema(box, action, capacity, frame_stack, num_streams, padding, obs_dict, extras, observation_entry=entry),
            layout, version)


def root_state(attrs: Any, *, path: str) -> State:
    """The commit of a format version 1 store, from its root ``zarr.json`` attributes read from ``path``."""
    where = f"{path}/zarr.json attributes"
    return _parse_state(get(get(attrs, ATTR_KEY, dict, where), "state", dict, where), f"{where}.state")


def _parse_state(st: Any, where: str) -> State:
    added = get_int(st, "added", where, 0, MAX_POSITION)
    state = State(
        added=added,
        oldest=get_int(st, "oldest", where, 0, added),
        episode_in_progress=get(st, "episode_in_progress", bool, where),
        episodes=get_int(st, "episodes", where, 0, 2**62),
        updated=str(st.get("updated", "")),
    )
    if state.episode_in_progress and added == 0:
        raise CorruptStoreError(f"{where} says an episode is in progress in an empty store")
    return state


CHUNK_TARGET_BYTES = 64 * 2**10
MAX_CHUNK_FRAMES = 64
SHARD_BUFFER_MAX_BYTES = 32 * 2**20
DEFAULT_SHARD_LEN = 4096


def default_layout(frame_bytes: int, capacity: int = DEFAULT_SHARD_LEN) -> Layout:
    """The measured default: ~64 KiB frame chunks (8 Atari frames) of at most 64 frames (a batch
    decodes whole every chunk it touches), 4096-step shards, zstd-3; a store of fewer than 4 * 4096
    steps gets power-of-two shards of at most a quarter of its capacity. docs/benchmarks.md
    ("Layout") has the measurements behind these numbers."""
    shard_len = min(DEFAULT_SHARD_LEN, 1 << int(math.log2(max(capacity // 4, 1))))  # >= 4 shards a ring
    chunk_len = 1 << max(0, int(math.log2(max(1, CHUNK_TARGET_BYTES // max(frame_bytes, 1)))))
    chunk_len = min(chunk_len, MAX_CHUNK_FRAMES, shard_len)
    while shard_len > chunk_len and shard_len * frame_bytes > SHARD_BUFFER_MAX_BYTES:
        shard_len //= 2
    return Layout(shard_len=shard_len, obs_chunk_len=chunk_len, codec=CodecSpec())
