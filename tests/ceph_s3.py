"""A real S3-compatible object store for the tests: a one-node Ceph cluster
(one monitor, one memstore OSD, one radosgw) from Debian's packages, started in a
directory of its own on loopback ports and torn down with it.

Why Ceph's radosgw: the object-storage design needs create-only writes
(``If-None-Match: *``), which radosgw enforces atomically in the OSD (checked by
``tests/test_object_store.py``). Garage (the other store the registries
provide) ignores conditional writes on PutObject, which would make every
compare-and-swap succeed. radosgw 16 also refuses ``If-Match`` with a quoted ETag
(the form S3 and RFC 9110 use), which is why the design uses create-only writes
only (docs/storage-format.md, "On object storage").

    python tests/ceph_s3.py DIR      # start one, print its endpoint, stop on Ctrl-C

It is also the object store of the compose profile ``object-store``
(docker/ceph.Dockerfile), started there with ``--bind 0.0.0.0 --port 7480
--bucket datasets --ready FILE`` and the credentials of the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import hmac
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = (
    "ceph-mon",
    "ceph-osd",
    "radosgw",
    "radosgw-admin",
    "ceph",
    "ceph-authtool",
    "monmaptool",
)
ACCESS_KEY = "dataset-rt-test"
SECRET_KEY = "dataset-rt-test-secret"
REGION = "us-east-1"
START_SECONDS = 90.0


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class CephS3:
    """A running one-node Ceph with radosgw; ``environment()`` is what a client needs."""

    root: Path
    #: The address radosgw listens on (0.0.0.0 in a container) and its port (0: any free one).
    bind: str = "127.0.0.1"
    port: int = 0
    #: The one user's keys (the launcher's command line takes them from the environment).
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    endpoint: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway: list[str] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        """The variables object_store's S3 client (and the server) read credentials from."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": REGION,
        }

    def start(self) -> CephS3:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(
                f"Ceph is not installed (missing {', '.join(missing)}); install Debian's "
                "ceph-mon ceph-osd radosgw ceph-common (.ci/run does)"
            )
        root = self.root
        for sub in ("run", "log", "mon.a", "osd.0", "rgw"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        mon_port, rgw_port = free_port(), self.port or free_port()
        fsid = str(uuid.uuid4())
        conf = root / "ceph.conf"
        # No `rgw dns name`: with one, radosgw reads a Host header that differs
        # from it as a bucket name (virtual-host style); without, every request
        # is path-style whatever name clients use (a compose service name, say).
        conf.write_text(
            f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
public addr = 127.0.0.1
ms bind ipv6 = false
mon data avail warn = 1
mon data avail crit = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
auth allow insecure global id reclaim = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = {8 << 30}
osd memory target = {512 << 20}
client mount timeout = 30
rados mon op timeout = 30
run dir = {root}/run
admin socket = {root}/run/$name.asok
log file = {root}/log/$name.log
pid file = {root}/run/$name.pid
mon data = {root}/mon.$id
osd data = {root}/osd.$id
keyring = {root}/keyring
[client.rgw]
rgw frontends = beast endpoint={self.bind}:{rgw_port}
rgw data = {root}/rgw
"""
        )
        c = ["-c", str(conf)]
        keyring = str(root / "keyring")
        run = self._run
        run(
            [
                "ceph-authtool",
                "--create-keyring",
                keyring,
                "--gen-key",
                "-n",
                "mon.",
                "--cap",
                "mon",
                "allow *",
            ]
        )
        for name, caps in (
            ("client.admin", ["mon", "allow *", "osd", "allow *", "mgr", "allow *"]),
            ("client.rgw", ["mon", "allow rw", "osd", "allow rwx"]),
            ("osd.0", ["mon", "allow profile osd", "osd", "allow *"]),
        ):
            args = ["ceph-authtool", keyring, "--gen-key", "-n", name]
            for kind, cap in zip(caps[::2], caps[1::2], strict=True):
                args += ["--cap", kind, cap]
            run(args)
        monmap = str(root / "monmap")
        run(
            [
                "monmaptool",
                "--create",
                "--addv",
                "a",
                f"[v2:127.0.0.1:{mon_port}]",
                "--fsid",
                fsid,
                monmap,
            ]
        )
        run(["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring])
        self._daemon(["ceph-mon", *c, "-f", "-i", "a"])
        osd_uuid = str(uuid.uuid4())
        run(["ceph", *c, "--connect-timeout", "30", "osd", "new", osd_uuid, "0"])
        run(["ceph-osd", *c, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid])
        self._daemon(["ceph-osd", *c, "-f", "-i", "0"])
        self.gateway = ["radosgw", *c, "-f", "-n", "client.rgw"]
        self.endpoint = f"http://127.0.0.1:{rgw_port}"
        self.start_gateway()
        run(
            ["radosgw-admin", *c, "user", "create", "--uid=dataset-rt", "--display-name=dataset-rt",
             f"--access-key={self.access_key}", f"--secret={self.secret_key}"]
        )  # fmt: skip
        return self

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name`` (one signed PUT; an existing bucket of ours is fine)."""
        request = signed_request("PUT", f"{self.endpoint}/{name}", self.access_key, self.secret_key)
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except urllib.error.HTTPError as error:
            if error.code != 409 or b"BucketAlreadyOwnedByYou" not in error.read():
                raise

    def start_gateway(self) -> None:
        """Start radosgw (again) and wait until it answers."""
        self._daemon(self.gateway)
        self._wait_for_gateway()

    def stop_gateway(self) -> None:
        """Kill radosgw (the cluster and its objects stay): the store is unreachable."""
        for process in [p for p in self.processes if p.args == self.gateway]:
            process.kill()
            process.wait(timeout=30)
            self.processes.remove(process)

    @contextlib.contextmanager
    def silenced(self) -> Iterator[None]:
        """Stop radosgw answering without refusing anything (SIGSTOP): connections
        are accepted by the kernel and then nothing comes back, as under a network
        cut. It answers again (SIGCONT) when the block ends."""
        gateways = [p for p in self.processes if p.args == self.gateway]
        for process in gateways:
            process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for process in gateways:
                process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=30)
        self.processes.clear()

    def __enter__(self) -> CephS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(args, capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(
                f"{' '.join(args[:3])} failed ({done.returncode}): "
                f"{done.stderr.decode(errors='replace')[-2000:]}; logs in {self.root / 'log'}"
            )

    def _daemon(self, args: list[str]) -> None:
        # The daemon keeps its own descriptor of the log.
        with open(self.root / "log" / f"{args[0]}.out", "ab") as log:
            self.processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

    def _wait_for_gateway(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    self.stop()
                    name = Path(str(process.args[0])).name  # type: ignore[index]
                    logs = self.root / "log"
                    raise RuntimeError(f"{name} exited ({process.returncode}); logs in {logs}")
            try:
                with urllib.request.urlopen(self.endpoint, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"radosgw did not answer at {self.endpoint} within {START_SECONDS:.0f} s"
        )


def signed_request(
    method: str, url: str, access_key: str, secret_key: str
) -> urllib.request.Request:
    """An S3 request with an empty body, signed with AWS Signature Version 4
    (path-style URL; the only request the launcher makes itself)."""
    parsed = urllib.parse.urlsplit(url)
    now = datetime.datetime.now(datetime.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    empty = hashlib.sha256(b"").hexdigest()
    headers = {"host": parsed.netloc, "x-amz-content-sha256": empty, "x-amz-date": stamp}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [method, parsed.path or "/", parsed.query]
        + [f"{k}:{headers[k]}" for k in sorted(headers)]
        + ["", signed, empty]
    )
    scope = f"{day}/{REGION}/s3/aws4_request"
    text = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{secret_key}".encode()
    for part in (day, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return urllib.request.Request(url, method=method, headers=headers)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a one-node Ceph radosgw in DIR.")
    parser.add_argument("root", nargs="?", default="ceph-s3", help="its directory")
    parser.add_argument("--bind", default="127.0.0.1", help="radosgw's listening address")
    parser.add_argument("--port", type=int, default=0, help="radosgw's port (0: a free one)")
    parser.add_argument("--bucket", action="append", default=[], help="create this bucket")
    parser.add_argument("--ready", type=Path, help="write this file once it serves")
    parser.add_argument(
        "--fresh", action="store_true", help="empty DIR first (the objects are in memory anyway)"
    )
    args = parser.parse_args()
    root = Path(args.root).resolve()
    if args.ready:
        args.ready.unlink(missing_ok=True)
    if args.fresh:
        shutil.rmtree(root, ignore_errors=True)
    keys = {
        "access_key": os.environ.get("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        "secret_key": os.environ.get("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
    }
    with CephS3(root, bind=args.bind, port=args.port, **keys) as ceph:
        for bucket in args.bucket:
            ceph.create_bucket(bucket)
        for key, value in ceph.environment().items():
            # A secret of the caller's own stays out of the output (and logs).
            if key != "AWS_SECRET_ACCESS_KEY" or value == SECRET_KEY:
                print(f"export {key}={value}")
        sys.stdout.flush()
        if args.ready:
            args.ready.write_text(ceph.endpoint + "\n")
        try:
            with contextlib.suppress(KeyboardInterrupt):
                signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
                signal.pause()
        finally:
            if args.ready:
                args.ready.unlink(missing_ok=True)


if __name__ == "__main__":
    os.umask(0o022)
    main()
