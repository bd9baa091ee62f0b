"""Half-written kernels in TorchInductor's cache (recipe/darl/cpu/vllm_rollout/inductor_cache.py): found by their ELF
layout, removed under inductor's own lock, and, with real inductor, the failure they cause and its repair."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recipe.darl.cpu.vllm_rollout.inductor_cache import is_whole_elf, register, remove_torn_binaries

pytestmark = pytest.mark.full  # a long launch: make test-all


CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="inductor on CPU needs a C++ compiler (g++)")


@pytest.fixture(scope="module")
def real_so(tmp_path_factory) -> Path:
    """A shared library as inductor builds one: the C++ compiler's output, written in one go."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    root = tmp_path_factory.mktemp("real_so")
    (root / "k.cpp").write_text('extern "C" int kernel(int x) { return 2 * x; }\n')
    subprocess.run([CXX, "-shared", "-fPIC", "-O1", "-o", str(root / "k.so"), str(root / "k.cpp")], check=True)
    return root / "k.so"


def _copy(src: Path, dst: Path, keep: int | None = None) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    data = src.read_bytes()
    dst.write_bytes(data if keep is None else data[:keep])
    return dst


def test_whole_and_torn_elf_files(tmp_path, real_so):
    size = real_so.stat().st_size
    assert is_whole_elf(real_so)
    # the section header table ends the file: one byte less and it points past the end
    assert not is_whole_elf(_copy(real_so, tmp_path / "a.so", keep=size - 1))
    assert not is_whole_elf(_copy(real_so, tmp_path / "b.so", keep=size // 2))
    assert not is_whole_elf(_copy(real_so, tmp_path / "c.so", keep=40))  # shorter than an ELF header
    assert not is_whole_elf(_copy(real_so, tmp_path / "d.so", keep=0))  # what the killed compile left here
    (tmp_path / "e.so").write_text("not a library")
    assert not is_whole_elf(tmp_path / "e.so")
    # the header's own numbers decide: an ELF64 header whose section table ends exactly at the file's end is whole
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[0x28:0x30] = (64).to_bytes(8, "little")   # e_shoff
    header[0x3A:0x3C] = (64).to_bytes(2, "little")   # e_shentsize
    header[0x3C:0x3E] = (2).to_bytes(2, "little")    # e_shnum: the table ends at 64 + 128 = 192
    (tmp_path / "f.o").write_bytes(bytes(header) + bytes(128))
    assert is_whole_elf(tmp_path / "f.o")
    (tmp_path / "g.o").write_bytes(bytes(header) + bytes(127))
    assert not is_whole_elf(tmp_path / "g.o")


def _fake_cache(root: Path, real_so: Path) -> dict[str, Path]:
    size = real_so.stat().st_size
    files = {
        "whole": _copy(real_so, root / "ab" / "cabwhole.main.so"),
        "empty": _copy(real_so, root / "ei" / "ceiempty.main.so", keep=0),
        "short_o": _copy(real_so, root / "ei" / "ceishort.optimized.o", keep=size // 3),
        "nested": _copy(real_so, root / "ei" / "ceinested.main_CxxBuild" / "ceinested.so", keep=10),
        "source": root / "ei" / "ceiempty.main.cpp",
    }
    files["source"].write_text("// kernel source")
    (root / "locks").mkdir(parents=True, exist_ok=True)
    return files


def test_remove_torn_binaries_keeps_whole_files_and_sources(tmp_path, real_so):
    files = _fake_cache(tmp_path, real_so)
    removed = remove_torn_binaries(tmp_path)
    assert sorted(removed) == sorted([files["empty"], files["short_o"], files["nested"]])
    assert files["whole"].read_bytes() == real_so.read_bytes()
    assert files["source"].read_text() == "// kernel source"
    assert not any(files[k].exists() for k in ("empty", "short_o", "nested"))
    assert remove_torn_binaries(tmp_path) == []  # idempotent
    assert remove_torn_binaries(tmp_path / "absent") == []


def test_a_file_whose_lock_another_process_holds_is_left_alone(tmp_path, real_so):
    files = _fake_cache(tmp_path, real_so)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from torch.utils._filelock import FileLock
            with FileLock({str(tmp_path / "locks" / "ceiempty.lock")!r}):
                print("held", flush=True)
                sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        removed = remove_torn_binaries(tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert files["empty"].exists()  # being compiled elsewhere: untouched
    assert sorted(removed) == sorted([files["short_o"], files["nested"]])
    assert remove_torn_binaries(tmp_path) == [files["empty"]]  # the lock released, it goes


def test_register_repairs_only_on_the_cpu_platform(tmp_path, real_so, monkeypatch):
    files = _fake_cache(tmp_path, real_so)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    register()
    assert files["empty"].exists()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    register()
    assert not files["empty"].exists() and files["whole"].exists()


COMPILE = textwrap.dedent("""
    import torch
    f = torch.compile(lambda x: torch.softmax(x * 2.0, dim=-1).sum(dim=0))
    print(float(f(torch.arange(12.0).reshape(3, 4))[0]))
""")


def _compile(cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600)


@needs_cxx
def test_torn_libraries_break_the_compile_until_removed(tmp_path):
    cache = tmp_path / "inductor"
    first = _compile(cache)
    assert first.returncode == 0, first.stderr[-3000:]
    kernels = [Path(p) for p in glob.glob(str(cache / "**" / "*.main.so"), recursive=True)]
    assert kernels and all(is_whole_elf(p) for p in kernels)
    # inductor's probes of the CPU's vector ISA are libraries of the same cache: torn alone, they break the compile
    # too (inductor then emits vector code the probe no longer confirms, and g++ fails on it)
    probes = [Path(p) for p in glob.glob(str(cache / "**" / "*.so"), recursive=True) if Path(p) not in kernels]
    assert probes
    for lib in probes:
        lib.write_bytes(b"")
    assert _compile(cache).returncode != 0
    assert sorted(remove_torn_binaries(cache)) == sorted(probes)
    for lib in kernels:  # what the vLLM server killed during its first compile left (tests/vllm/test_pipeline_one_step_off.py)
        lib.write_bytes(b"")
    broken = _compile(cache)
    assert broken.returncode != 0 and "file too short" in broken.stderr, broken.stderr[-3000:]
    assert sorted(remove_torn_binaries(cache)) == sorted(kernels)
    repaired = _compile(cache)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert repaired.stdout.strip() == first.stdout.strip()
    assert all(is_whole_elf(p) for p in kernels + probes)  # rebuilt in place
