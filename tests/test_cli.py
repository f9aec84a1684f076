"""``replaystore inspect`` and ``verify``: summaries, JSON, damaged chunks named, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, flip_byte_in_chunk, frame, make_store, snapshot

from replaystore import ChunkChecksumError, ReplayStore, SampleError
from replaystore.cli import main


@pytest.fixture
def filled(store_path: Path) -> Path:
    store = make_store(store_path, capacity=64, shard_len=16, chunk_len=4)
    fill(store, 100, episode_len=9)  # wraps; ends with an episode in progress
    store.close()
    return store_path


def test_inspect_json(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(filled), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    store = ReplayStore.open(filled)
    assert info["transitions"] == len(store) and info["format_version"] == 1
    assert info["schema"]["capacity"] == 64 and info["layout"]["obs_chunk_len"] == 4
    assert info["state"]["added"] == store.added and info["state"]["episode_in_progress"] is True
    ep = info["episodes"]
    assert ep["complete"] >= 4 and ep["length_min"] == ep["length_max"] == 9  # fill() ends one every 9 moves
    assert info["bytes_on_disk"] > 0 and info["obs_compression_ratio"] > 0


def test_inspect_text(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(filled)]) == 0
    out = capsys.readouterr().out
    assert "format version 1" in out and "sampleable transitions" in out and "zstd-3 + crc32c" in out


def test_inspect_shows_the_priorities_prioritized_replay_set(filled: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A store sampled with uniform priorities shows none; after ``update_priorities``: their mean,
    min and max over the sampleable transitions, and how many hold the max."""
    assert main(["inspect", str(filled), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["priorities"] is None
    with ReplayStore.open(filled, mode="a") as store:
        batch = store.sample(8, prioritized=True, rng=np.random.default_rng(0))
        index = np.unique(batch.index)
        store.update_priorities(index, np.linspace(0.5, 3.0, index.size))
        n = len(store)
        store.flush()
    assert main(["inspect", str(filled), "--json"]) == 0
    pr = json.loads(capsys.readouterr().out)["priorities"]
    assert pr["min"] == 0.5 and pr["max"] == 3.0 and pr["transitions"] == n
    assert pr["at_max"] == 1  # (the others keep the initial 1.0, below the max)
    assert pr["mean"] == pytest.approx((np.linspace(0.5, 3.0, index.size).sum() + n - index.size) / n)
    assert main(["inspect", str(filled)]) == 0
    assert f"priorities        mean {pr['mean']:.4g}  min 0.5  max 3  (1 of {n} transitions at the max" in \
        capsys.readouterr().out


def test_verify_clean(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(filled), "--quiet"]) == 0
    assert "OK" in capsys.readouterr().out


def test_corruption_is_named_by_verify_and_sample(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flip_byte_in_chunk(filled, shard=1, chunk=2, chunks_per_shard=4)
    assert main(["verify", str(filled), "--quiet"]) == 2
    out = capsys.readouterr().out
    assert "DAMAGED obs shard 1 chunk 2 slots 24..27" in out and "1 problem(s)" in out
    store = ReplayStore.open(filled)
    with pytest.raises(ChunkChecksumError, match="chunk 2 of shard 1 of 'obs'"):
        for seed in range(200):
            store.sample(16, rng=np.random.default_rng(seed))


def test_errors_are_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "replaystore.cli", "inspect", str(tmp_path / "missing.zarr")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1


def test_help_and_no_tensorflow() -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys; from replaystore.cli import main; "
                           "import replaystore.cli.summary, replaystore.cli.verify, replaystore.cli.episodes; "
                           "print('tensorflow' in sys.modules)"],
                          capture_output=True, text=True)
    assert proc.stdout.strip() == "False"
    for argv in (["--help"], ["inspect", "--help"], ["verify", "--help"], ["compact", "--help"], ["episodes", "--help"],
                 ["merge", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0


def test_inspect_plot_draws_returns_and_stacks(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "store.png"
    assert main(["inspect", str(filled), "--plot", str(out)]) == 0
    assert f"plot              {out}" in capsys.readouterr().out
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width > 500 and height > 500
    assert main(["inspect", str(filled), "--plot", str(tmp_path / "no_such_dir" / "x.png")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def _edit_group(path: Path, edit) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    edit(doc)
    (path / "zarr.json").write_text(json.dumps(doc))


HOSTILE = {
    "group-truncated": lambda p: (p / "zarr.json").write_bytes((p / "zarr.json").read_bytes()[:40]),
    "group-not-an-object": lambda p: (p / "zarr.json").write_text("[1, 2, 3]"),
    "version-unknown": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"].__setitem__("format_version", 7)),
    "added-float": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["state"].__setitem__("added", 1.5)),
    "oldest-past-added": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["state"].__setitem__("oldest", 10**6)),
    "frame-stack-absurd": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["schema"].__setitem__("frame_stack", 10**12)),
    "dtype-unknown": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["schema"]["observation_space"].__setitem__("dtype", "complex512")),
    "actions-zero": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["schema"]["action_space"].__setitem__("n", 0)),
    "actions-box-huge": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["schema"].__setitem__(
        "action_space", {"type": "Box", "shape": [5000], "dtype": "float32", "low": -1, "high": 1})),
    "actions-box-no-dtype": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["schema"].__setitem__(
        "action_space", {"type": "Box", "shape": [2]})),
    "actions-box-unlike-array": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"]["schema"].__setitem__(
        "action_space", {"type": "Box", "shape": [2], "dtype": "float32", "low": -1, "high": 1})),
    "schema-a-string": lambda p: _edit_group(p, lambda d: d["attributes"]["replaystore"].__setitem__("schema", "x")),
    "array-meta-truncated": lambda p: (p / "obs" / "zarr.json").write_text("{"),
    "array-meta-wrong-shape": lambda p: _edit_group(p / "obs", lambda d: d.__setitem__("shape", [5])),
    "shard-truncated": lambda p: (p / "obs/c/1/0/0").write_bytes((p / "obs/c/1/0/0").read_bytes()[:10]),
    "shard-garbage": lambda p: (p / "reward/c/0").write_bytes(b"\xff" * 5000),
    "shard-a-directory": lambda p: ((p / "action/c/1").unlink(), (p / "action/c/1").mkdir()),
}


