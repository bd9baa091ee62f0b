"""vLLM plugin (entry point ``vllm.general_plugins: darl_cpu_inductor_cache``): before a vLLM process on CPU compiles
anything, remove the compiled kernels a killed process left half-written in TorchInductor's cache.

Inductor writes each kernel straight to its final path and trusts any file already there, so one torn file makes
every later vLLM start fail with ``ImportError: .../<key>.main.so: file too short`` (pytorch/pytorch#102539). A file
is torn when it is not a whole ELF file (header missing, or a header table ending past the file's end); one whose
inductor lock another process holds is left alone. `register` does nothing unless ``VERL_PLATFORM=cpu``.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

logger = logging.getLogger(__name__)

SUFFIXES = (".so", ".o")
_ELF_MAGIC = b"\x7fELF"


def is_whole_elf(path: str | os.PathLike) -> bool:
    """True when `path` holds an ELF header and both header tables it points to lie inside the file."""
    with open(path, "rb") as f:
        header = f.read(64)
        size = os.fstat(f.fileno()).st_size
    if len(header) < 52 or header[:4] != _ELF_MAGIC or header[4] not in (1, 2) or header[5] not in (1, 2):
        return False
    endian = "<" if header[5] == 1 else ">"
    if header[4] == 2:  # ELF64: e_phoff, e_shoff at 0x20, 0x28; entry sizes and counts at 0x36..0x3D
        if len(header) < 64:
            return False
        phoff, shoff = struct.unpack_from(endian + "QQ", header, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(endian + "HHHH", header, 0x36)
    else:  # ELF32: e_phoff, e_shoff at 0x1C, 0x20; entry sizes and counts at 0x2A..0x31
        phoff, shoff = struct.unpack_from(endian + "II", header, 0x1C)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(endian + "HHHH", header, 0x2A)
    return phoff + phentsize * phnum <= size and shoff + shentsize * shnum <= size


def remove_torn_binaries(cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Delete the compiled objects and libraries under `cache_dir` that are not whole ELF files; returns their paths.
    A torn-looking file is checked again and removed under inductor's lock for its key (held elsewhere: skipped)."""
    from filelock import FileLock, Timeout  # the lock torch.utils._filelock wraps: same files, same protocol

    if cache_dir is None:  # TorchInductor's, as torch resolves it (TORCHINDUCTOR_CACHE_DIR or /tmp/torchinductor_$USER)
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

        cache_dir = inductor_cache_dir()
    root = Path(cache_dir)
    if not root.is_dir():
        return []
    removed = []
    for sub in root.iterdir():
        if not sub.is_dir() or sub.name == "locks":
            continue
        for path in sub.rglob("*"):
            if path.suffix not in SUFFIXES or not path.is_file() or path.is_symlink():
                continue
            try:
                if is_whole_elf(path):
                    continue  # the common case: no lock taken
            except FileNotFoundError:
                continue
            key = path.name.split(".", 1)[0]
            (root / "locks").mkdir(exist_ok=True)
            try:
                with FileLock(str(root / "locks" / f"{key}.lock"), timeout=0):
                    if path.is_file() and not is_whole_elf(path):
                        path.unlink()
                        removed.append(path)
            except (Timeout, FileNotFoundError):
                continue  # another process is compiling this key right now, or removed the file meanwhile
    if removed:
        logger.warning("darl: removed %d half-written compiled kernel(s) from TorchInductor's cache %s (a killed "
                       "process left them; inductor rebuilds them): %s", len(removed), root,
                       ", ".join(str(p) for p in removed))
    return removed


def register() -> None:
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return
    try:
        remove_torn_binaries()
    except OSError as exc:  # an unreadable cache is inductor's to report when it compiles, not a reason to stop here
        logger.warning("darl: could not check TorchInductor's cache for half-written kernels: %s", exc)
