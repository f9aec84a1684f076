"""Hostile and damaged data, built with real files: decompression bombs (decoding bounded, in a child
with an address-space limit), values at the edges of the stored dtypes, strict JSON for machines, a
closed pipe, the command line's refusals, damaged metadata and declared sizes beyond the machine;
every refusal a ``ReplayStoreError`` in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import snapshot
from hostile import filled_store

from replaystore import ReplayStore
from replaystore.cli import main as cli_main


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    return filled_store(tmp_path)


# Decompression bombs --------------------------------------------------------------------------------

BOMB_GIB = 4
CHILD = r"""
import resource, subprocess, sys
import numpy as np
from replaystore import ChunkChecksumError, ReplayStore
path, how = sys.argv[1], sys.argv[2]
if how == "sample without libzstd":  # numcodecs decodes instead
    import replaystore.storage.decoders
    replaystore.storage.decoders.LIBZSTD = None
    how = "sample"
store = ReplayStore.open(path) if how in ("sample", "blocks", "processes") else None
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, vm + 2**30))  # a GiB more than now; the bomb is 4
try:
    if how == "sample":
        for i in range(200):
            store.sample(32, rng=np.random.default_rng(i))
    elif how in ("blocks", "processes"):
        blocks = store.blocks(16, batches_per_block=4, threads=2, seed=0, processes=how == "processes")
        for _ in range(100):
            next(blocks).release()
    else:
        from replaystore.cli import main
        sys.exit(main([how, path] + (["--drop-damaged", "--quiet"] if how == "compact" else [])))
except ChunkChecksumError as exc:
    print("refused:", exc)
    sys.exit(3)
