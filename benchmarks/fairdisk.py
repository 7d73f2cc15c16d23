"""A fair ground for mmap comparisons: the model file on a loop-mounted ext4 image whose loop device
reads its backing file with direct I/O (the host page cache never holds a second copy) and whose
read-ahead is a typical NVMe's 128 KiB. This VM's own disk reads 8 MiB around every mmap page fault
(vda's read_ahead_kb is 8192), which flatters llama.cpp's mmap several-fold out of core.

    python benchmarks/fairdisk.py mount [--dir D] [--image I] [--size 24G] [--read-ahead-kb 128]
    python benchmarks/fairdisk.py status [--dir D] [--json]
    python benchmarks/fairdisk.py place MODEL.gguf [--dir D]         # mounts first if needed; prints the path
    python benchmarks/fairdisk.py bandwidth [FILE] [--sizes 4K 128K 1M 3M] [--readers 1 4] [--seconds 2] [--json]
        [--busy 0 2]                  # ... also while 2 threads compute, as a decode's do beside its reads
    python benchmarks/fairdisk.py umount [--dir D]                    # unmount and detach the loop device

From a benchmark (tears down on exit, on error too, only what it set up itself):

    with fair_disk(size=need) as d:
        path = d.place(model)                 # a copy on the mount, reused while size and mtime match
        bw = d.bandwidth(path, 884736, readers=4)

The image (sparse: the host disk holds only what is written; mounted with `discard`, so deleted files
give their blocks back) defaults to /var/tmp/ramforge-fairdisk.img, mounted at /var/tmp/ramforge-fairdisk
($RAMFORGE_FAIR_DISK moves both). It grows (offline: e2fsck, resize2fs) when a file does not fit. Needs root,
losetup, mkfs.ext4, mount, e2fsck and resize2fs. evict / fincore are ramforge.stream.io's evict and
page_cache_residency (posix_fadvise DONTNEED; mincore).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numba import njit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from ramforge.stream.io import DIRECT_ALIGN, aligned_empty, evict  # noqa: E402,F401  (evict: re-exported)
from ramforge.stream.io import page_cache_residency as fincore  # noqa: E402  (resident bytes, file bytes)

DEFAULT_MOUNT = Path(os.environ.get("RAMFORGE_FAIR_DISK", "/var/tmp/ramforge-fairdisk"))
READ_AHEAD_KB = 128           # a typical NVMe's (and most distributions') default
DEFAULT_SIZE = 4 << 30        # a new image's size when the caller names none (sparse)
TOOLS = ("losetup", "mkfs.ext4", "mount", "umount", "e2fsck", "resize2fs")


def margin(nbytes: int) -> int:
    """Room left beside a file of nbytes on the image (ext4's metadata, a scratch file): 3 % + 64 MiB."""
    return nbytes * 3 // 100 + (64 << 20)


class FairDiskError(RuntimeError):
    """The fair disk cannot be set up or used as asked; the message says why and what to do."""


def unavailable() -> str | None:
    """Why a fair disk cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (losetup and mount)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH (util-linux, e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "no loop device support (/dev/loop-control is missing)"
    return None


def parse_size(s: str) -> int:
    """'4K', '864K', '1.5M', '24G' (powers of 1024) or bytes."""
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise ValueError(f"size {s!r}: expected bytes or a number with K, M, G or T") from None


def _run(*cmd: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise FairDiskError(f"`{' '.join(cmd)}` failed (exit {r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def loop_devices(image: Path) -> list[str]:
    """Loop devices backed by image (`losetup -j`)."""
    if not image.exists():
        return []
    out = _run("losetup", "-j", str(image), "-J", "-O", "NAME")
    return [d["name"] for d in json.loads(out)["loopdevices"]] if out.strip() else []


def mounted_source(mount: Path) -> str | None:
    """The device mounted at mount, if any (/proc/self/mounts)."""
    target = str(mount.resolve())
    for line in Path("/proc/self/mounts").read_text().splitlines():
        src, mnt = line.split()[:2]
        if mnt.replace("\\040", " ") == target:
            return src
    return None


def _sys(dev: str, rel: str) -> Path:
    return Path("/sys/block") / Path(dev).name / rel


def direct_io(dev: str) -> bool | None:
    """Whether loop device dev reads its backing file with O_DIRECT."""
    try:
        return _sys(dev, "loop/dio").read_text().strip() == "1"
    except OSError:
        return None


def _sys_block(path: str | os.PathLike) -> Path:
    """/sys's directory of the block device (or partition) holding path."""
    dev = os.stat(path).st_dev
    return Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")


def read_ahead_kb(path: str | os.PathLike) -> int | None:
    """The read-ahead window of the block device holding path (an mmap fault reads around this much)."""
    d = _sys_block(path)
    for q in (d / "queue" / "read_ahead_kb", d / ".." / "queue" / "read_ahead_kb"):
        try:
            return int(q.read_text())
        except OSError:
            continue
    return None


def device_reads(path: str | os.PathLike) -> tuple[int, float] | None:
    """(bytes read, seconds with I/O in flight) so far by the block device holding path, from its
    /sys/.../stat (sectors read, io_ticks); None where the kernel gives none. The difference over a window
    is how long the device was busy in it: reads known one at a time leave it idle between them."""
    try:
        f = (_sys_block(path) / "stat").read_text().split()
        return int(f[2]) * 512, int(f[9]) / 1000.0
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class DiskStatus:
    mount: str
    image: str
    device: str | None          # the loop device backed by the image
    mounted: bool               # the device is mounted at mount
    direct_io: bool | None      # the loop device reads its backing file with O_DIRECT
    read_ahead_kb: int | None
    fs_bytes: int | None        # the file system's size and free bytes
    free_bytes: int | None
    image_bytes: int | None     # the image's apparent size and what the host disk holds of it
    image_on_disk: int | None

    def describe(self) -> str:
        if not self.device:
            return f"{self.image}: not attached (mount point {self.mount})"
        gib = lambda x: "-" if x is None else f"{x / 2**30:.2f} GiB"
        return (f"{self.device} <- {self.image} (direct I/O {'on' if self.direct_io else 'OFF'}), read_ahead_kb "
                f"{self.read_ahead_kb}, " + (f"mounted at {self.mount}, {gib(self.free_bytes)} free of "
                                             f"{gib(self.fs_bytes)}" if self.mounted else f"not mounted at {self.mount}")
                + f"; image {gib(self.image_bytes)} apparent, {gib(self.image_on_disk)} on the host disk")


@dataclass(frozen=True)
class Bandwidth:
    """O_DIRECT reads of read_bytes at random aligned offsets by `readers` concurrent threads."""
    path: str
    read_bytes: int
    readers: int
    reads: int
    seconds: float
    bytes_per_s: float
    p50_ms: float
    p99_ms: float
    busy: int = 0             # threads computing meanwhile (_spin)

    def describe(self) -> str:
        beside = f", {self.busy} threads computing" if self.busy else ""
        return (f"{self.read_bytes / 1024:8.0f} KiB x {self.readers} readers{beside}: {self.bytes_per_s / 1e9:6.3f} GB/s "
                f"({self.reads / self.seconds:7.0f} reads/s; latency p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms)")


@njit(nogil=True, cache=True)
def _spin(a):
    # keep a core busy on a (f32, 64 MiB: past the caches, as a layer's weights), the GIL let go: a decode's
    # compute thread, as far as a read's CPU share is concerned
    s = np.float32(0)
    for i in range(a.size):
        s = s * np.float32(0.999) + a[i]
    return s


def measure_bandwidth(path: str | os.PathLike, read_bytes: int, readers: int = 1, seconds: float = 2.0,
                      seed: int = 0, busy: int = 0) -> Bandwidth:
    """O_DIRECT random reads of read_bytes (rounded up to whole 4 KiB blocks) from path for `seconds`, by
    `readers` threads (each preadv releases the GIL), after a 0.2 s warm-up: total bytes / wall time. busy:
    that many more threads compute meanwhile (_spin, the GIL let go): a read needs CPU too (its syscall, the
    loop device's worker, the completion), which a decode's compute threads contend for."""
    size = os.path.getsize(path)
    rb = -(-read_bytes // DIRECT_ALIGN) * DIRECT_ALIGN
    if rb > size:
        raise FairDiskError(f"{path}: {size:,} B is smaller than one read of {rb:,} B")
    slots = (size - rb) // DIRECT_ALIGN + 1
    lat: list[list[float]] = [[] for _ in range(readers)]
    start, errors = threading.Barrier(readers + 1), []
    window = {}

    def worker(i: int) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            buf, rng = aligned_empty(rb), np.random.default_rng(seed + i)
            offs = rng.integers(0, slots, 1 << 16) * DIRECT_ALIGN
            start.wait()
            k = 0
            while True:
                t = time.perf_counter()
                if t >= window["end"]:
                    break
                got = os.preadv(fd, [buf], int(offs[k & 0xFFFF]))
                k += 1
                if got != rb:
                    raise FairDiskError(f"{path}: short O_DIRECT read ({got} of {rb} B)")
                if t >= window["begin"]:
                    lat[i].append(time.perf_counter() - t)
        except BaseException as ex:            # reported by the caller's thread
            errors.append(ex)
            with contextlib.suppress(threading.BrokenBarrierError):
                start.abort()
        finally:
            os.close(fd)

    def spinner() -> None:
        a = np.ones(16 << 20, np.float32)
        while time.perf_counter() < window.get("end", float("inf")):
            _spin(a)

    if busy:
        _spin(np.ones(16, np.float32))                        # compiled before the window
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(readers)]
    spinners = [threading.Thread(target=spinner, daemon=True) for _ in range(busy)]
    for t in spinners + threads:
        t.start()
    now = time.perf_counter()
    window.update(begin=now + 0.2, end=now + 0.2 + seconds)
    with contextlib.suppress(threading.BrokenBarrierError):
        start.wait()
    for t in threads + spinners:
        t.join()
    if errors:
        raise errors[0]
    every = np.concatenate([np.asarray(x) for x in lat]) if any(lat) else np.zeros(1)
    reads = sum(len(x) for x in lat)
    return Bandwidth(str(path), rb, readers, reads, seconds, reads * rb / seconds,
                     float(np.percentile(every, 50) * 1e3), float(np.percentile(every, 99) * 1e3), busy)


class FairDisk:
    """One image, its loop device and its mount. up() sets up what is missing and remembers what it
    set up; down() undoes only that (another process's mount of the same image stays)."""

    def __init__(self, mount: str | os.PathLike | None = None, image: str | os.PathLike | None = None,
                 read_ahead_kb: int = READ_AHEAD_KB):
        self.mount = Path(mount or DEFAULT_MOUNT).absolute()
        self.image = Path(image).absolute() if image else self.mount.with_name(self.mount.name + ".img")
        if read_ahead_kb < 4:
            raise FairDiskError(f"read_ahead_kb {read_ahead_kb}: must be at least 4 (one page)")
        self.read_ahead_kb = read_ahead_kb
        self.device: str | None = None
        self._attached = self._mounted = False

    # ---- set up and tear down ----------------------------------------------------------------
    def up(self, size: int | None = None) -> "FairDisk":
        """Create (size bytes, sparse) or grow to size, attach (direct I/O), set read-ahead, mount."""
        why = unavailable()
        if why:
            raise FairDiskError(f"no fair disk: it {why}")
        try:
            if not self.image.exists():
                self._create(size or DEFAULT_SIZE)
            elif size and os.path.getsize(self.image) < size and not loop_devices(self.image):
                self._grow(size)             # (one in use grows in place() when a file does not fit)
            self._attach()
            self._mount()
        except BaseException:
            self.down()
            raise
        return self

    def _create(self, size: int) -> None:
        self.image.parent.mkdir(parents=True, exist_ok=True)
        with open(self.image, "xb") as f:
            f.truncate(size)
        # few inodes (model files are large); inode tables and journal written now, so no kernel thread
        # writes them in the background during a measurement
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-T", "largefile", "-L", "ramforge-fair",
             "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", str(self.image))

    def _attach(self) -> None:
        devs = loop_devices(self.image)
        if devs:
            self.device = devs[0]
        else:
            self.device = _run("losetup", "--find", "--show", "--direct-io=on", str(self.image)).strip()
            self._attached = True
        if not direct_io(self.device):
            _run("losetup", "--direct-io=on", self.device)
            if not direct_io(self.device):
                raise FairDiskError(f"{self.device}: the kernel kept direct I/O off for {self.image} (the host "
                                    "file system must support O_DIRECT, e.g. ext4 or xfs, not tmpfs)")
        ra = _sys(self.device, "queue/read_ahead_kb")
        ra.write_text(str(self.read_ahead_kb))
        if int(ra.read_text()) != self.read_ahead_kb:
            raise FairDiskError(f"{ra}: asked {self.read_ahead_kb}, the kernel kept {ra.read_text().strip()}")

    def _mount(self) -> None:
        src = mounted_source(self.mount)
        if src is not None:
            if os.path.realpath(src) != os.path.realpath(self.device):
                raise FairDiskError(f"{self.mount} already has {src} mounted, not {self.image}'s {self.device}: "
                                    "pick another --dir")
            return
        self.mount.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "ext4", "-o", "noatime,discard", self.device, str(self.mount))
        self._mounted = True

    def down(self) -> None:
        """Unmount and detach what up() set up. A mount still in use (a child process reading the model) is
        unmounted lazily and its loop device set to detach itself: both go when the last user exits."""
        if self._mounted:
            try:
                _run("umount", str(self.mount))
            except FairDiskError as ex:
                _run("umount", "-l", str(self.mount))
                print(f"warning: {ex}; unmounted lazily: the file system and {self.device} go when the last "
                      "process using them exits", file=sys.stderr)
            self._mounted = False
        if self._attached and self.device:
            with contextlib.suppress(FairDiskError):
                _run("losetup", "-d", self.device)
            self._attached = False

    def teardown(self) -> None:
        """Unmount whatever of this image is mounted at self.mount and detach every loop device of the image."""
        devs = loop_devices(self.image)
        src = mounted_source(self.mount)
        if src is not None and os.path.realpath(src) in {os.path.realpath(d) for d in devs}:
            _run("umount", str(self.mount))
        for d in devs:
            _run("losetup", "-d", d)

    def _grow(self, size: int) -> None:
        """Grow the unattached image to size (rounded up to 1 MiB): truncate, e2fsck, resize2fs. Offline: an
        online resize needs CAP_SYS_RESOURCE, which a container's root may lack."""
        size = -(-size // (1 << 20)) << 20
        host = shutil.disk_usage(self.image.parent).free
        if host < size - os.stat(self.image).st_blocks * 512:
            print(f"warning: {self.image} may grow to {size / 2**30:.1f} GiB; the host disk has "
                  f"{host / 2**30:.1f} GiB free", file=sys.stderr)
        with open(self.image, "r+b") as f:
            f.truncate(size)
        r = subprocess.run(["e2fsck", "-f", "-p", str(self.image)], capture_output=True, text=True)
        if r.returncode not in (0, 1):                       # 1: errors corrected
            raise FairDiskError(f"`e2fsck -f -p {self.image}` failed (exit {r.returncode}): {r.stderr.strip()}")
        _run("resize2fs", str(self.image))

    # ---- use ---------------------------------------------------------------------------------
    def fs_bytes(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_blocks * st.f_frsize

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.mount).free

    def place(self, src: str | os.PathLike, name: str | None = None) -> Path:
        """A copy of src on the mount (kept while its size and mtime match src's), both evicted from the page cache."""
        if mounted_source(self.mount) is None:
            raise FairDiskError(f"{self.mount} is not mounted: call up() (or `fairdisk.py mount`) first")
        src = Path(src)
        st = src.stat()
        dst = self.mount / (name or src.name)
        if dst.exists() and (dst.stat().st_size, dst.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns):
            evict(dst)
            return dst
        dst.unlink(missing_ok=True)                     # a stale copy
        have, host = self.free_bytes(), shutil.disk_usage(self.image.parent).free
        if host < st.st_size + (256 << 20):
            raise FairDiskError(f"placing {src.name} ({st.st_size / 2**30:.2f} GiB) needs that much of the host "
                                f"disk under {self.image.parent}, which has {host / 2**30:.2f} GiB free")
        if have < st.st_size + margin(st.st_size):     # grown offline, then attached and mounted again
            ours = self._attached, self._mounted
            try:
                self.teardown()
            except FairDiskError as ex:
                raise FairDiskError(f"{self.mount} has {have / 2**30:.2f} GiB for {src.name} "
                                    f"({st.st_size / 2**30:.2f} GiB) and cannot be unmounted to grow: {ex}") from None
            self._attached = self._mounted = False
            self._grow(os.path.getsize(self.image) + st.st_size - have + 2 * margin(st.st_size))
            self._attach()
            self._mount()
            self._attached, self._mounted = ours        # set up by someone else: left mounted, as found
        tmp = dst.with_name(f".{dst.name}.part")
        try:
            shutil.copyfile(src, tmp)
            shutil.copystat(src, tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        evict(src)
        evict(dst)
        return dst

    def scratch(self, nbytes: int = 1 << 30, name: str = "bandwidth.bin") -> Path:
        """A file of random bytes on the mount (made once; nbytes, or what fits) to measure reads on."""
        p = self.mount / name
        if p.exists() and p.stat().st_size == nbytes:
            evict(p)
            return p
        p.unlink(missing_ok=True)
        nbytes = min(nbytes, (self.free_bytes() - (64 << 20)) // (64 << 20) * (64 << 20))
        if nbytes < 64 << 20:
            raise FairDiskError(f"{self.mount}: no room for a 64 MiB scratch file; pass a file to measure")
        tmp, gen = p.with_name(f".{name}.part"), np.random.SFC64(1)
        try:
            with open(tmp, "wb") as f:
                for _ in range(nbytes >> 26):
                    f.write(gen.random_raw(1 << 23).tobytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)
        evict(p)
        return p

    def bandwidth(self, path: str | os.PathLike | None, read_bytes: int, readers: int = 1,
                  seconds: float = 2.0, busy: int = 0) -> Bandwidth:
        return measure_bandwidth(path or self.scratch(), read_bytes, readers, seconds, busy=busy)

    def status(self) -> DiskStatus:
        devs = loop_devices(self.image)
        dev = self.device if self.device in devs else (devs[0] if devs else None)
        mounted = dev is not None and os.path.realpath(mounted_source(self.mount) or "") == os.path.realpath(dev)
        ra = None
        if dev:
            with contextlib.suppress(OSError):
                ra = int(_sys(dev, "queue/read_ahead_kb").read_text())
        img = self.image.stat() if self.image.exists() else None
        return DiskStatus(str(self.mount), str(self.image), dev, mounted, direct_io(dev) if dev else None, ra,
                          self.fs_bytes() if mounted else None, self.free_bytes() if mounted else None,
                          img.st_size if img else None, img.st_blocks * 512 if img else None)


@contextlib.contextmanager
def fair_disk(mount: str | os.PathLike | None = None, image: str | os.PathLike | None = None,
              size: int | None = None, read_ahead_kb: int = READ_AHEAD_KB, keep: bool = False):
    """A mounted FairDisk for the with block; on exit (an error or SIGTERM too) unmounted and detached
    unless keep or it was set up before (then it is left as found)."""
    d = FairDisk(mount, image, read_ahead_kb)
    old = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            raise SystemExit(128 + signum)
        old = signal.signal(signal.SIGTERM, on_term)
    try:
        d.up(size)
        yield d
    finally:
        try:
            if not keep:
                d.down()
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)


# ---- for the benchmarks ----------------------------------------------------------------------

AUTO = "auto"


def add_argument(ap: argparse.ArgumentParser) -> None:
    """--fair-disk [DIR] / --no-fair-disk, default AUTO (on where root and losetup are)."""
    ap.add_argument("--fair-disk", nargs="?", const=str(DEFAULT_MOUNT), default=AUTO, metavar="DIR",
                    help="copy the model onto a loop-mounted ext4 image (direct I/O to its backing file, "
                         f"read-ahead --read-ahead-kb) mounted at DIR (default {DEFAULT_MOUNT}) and run from it; "
                         "on by default where root and losetup are (benchmarks/fairdisk.py)")
    ap.add_argument("--no-fair-disk", dest="fair_disk", action="store_const", const=None,
                    help="run from the model's own disk")
    ap.add_argument("--read-ahead-kb", type=int, default=READ_AHEAD_KB,
                    help=f"the fair disk's read-ahead (default {READ_AHEAD_KB}: a typical NVMe's)")


@contextlib.contextmanager
def for_benchmark(choice: str | None, model: str, ra_kb: int = READ_AHEAD_KB):
    """(the path to run from, the FairDisk or None). choice: AUTO, a mount directory, or None (off); ra_kb: the
    fair disk's read-ahead."""
    if choice is None:
        print(f"fair disk: off (--no-fair-disk); {model}'s device read_ahead_kb is {read_ahead_kb(model)}")
        yield model, None
        return
    why = unavailable()
    if why:
        if choice != AUTO:
            raise SystemExit(f"--fair-disk {choice}: no fair disk: it {why}")
        print(f"fair disk: unavailable (it {why}); running from {model}'s own disk, read_ahead_kb "
              f"{read_ahead_kb(model)}: mmap faults read around that much, which a 128 KiB NVMe would not")
        yield model, None
        return
    size = os.path.getsize(model)
    with fair_disk(None if choice == AUTO else choice, size=size + margin(size), read_ahead_kb=ra_kb) as d:
        t0 = time.perf_counter()
        path = d.place(model)
        print(f"fair disk: {d.status().describe()}; model placed at {path} in {time.perf_counter() - t0:.1f} s")
        yield str(path), d


# ---- CLI -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", help=f"mount point (default {DEFAULT_MOUNT})")
    common.add_argument("--image", help="the image file (default: the mount point's path + .img)")
    common.add_argument("--json", action="store_true", help="print JSON")
    for name, what in (("mount", "create/attach/mount (stays mounted)"), ("status", "what is set up"),
                       ("umount", "unmount and detach"), ("place", "copy a file onto the mount (mounting first)"),
                       ("bandwidth", "O_DIRECT random-read bandwidth on the mount")):
        p = sub.add_parser(name, parents=[common], help=what)
        if name in ("mount", "place", "bandwidth"):
            p.add_argument("--size", type=parse_size, help="file system size, e.g. 24G (created sparse; grown, "
                                                           f"never shrunk; default {DEFAULT_SIZE >> 30}G)")
            p.add_argument("--read-ahead-kb", type=int, default=READ_AHEAD_KB)
        if name == "place":
            p.add_argument("file")
        if name == "bandwidth":
            p.add_argument("file", nargs="?", help="a file on the mount (default: a 1 GiB scratch file there)")
            p.add_argument("--sizes", nargs="+", type=parse_size, default=[4 << 10, 128 << 10, 1 << 20, 3 << 20])
            p.add_argument("--readers", nargs="+", type=int, default=[1, 4])
            p.add_argument("--seconds", type=float, default=2.0)
            p.add_argument("--busy", nargs="+", type=int, default=[0],
                           help="threads computing beside the reads (each count measured in turn; default 0)")
    a = ap.parse_args(argv)
    if a.cmd == "bandwidth" and (min(a.readers) < 1 or a.seconds <= 0 or min(a.sizes) < 1 or min(a.busy) < 0):
        ap.error("--readers, --sizes and --seconds must be positive, --busy not negative")
    try:
        d = FairDisk(a.dir, a.image, getattr(a, "read_ahead_kb", READ_AHEAD_KB))
    except FairDiskError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    out: dict = {}
    try:
        if a.cmd in ("mount", "place", "bandwidth"):
            need = a.size or 0
            if a.cmd == "place":
                need = max(need, os.path.getsize(a.file) + margin(os.path.getsize(a.file)))
            d.up(need or None)
            if a.cmd == "place":
                out["path"] = str(d.place(a.file))
            if a.cmd == "bandwidth":
                f = a.file or d.scratch()
                out["bandwidth"] = [asdict(d.bandwidth(f, s, r, a.seconds, b)) for s in a.sizes for r in a.readers
                                    for b in a.busy]
                d.down()                     # what a measurement set up goes; a mount it found stays
        elif a.cmd == "umount":
            d.teardown()
        out["status"] = asdict(d.status())
    except BaseException as ex:              # an interrupt too: undo only what this command set up
        d.down()
        if not isinstance(ex, (FairDiskError, OSError, ValueError)):
            raise
        print(f"error: {ex}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(DiskStatus(**out["status"]).describe())
    for b in out.get("bandwidth", []):
        print(Bandwidth(**b).describe())
    if "path" in out:
        print(out["path"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
