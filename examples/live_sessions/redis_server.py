"""A local ``redis-server`` (Debian's package, installed by ``./run setup``) as a child process:
for the example, the benchmark and the tests. It listens on 127.0.0.1 only, on a port the OS
assigned, and on a unix socket; optionally with a password and on a TLS port with a self-signed
certificate made here, offline. ``stop`` / ``start`` restart it on the same addresses with its
data (saved on shutdown); ``pause`` / ``resume`` freeze it (SIGSTOP), as a hung server.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: the command that installs redis-server where it is missing
INSTALL_HINT = (
    "run ./run setup (as root it installs Debian's redis-server), or apt-get install redis-server"
)


@dataclass(frozen=True)
class TlsFiles:
    """A self-signed CA and a server certificate for 127.0.0.1 and localhost signed by it."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def find_redis_server() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if found is None:
        raise FileNotFoundError(f"redis-server is not installed: {INSTALL_HINT}")
    return found


class RedisServer:
    """``redis-server`` with its data and log in ``folder``; a context manager.

    Parameters
    ----------
    folder
        Its working folder: the socket, the log, the saved data, TLS files.
    password
        Required of clients (``requirepass``) when given.
    tls
        Also listen on a TLS port (``tls_url``), with a certificate made in ``folder``.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        password: str | None = None,
        tls: bool = False,
        start_timeout_s: float = 20.0,
    ):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.tls_files = make_tls_files(self.folder / "tls") if tls else None
        self.start_timeout_s = start_timeout_s
        self.socket_path = self.folder / "redis.sock"
        self.log_path = self.folder / "redis.log"
        self.port = 0
        self.tls_port = 0
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def socket_url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    @property
    def tls_url(self) -> str:
        if self.tls_files is None:
            raise ValueError("this server was started without tls=True")
        return f"rediss://localhost:{self.tls_port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> RedisServer:
        """Start it (on the ports it had, when restarted) and return once it answers."""
        if self._process is not None:
            return self
        attempts = 1 if self.port else 5
        for attempt in range(attempts):
            if not (self.port and attempt == 0):
                self.port, self.tls_port = _free_ports(2)
            self._spawn()
            try:
                self._wait_until_ready()
                return self
            except RuntimeError:
                log = self.log_tail()
                self._kill()
                if "Address already in use" not in log or attempt == attempts - 1:
                    raise
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut it down (it saves its data first); killed if it takes longer than ``timeout_s``."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused server must wake up to shut down
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout_s)

    def pause(self) -> None:
        """Freeze it: connections are accepted, nothing answers."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def answers(self) -> bool:
        """Whether it answers PING on its unix socket now."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(str(self.socket_path))
                probe.sendall(b"PING\r\n")
                reply = probe.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _spawn(self) -> None:
        command = [
            find_redis_server(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.folder),
            "--dbfilename", "dump.rdb",
            # saved on shutdown (a save point makes redis-server save when it stops), never else
            "--save", "86400 1",
            "--appendonly", "no",
            "--protected-mode", "yes",
            "--logfile", str(self.log_path),
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password is not None:
            command += ["--requirepass", self.password]
        if self.tls_files is not None:
            command += [
                "--tls-port", str(self.tls_port),
                "--tls-cert-file", str(self.tls_files.cert_file),
                "--tls-key-file", str(self.tls_files.key_file),
                "--tls-ca-cert-file", str(self.tls_files.ca_file),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        self._process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while not self.answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server did not answer on {self.socket_path} within"
                    f" {self.start_timeout_s:g} s; its log ends with:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(probe)
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


def make_tls_files(folder: Path) -> TlsFiles:
    """A CA and a server certificate (127.0.0.1, localhost) signed by it, valid for two days,
    made with ``cryptography``, offline."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "live sessions test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server-key.pem")
    files.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    files.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    files.key_file.chmod(0o600)
    return files