print("no error")
"""


def _bomb(chunk: np.ndarray) -> bytes:
    """A zstd frame that declares no size and decompresses to BOMB_GIB GiB of zeros."""
    import zstandard

    out = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
    zeros = bytes(2**26)
    parts = [out.compress(zeros) for _ in range(BOMB_GIB * 16)]
    return b"".join(parts) + out.flush()


@pytest.mark.parametrize("how", ["sample", "sample without libzstd", "blocks", "processes", "verify", "compact"])
def test_a_decompression_bomb_is_refused_within_a_chunks_memory(filled: Path, how: str) -> None:
    """Chunk 0 of shard 0 of the frames replaced by a frame (crc32c right) that inflates to 4 GiB:
    every decoder refuses it naming the chunk, in a process limited to 1 GiB more than it holds."""
    import subprocess
    import sys

    from conftest import rewrite_obs_shard

    pytest.importorskip("zstandard")
    first = [True]

    def encode(chunk: np.ndarray) -> bytes:
        import zstandard

        if first[0]:
            first[0] = False
            return _bomb(chunk)
        return zstandard.ZstdCompressor().compress(chunk.tobytes())

    rewrite_obs_shard(filled, 0, 4, encode)
    done = subprocess.run([sys.executable, "-c", CHILD, str(filled), how], capture_output=True, text=True, timeout=300)
    if how == "verify":
        assert done.returncode == 2, done.stdout + done.stderr
        assert "chunk 0 of shard 0" in done.stdout + done.stderr
    elif how == "compact":
        assert done.returncode == 0, done.stdout + done.stderr
        with ReplayStore.open(filled) as store:
            assert 0 < len(store) < 40
            store.sample(8, rng=np.random.default_rng(0))
    else:
        assert done.returncode == 3, done.stdout + done.stderr
        assert "chunk 0 of shard 0 of 'obs'" in done.stdout and "MemoryError" not in done.stdout + done.stderr


# Values at the edges ---------------------------------------------------------------------------------


def _float_store(path: Path, streams: int = 1) -> ReplayStore:
    import gymnasium as gym

    return ReplayStore.create(path, 64, gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), 1,
                              num_streams=streams)


@pytest.mark.parametrize("reward", [1e39, -1e39, np.float64(3.5e38)])
def test_a_reward_beyond_float32_is_refused_not_stored_as_inf(tmp_path: Path, reward: float) -> None:
    from replaystore import InvalidTransitionError

    store = _float_store(tmp_path / "r.zarr")
    obs = np.zeros(4, np.float32)
    store.add(obs, 0, 1.0, obs + 1, False, False)
    with pytest.raises(InvalidTransitionError, match="beyond float32 .* scale or clip the reward"):
        store.add(obs + 1, 0, reward, obs + 2, False, False)
    store.add(obs + 1, 0, float(np.finfo(np.float32).max), obs + 2, True, False)  # the largest float32 is kept
    assert len(store) == 2 and np.isfinite(store.sample(2, rng=np.random.default_rng(0)).reward).all()
    store.close()
    batch = _float_store(tmp_path / "b.zarr", streams=2)
    with pytest.raises(InvalidTransitionError, match=r"reward\[1\] is .* beyond float32"):
        batch.add_batch(np.zeros((2, 4), np.float32), [0, 1], [0.0, reward], np.ones((2, 4), np.float32),
                        [False, False], [False, False])
    assert len(batch) == 0
    batch.close()


def test_nan_observations_are_refused_inf_and_out_of_bounds_kept(tmp_path: Path) -> None:
    import gymnasium as gym

    from replaystore import InvalidTransitionError

    store = _float_store(tmp_path / "f.zarr")
    obs = np.zeros(4, np.float32)
    bad = np.array([0.0, np.nan, 1.0, 2.0], np.float32)
    with pytest.raises(InvalidTransitionError, match="next_obs holds NaN"):
        store.add(obs, 0, 0.0, bad, False, False)
    with pytest.raises(InvalidTransitionError, match="obs holds NaN"):
        store.add(bad, 0, 0.0, obs, False, False)
    assert len(store) == 0
    store.add(obs, 0, 0.0, np.array([np.inf, -np.inf, 1e30, 0.0], np.float32), True, False)
    assert len(store) == 1 and np.isinf(store.sample(1, rng=np.random.default_rng(0)).next_obs).sum() == 2
    store.close()
    bounded = ReplayStore.create(tmp_path / "box.zarr", 64, gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
                                 gym.spaces.Discrete(2), 1)
    bounded.add(obs, 0, 0.0, np.full(4, 5.0, np.float32), True, False)  # outside the Box: kept, as the env gave it
    assert len(bounded) == 1
    bounded.close()


# Output for machines, and pipes -----------------------------------------------------------------------


def _strict(text: str) -> object:
    import json

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_infinite_bounds_are_strict_json_in_zarr_json_and_inspect(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import gymnasium as gym

    space = gym.make("CartPole-v1").observation_space  # two of its bounds are infinite
    path = tmp_path / "cartpole.zarr"
    store = ReplayStore.create(path, 64, space, gym.spaces.Discrete(2), 1)
    store.add(np.zeros(4, np.float32), 0, 1.0, np.ones(4, np.float32), True, False)
    store.close()
    for doc in path.rglob("zarr.json"):
        _strict(doc.read_text())
    assert cli_main(["inspect", "--json", str(path)]) == 0
    low = _strict(capsys.readouterr().out)["schema"]["observation_space"]["low"]  # type: ignore[index]
    assert low[1] == "-inf" and isinstance(low[0], float)
    with ReplayStore.open(path) as again:  # and back
        assert again.observation_space == space


def test_a_closed_pipe_ends_the_cli_quietly(filled: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(f"{sys.executable} -m replaystore.cli inspect {filled} | true; "
                          "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True, text=True)
    assert done.stderr == "" and done.stdout.strip() == "141"


# The command line's refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "message"), [
    (["--level", "99"], "zstd level is 99, outside -7..22"),
    (["--codec", "blosc:nope"], "blosc cname is 'nope'"),
    (["--shard-len", "0"], "shard_len 0"),
    (["--chunk-len", "0"], "obs_chunk_len 0"),
    (["--chunk-len", "5"], "shard_len a multiple of obs_chunk_len"),
])
def test_compact_refuses_bad_layouts_in_one_line(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 flags: list[str], message: str) -> None:
    """Not a numcodecs traceback, and 0 is not silently taken for "the default"."""
    before = snapshot(filled)
    assert cli_main(["compact", str(filled), str(tmp_path / "new.zarr"), "--quiet", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "new.zarr").exists() and snapshot(filled) == before


def test_inspect_plot_reports_the_file_it_wrote(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "plots").mkdir()
    for given, written in ((tmp_path / "chart", tmp_path / "chart.png"), (tmp_path / "plots", tmp_path / "plots" / "replay.png"),
                           (tmp_path / "chart.svg", tmp_path / "chart.svg")):
        assert cli_main(["inspect", str(filled), "--plot", str(given)]) == 0
        assert f"plot              {written}" in capsys.readouterr().out and written.is_file()
    assert cli_main(["inspect", str(filled), "--plot", str(tmp_path / "chart.zarr")]) == 1
    assert "name the file .png" in capsys.readouterr().err and not (tmp_path / "chart.zarr").exists()


def test_a_shard_file_replaced_by_a_directory_is_damage_not_a_traceback(filled: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from replaystore import ChunkChecksumError
    from replaystore.format.shards import shard_key

    shard = filled / shard_key("obs", 0, 2)
    shard.unlink()
    shard.mkdir()
    with ReplayStore.open(filled) as store, pytest.raises(ChunkChecksumError, match="is not a regular file"):
        for i in range(50):
            store.sample(16, rng=np.random.default_rng(i))
    assert cli_main(["verify", str(filled), "--quiet"]) == 2
    assert "DAMAGED obs shard 0" in capsys.readouterr().out
    assert cli_main(["compact", str(filled), "--drop-damaged", "--quiet"]) == 0
    with ReplayStore.open(filled) as store:
        assert 0 < len(store) < 40
        store.sample(8, rng=np.random.default_rng(0))



# Damaged metadata: refused when the store opens, naming the file and the key ----------------------------


@pytest.mark.parametrize(("where", "value", "message"), [
    (("state", "added"), -5, "attributes.state.added is -5, outside"),
    (("state", "added"), "x", "attributes.state.added is 'x' (str), expected int"),
    (("state", "episode_in_progress"), 3, "attributes.state.episode_in_progress is 3 (int), expected bool"),
    (("schema", "capacity"), "big", "attributes.schema.capacity is 'big' (str), expected int"),
    (("schema", "frame_stack"), 0, "attributes.schema.frame_stack is 0, outside [1, 1024]"),
    (("layout", "shard_len"), 2**40, "attributes.layout.shard_len is 1099511627776, outside"),
    (("layout", "codec"), {"name": "lzma"}, "attributes.layout.codec has no 'level'"),
])
def test_damaged_attributes_are_named_with_their_file_and_key(filled: Path, where: tuple[str, str], value: object,
                                                              message: str) -> None:
    import json

    from replaystore import CorruptStoreError

    doc = json.loads((filled / "zarr.json").read_text())
    doc["attributes"]["replaystore"][where[0]][where[1]] = value
    (filled / "zarr.json").write_text(json.dumps(doc))
    for mode in ("r", "a"):
        with pytest.raises(CorruptStoreError) as caught:
            ReplayStore.open(filled, mode=mode)
        assert str(caught.value).startswith(f"{filled}/zarr.json {message}") and "\n" not in str(caught.value)


def test_declared_sizes_beyond_the_machine_are_refused_before_anything_is_allocated(filled: Path) -> None:
    """The root and every array's zarr.json agreeing on a 10^12-step ring: refused by the memory
    estimate, not by a MemoryError (or the OOM killer) halfway through opening."""
    import json

    from replaystore import ConfigError

    doc = json.loads((filled / "zarr.json").read_text())
    doc["attributes"]["replaystore"]["schema"]["capacity"] = 10**12
    (filled / "zarr.json").write_text(json.dumps(doc))
    for array in filled.iterdir():
        meta = array / "zarr.json"
        if array.is_dir() and meta.exists():
            d = json.loads(meta.read_text())
            d["shape"][0] = 10**12
            meta.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="would need about .* MB of RAM"):
        ReplayStore.open(filled)

