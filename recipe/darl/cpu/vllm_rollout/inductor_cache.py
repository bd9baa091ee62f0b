"""vLLM plugin (entry point ``vllm.general_plugins: darl_cpu_inductor_cache``, setup.py): before a vLLM process
on CPU compiles anything, remove the compiled kernels that a killed process left half-written in TorchInductor's
cache, so that inductor builds them again.

vLLM on CPU compiles kernels through TorchInductor, which writes each C++ kernel's object or shared library straight
to its final path in the cache (``/tmp/torchinductor_$USER`` or ``TORCHINDUCTOR_CACHE_DIR``) and later trusts any
file already there (``if not os.path.exists(target): build()``, torch 2.13). A process killed while the compiler
writes (a dead rollout server, a preempted job) leaves an empty or truncated file, and from then on every vLLM start
on that machine fails: ``ImportError: .../<key>.main.so: file too short`` (pytorch/pytorch#102539). `tests/vllm/test_dead_server.py`
SIGKILLs a vLLM server during its first compile on a fresh machine, which leaves such a file: without this plugin
every later vLLM start there fails that way.

A file counts as torn when it is not a whole ELF file: its header is missing, or the section or program header
table the header points to ends past the file's end (both tables end a file's layout as compilers write it). A file
whose inductor lock (``locks/<key>.lock``) another process holds is being written and is left alone.

vLLM calls `register` in each of its processes; it does nothing unless ``VERL_PLATFORM=cpu``. Idempotent.
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


def default_cache_dir() -> Path:
    """TorchInductor's cache directory as torch resolves it (TORCHINDUCTOR_CACHE_DIR or /tmp/torchinductor_$USER)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def remove_torn_binaries(cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Delete the compiled objects and libraries under `cache_dir` that are not whole ELF files; returns their paths.

    A file that looks torn is checked again and removed while holding inductor's own lock for its key (the name up
    to the first dot), so a compile in progress in another process is never touched; a lock held elsewhere skips
    the file. Whole files take no lock.
    """
    from filelock import FileLock, Timeout  # the lock torch.utils._filelock wraps: same files, same protocol

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
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
            except Timeout:
                continue  # another process is compiling this key right now
            except FileNotFoundError:
                continue  # removed meanwhile by another process doing the same
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
