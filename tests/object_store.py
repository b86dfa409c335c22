"""A local S3-compatible server (moto's standalone server) for tests of object-storage export and
serving; it answers on a port the OS assigns and stops with the fixture."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class LocalS3:
    endpoint: str  # http://127.0.0.1:<port>

    @property
    def storage_options(self) -> dict:
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)

    def triton_url(self, bucket_path: str) -> str:
        """The same place as tritonserver names it: the endpoint inside the s3:// URL."""
        return f"s3://{self.endpoint}/{bucket_path}"


def start_local_s3(log_path: Path, timeout_s: float = 60.0) -> tuple[subprocess.Popen, LocalS3]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = Path(sys.executable).parent / "moto_server"
    # the server writes to its own copy of the file; this process closes its handle at once
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CREDENTIALS},
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            return process, LocalS3(endpoint)
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(
                    f"moto's S3 server did not start on {endpoint}: {log_path.read_text()[-2000:]}"
                ) from None
            time.sleep(0.2)