@pytest.mark.parametrize("damage", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_files_get_one_line_errors_from_every_command(filled: Path, damage, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    damage(filled)
    capsys.readouterr()
    saved = tmp_path / "ep.npz"
    for argv in (["inspect", str(filled)], ["inspect", str(filled), "--json"], ["verify", str(filled), "--quiet"],
                 ["compact", str(filled), str(tmp_path / "out.zarr"), "--quiet"], ["episodes", str(filled), "--all"],
                 ["episodes", str(filled), "--save", "0", str(saved)]):
        status = main(argv)  # never an exception from deep inside numpy or zarr
        out, err = capsys.readouterr()
        if argv[0] == "verify" and status == 2:
            assert "DAMAGED" in out
        elif argv[0] in ("inspect", "episodes") and status == 0:
            continue  # inspect reads no frames (nor the listing), and episode 0 may not touch the damage
        else:
            assert status == 1, (argv, out, err)
            assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "out.zarr").exists()
    assert saved.exists() == (status == 0) and not list(tmp_path.glob(".ep.npz*"))


@pytest.mark.parametrize("libzstd", [True, False], ids=["libzstd", "zstandard"])
def test_a_chunk_that_passes_its_checksum_but_does_not_decode_is_named(filled: Path, libzstd: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes that are not a zstd frame, with a valid crc32c: either decoder path names the chunk."""
    from replaystore.format.shards import encode_shard
    from replaystore.storage import decoders

    if libzstd and decoders.LIBZSTD is None:
        pytest.skip("this machine has no libzstd shared library; the zstandard path is tested")
    if not libzstd:
        monkeypatch.setattr(decoders, "LIBZSTD", None)

    store = ReplayStore.open(filled)
    shard_len, chunk_len = store.layout.shard_len, store.layout.obs_chunk_len
    store.close()

    class NotZstd:  # a codec that writes garbage payloads (encode_shard adds the crc32c)
        @staticmethod
        def encode(data: np.ndarray) -> bytes:
            return b"\x00garbage" * 5

    f = filled / "obs" / "c" / "1" / "0" / "0"
    f.write_bytes(encode_shard(np.zeros((shard_len, 3, 4), np.uint8), chunk_len=chunk_len, rows=shard_len, codec=NotZstd))
    store = ReplayStore.open(filled)
    with pytest.raises(ChunkChecksumError, match="of shard 1 of 'obs' passed its checksum but does not decompress"):
        for seed in range(200):
            store.sample(16, rng=np.random.default_rng(seed))


def test_episodes_listed_and_saved(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The listing names every live episode (the oldest partly overwritten, the newest in progress);
    --save writes one whole as .npz, the same arrays ``ReplayStore.episode`` reads, and replaces a
    file already there without leaving a temporary beside it."""
    before = snapshot(filled)
    assert main(["episodes", str(filled), "--all", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    rows = listing["episodes"]
    with ReplayStore.open(filled) as store:
        assert listing["live_episodes"] == len(rows) == store.episode(-1).index + 1
        for row in rows:
            ep = store.episode(row["index"])
            assert (row["first_step"], row["moves"], row["ended"], row["from_start"]) == (
                ep.first_step, len(ep), ep.ended, ep.from_start)
            assert row["return"] == pytest.approx(ep.episode_return)
    assert not rows[0]["from_start"] and rows[-1]["ended"] == "in progress"  # fill(): 100 moves into 64 slots
    assert {r["ended"] for r in rows[1:-1]} == {"terminated", "truncated"} and {r["moves"] for r in rows[1:-1]} == {9}
    assert main(["episodes", str(filled)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{len(rows)} live episodes in the store") and "in progress" in text
    assert "its start was overwritten" in text

    out = tmp_path / "ep.npz"
    out.write_bytes(b"an older file")
    assert main(["episodes", str(filled), "--save", "-2", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"episode {len(rows) - 2} of stream 0: 9 moves")
    saved = np.load(out)
    with ReplayStore.open(filled) as store:
        ep = store.episode(-2)
    for name in ("obs", "action", "reward", "terminated", "truncated"):
        np.testing.assert_array_equal(saved[name], getattr(ep, name))
    assert saved["obs"].shape == (10, 3, 4) and str(saved["ended"]) == ep.ended
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep.npz", "replay.zarr"]
    assert snapshot(filled) == before


@pytest.mark.parametrize(("argv", "message"), [
    (["--save", "0", "{out}/x.mp4", "--fps", "inf"], "--fps is inf; give frames per second above 0 and at most 1000"),
    (["--save", "0", "{out}/x.gif", "--fps", "nan"], "--fps is nan"),
    (["--save", "0", "{out}/x.gif", "--fps", "0"], "--fps is 0.0"),
    (["--save", "0", "{out}/nodir/x.npz"], "the folder {out}/nodir does not exist; make it first"),
], ids=["fps-inf", "fps-nan", "fps-0", "no-folder"])
def test_a_bad_save_is_one_line_and_writes_nothing(filled: Path, tmp_path: Path, argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An infinite --fps used to spin forever in OpenCV; a missing folder was named by a temporary file."""
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(filled)
    assert main(["episodes", str(filled), *(a.format(out=out) for a in argv)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message.format(out=out) in err and err.count("\n") == 1, err
    assert list(out.iterdir()) == [] and snapshot(filled) == before


def test_moves_counted_from_the_end_as_documented(filled: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``--moves -5:`` as docs/cli.md writes it (argparse took the value for a flag)."""
    assert main(["episodes", str(filled), "--save", "-2", str(tmp_path / "ep.npz"), "--moves", "-5:"]) == 0
    assert "5 moves" in capsys.readouterr().out
    assert np.load(tmp_path / "ep.npz")["action"].shape == (5,)


def test_episode_saved_as_gif(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Image frames (Atari's 84x84) become an animation of every observation; vector observations
    are refused before anything is written, as are a file inside the store and an unknown suffix."""
    from PIL import Image

    store = make_store(tmp_path / "img.zarr", capacity=64, shape=(84, 84))
    for i in range(30):  # episodes of 12, then 13 moves; every frame its own
        store.add(frame(i, (84, 84)), i % 5, 1.0, frame(i + 1, (84, 84)), i % 13 == 11, False)
    ep = store.episode(1)
    store.close()
    out = tmp_path / "ep.gif"
    assert main(["episodes", str(tmp_path / "img.zarr"), "--save", "1", str(out), "--fps", "10"]) == 0
    with Image.open(out) as gif:
        assert gif.n_frames == len(ep) + 1 == 14 and gif.size == (84, 84)
        for i in (0, 7, 12):
            gif.seek(i)
            np.testing.assert_array_equal(np.asarray(gif.convert("L")), ep.obs[i])

    vector = make_store(tmp_path / "vec.zarr", shape=(4,))
    for i in range(20):
        vector.add(frame(i, (4,)), 0, 0.0, frame(i + 1, (4,)), i % 6 == 4, False)
    vector.close()
    before = snapshot(tmp_path / "vec.zarr")
    for argv, message in (
        (["--save", "0", str(tmp_path / "v.gif")], "not an image"),
        (["--save", "0", str(tmp_path / "vec.zarr" / "inside.npz")], "inside the store"),
        (["--save", "0", str(tmp_path / "v.avi")], "name the file .npz (every array), .mp4 or .gif"),
        (["--save", "0", str(tmp_path / "v.mp4")], "not an image"),
        (["--save", "0", str(tmp_path / "missing" / "v.mp4")], "the folder"),
        (["--save", "7", str(tmp_path / "v.npz")], "holds 4 live episodes"),
        (["--stream", "2"], "has 1 stream"),
    ):
        assert main(["episodes", str(tmp_path / "vec.zarr"), *argv]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert snapshot(tmp_path / "vec.zarr") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep.gif", "img.zarr", "vec.zarr"]


def test_episode_saved_as_mp4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--save INDEX FILE.mp4``: every observation a frame of an MPEG-4 video at ``--fps``, gray
    frames as they are and colour ones in colour (the codec is lossy: close, not equal); a frame with
    an odd side is padded to even ones; an older file of the name is replaced only when the new one
    is whole, and nothing is left beside it."""
    import cv2

    def decoded(path: Path) -> tuple[list[np.ndarray], float]:
        capture, frames = cv2.VideoCapture(str(path)), []
        while True:
            ok, image = capture.read()
            if not ok:
                return frames, capture.get(cv2.CAP_PROP_FPS)
            frames.append(image)

    def picture(shape: tuple[int, ...], i: int) -> np.ndarray:  # a bright square moving over a dark ground
        out = np.full(shape, 40, np.uint8)
        y, x = 2 * i % (shape[0] - 8), 3 * i % (shape[1] - 8)
        out[y:y + 8, x:x + 8] = 220 if len(shape) == 2 else (220, 60, 30)
        return out

    for shape, name in (((84, 84), "gray"), ((45, 33, 3), "colour")):
        pictures = [picture(shape, i) for i in range(21)]
        store = make_store(tmp_path / f"{name}.zarr", capacity=64, shape=shape)
        for i in range(20):  # one episode of 20 moves
            store.add(pictures[i], 0, 1.0, pictures[i + 1], i == 19, False)
        store.close()
        out = tmp_path / f"{name}.mp4"
        out.write_bytes(b"an older file")
        assert main(["episodes", str(tmp_path / f"{name}.zarr"), "--save", "0", str(out), "--fps", "10"]) == 0
        assert capsys.readouterr().out.strip().endswith(f"20 moves, return 20, terminated -> {out}")
        frames, fps = decoded(out)
        assert len(frames) == 21 and fps == 10
        even = (shape[0] + shape[0] % 2, shape[1] + shape[1] % 2)
        assert frames[0].shape == (*even, 3)
        for i in (0, 10, 20):
            shown = frames[i][:shape[0], :shape[1]]
            shown = shown[..., 0] if len(shape) == 2 else shown[..., ::-1]  # (gray comes back as 3 equal channels; BGR)
            assert np.abs(shown.astype(int) - pictures[i]).mean() < 8, (name, i)
            centre = shown[2 * i % (shape[0] - 8) + 4, 3 * i % (shape[1] - 8) + 4].astype(int)
            assert np.abs(centre - pictures[i][2 * i % (shape[0] - 8) + 4, 3 * i % (shape[1] - 8) + 4]).max() < 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["colour.mp4", "colour.zarr", "gray.mp4", "gray.zarr"]


def test_an_episode_too_large_for_memory_is_refused_and_read_in_parts(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A task that never ends makes one episode of the whole ring: reading it at once is refused
    (not killed by the OOM killer) where its frames would take more than half of what the process
    may use, here ``memory_budget``; ``moves=`` and ``--moves A:B`` read and save a part."""
    path = tmp_path / "long.zarr"
    store = make_store(path, capacity=4096, shape=(84, 84), shard_len=256, chunk_len=8)
    for i in range(4000):  # one episode, never ended
        store.add(frame(i, (84, 84)), i % 5, float(i % 3), frame(i + 1, (84, 84)), False, False)
    store.close()
    with ReplayStore.open(path, cache_bytes=0) as probe:
        budget = sum(probe.memory_estimate().values()) + (4 << 20)  # what the store needs, and 4 MB
    with ReplayStore.open(path, cache_bytes=0, memory_budget=budget) as store:
        with pytest.raises(SampleError, match=r"episode 0 \(4,000 moves, all of it\) would take 27 MB of frames in RAM"
                                              r" at once, more than half .*moves=slice\(A, B\)"):
            store.episode(0)
        with pytest.raises(SampleError, match="would take 27 MB"):
            next(store.iter_episodes())
        part = store.episode(0, moves=slice(1000, 1500))
        assert len(part) == 500 and part.obs.shape == (501, 84, 84) and part.first_move == 1000
        assert part.ended == "in progress" and part.from_start
        np.testing.assert_array_equal(part.obs[[0, 500]], [frame(1000, (84, 84)), frame(1500, (84, 84))])
        np.testing.assert_array_equal(part.action, np.arange(1000, 1500) % 5)
        tail = store.episode(0, moves=slice(-10, None))
        assert tail.first_move == 3990 and len(tail) == 10 and tail.first_step == part.first_step + 2990
        for bad in (slice(0, 10, 2), slice("a", None)):
            with pytest.raises(SampleError, match="moves is slice"):
                store.episode(0, moves=bad)
    out = tmp_path / "part.npz"
    assert main(["episodes", str(path), "--save", "0", str(out), "--moves", "3990:"]) == 0
    assert "episode 0 of stream 0 (moves 3,990..3,999): 10 moves" in capsys.readouterr().out
    with np.load(out) as saved:
        assert saved["obs"].shape == (11, 84, 84) and saved["action"].tolist() == [i % 5 for i in range(3990, 4000)]
    for argv, message in ((["--save", "0", str(out), "--moves", "x"], "--moves is 'x'; give A:B"),
                          (["--moves", "0:5"], "--moves picks the moves that --save writes")):
        assert main(["episodes", str(path), *argv]) == 1
        assert message in capsys.readouterr().err
