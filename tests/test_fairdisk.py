"""benchmarks/fairdisk.py, through its CLI (tests never import benchmarks/): a 256 MiB ext4 image on a
loop device with direct I/O and a 128 KiB read-ahead, files placed on it (copied once, grown into,
evicted from the page cache), O_DIRECT read bandwidth, and nothing left attached or mounted after,
on error too. The device tests need root, losetup and mkfs.ext4: marked slow."""
from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ramforge.stream.io import page_cache_residency

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "fairdisk.py"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "e2fsck", "resize2fs"))
    or not Path("/dev/loop-control").exists(), reason="needs root, losetup, mkfs.ext4, e2fsck, resize2fs")


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)
    if check and r.returncode:
        raise AssertionError(f"fairdisk {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def attached(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout.strip()


def mounted(mount: Path) -> bool:
    return any(line.split()[1] == str(mount) for line in Path("/proc/self/mounts").read_text().splitlines())


@pytest.fixture
def disk(tmp_path):
    mount, image = tmp_path / "fair", tmp_path / "fair.img"
    args = ("--dir", str(mount), "--image", str(image))
    yield mount, image, args
    cli("umount", *args, check=False)            # whatever a failed test left
    assert not attached(image) and not mounted(mount)


def _file(path: Path, nbytes: int, seed: int) -> Path:
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    return path


@pytest.mark.slow
@needs_root
def test_mount_place_measure_umount(disk, tmp_path):
    mount, image, args = disk
    st = json.loads(cli("mount", *args, "--size", "256M", "--json").stdout)["status"]
    assert st["mounted"] and st["direct_io"] is True and st["read_ahead_kb"] == 128
    dev = Path(st["device"]).name
    assert Path(f"/sys/block/{dev}/loop/dio").read_text().strip() == "1"
    assert Path(f"/sys/block/{dev}/queue/read_ahead_kb").read_text().strip() == "128"
    assert st["image_bytes"] == 256 << 20 and st["image_on_disk"] < 64 << 20      # sparse
    assert 200 << 20 < st["fs_bytes"] <= 256 << 20

    src = _file(tmp_path / "model.bin", 96 << 20, 1)
    out = json.loads(cli("place", str(src), *args, "--json").stdout)
    placed = Path(out["path"])
    assert page_cache_residency(str(placed))[0] == 0            # evicted after the copy
    with open(placed, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        touched = sum(m[off] for off in range(0, 96 << 20, 8 << 20))          # 12 page faults
    resident = page_cache_residency(str(placed))[0]
    assert 12 * 4096 <= resident <= 12 * 256 << 10, resident   # read around 128 KiB each (the loop's default: 2.5 MiB)
    assert placed.parent == mount and placed.read_bytes() == src.read_bytes() and touched >= 0
    ino = placed.stat().st_ino
    assert Path(json.loads(cli("place", str(src), *args, "--json").stdout)["path"]).stat().st_ino == ino  # reused

    big = _file(tmp_path / "big.bin", 200 << 20, 2)              # does not fit: the image grows offline
    out = json.loads(cli("place", str(big), *args, "--json").stdout)
    assert Path(out["path"]).read_bytes() == big.read_bytes() and placed.read_bytes() == src.read_bytes()
    assert out["status"]["mounted"] and out["status"]["fs_bytes"] > 300 << 20 and out["status"]["direct_io"]
    assert out["status"]["read_ahead_kb"] == 128

    bw = json.loads(cli("bandwidth", str(placed), *args, "--sizes", "4K", "1M", "--readers", "1", "2",
                        "--seconds", "0.3", "--busy", "0", "1", "--json").stdout)
    assert [(b["read_bytes"], b["readers"], b["busy"]) for b in bw["bandwidth"]] == [
        (s, r, b) for s in (4096, 1 << 20) for r in (1, 2) for b in (0, 1)]
    assert all(b["reads"] > 0 and b["bytes_per_s"] > 0 and 0 < b["p50_ms"] <= b["p99_ms"] for b in bw["bandwidth"])
    assert bw["status"]["mounted"]                  # a mount the measurement found stays

    st = json.loads(cli("umount", *args, "--json").stdout)["status"]
    assert st["device"] is None and not st["mounted"]
    assert not attached(image) and not mounted(mount)


@pytest.mark.slow
@needs_root
def test_read_ahead_flag_and_remount_keeps_files(disk, tmp_path):
    mount, image, args = disk
    cli("mount", *args, "--size", "256M")
    src = _file(tmp_path / "m.bin", 8 << 20, 3)
    placed = Path(cli("place", str(src), *args).stdout.split()[-1])
    cli("umount", *args)
    st = json.loads(cli("mount", *args, "--read-ahead-kb", "512", "--json").stdout)["status"]
    assert st["read_ahead_kb"] == 512 and placed.read_bytes() == src.read_bytes()
    _file(src, 8 << 20, 4)                                           # the source changed: copied again
    assert Path(cli("place", str(src), *args).stdout.split()[-1]).read_bytes() == src.read_bytes()


@pytest.mark.slow
@needs_root
def test_an_error_after_mounting_leaves_nothing_attached(disk, tmp_path):
    mount, image, args = disk
    r = cli("place", str(tmp_path), *args, check=False)         # a directory: the copy fails after mounting
    assert r.returncode == 1 and "error:" in r.stderr
    assert image.exists() and not attached(image) and not mounted(mount)


def test_refuses_bad_arguments(tmp_path):
    r = cli("mount", "--dir", str(tmp_path / "m"), "--read-ahead-kb", "2", check=False)
    assert r.returncode == 2 and "at least 4" in r.stderr
    r = cli("bandwidth", "--dir", str(tmp_path / "m"), "--readers", "0", check=False)
    assert r.returncode == 2 and "positive" in r.stderr
    r = cli("mount", "--dir", str(tmp_path / "m"), "--size", "lots", check=False)
    assert r.returncode == 2 and "size" in r.stderr
    assert not (tmp_path / "m.img").exists()
