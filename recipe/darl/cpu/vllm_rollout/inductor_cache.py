"""vLLM plugin ``darl_cpu_inductor_cache``: with ``VERL_PLATFORM=cpu``, before a vLLM process compiles anything,
remove the kernels a killed process left half-written in TorchInductor's cache (docs/cpu.md: inductor trusts any file
at a kernel's path, and a torn one fails every later start with ``file too short``, pytorch/pytorch#102539). Torn:
not a whole ELF file; a file whose inductor lock another process holds is left alone.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

from recipe.darl.cpu import is_requested

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
    # from e_phoff on: e_phoff, e_shoff (4 or 8 bytes), e_flags, e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum,
    # e_shstrndx, to the end of the 52-byte (ELF32) or 64-byte (ELF64) header
    offset, layout = (0x20, "QQIHHHHHH") if header[4] == 2 else (0x1C, "IIIHHHHHH")
    layout = ("<" if header[5] == 1 else ">") + layout
    if len(header) < offset + struct.calcsize(layout):
        return False
    phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _ = struct.unpack_from(layout, header, offset)
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
    if not is_requested():
        return
    try:
        remove_torn_binaries()
    except OSError as exc:  # an unreadable cache is inductor's to report when it compiles, not a reason to stop here
        logger.warning("darl: could not check TorchInductor's cache for half-written kernels: %s", exc)
