"""Building the native kernels: where they are cached, and what a failed build reports (the worker
then falls back to torch or refuses to start, epd.engine.native_kernels)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from epd.kernels import native


def test_the_cache_is_keyed_by_torch_and_the_cpu(monkeypatch, tmp_path):
    monkeypatch.delenv("EPD_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = native.cache_dir()
    assert path.parent == tmp_path / "epd" / "kernels"
    assert path.name.startswith("torch-") and path.name.endswith(native.cpu_digest())
    assert native.cpu_digest() == native.cpu_digest() and len(native.cpu_digest()) == 12


def test_the_cache_folder_can_be_chosen(monkeypatch, tmp_path):
    monkeypatch.setenv("EPD_KERNEL_CACHE", str(tmp_path / "k"))
    assert native.cache_dir() == tmp_path / "k"


def test_a_source_that_does_not_compile_is_reported_not_raised(tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text("int main( {\n")
    result = native.build((source,), tmp_path / "build", "epd_broken_test")
    assert not result.ok
    assert result.detail.startswith(f"could not build broken.cpp in {tmp_path / 'build'}: ")
    assert "broken.cpp:1:" in result.detail and "error" in result.detail  # the compiler's own line


def test_a_cache_folder_that_cannot_be_made_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = native.build(native.SOURCES, blocker / "sub", "epd_blocked_test")
    assert not result.ok and "could not build paged_decode.cpp, rms_norm.cpp" in result.detail


def test_the_sources_ship_with_the_package():
    assert all(source.is_file() and source.parent == Path(native.__file__).parent for source in native.SOURCES)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf")
def test_the_library_runs_its_parallel_loops_on_openmp():
    """Built without OpenMP, at::parallel_for (inlined into our code) runs every kernel on one thread."""
    from epd.kernels.native import cache_dir, load_kernels

    assert load_kernels().ok
    [library] = cache_dir().glob("epd_kernels*.so")
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "libgomp.so" in dynamic
    undefined = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True,
                               check=True).stdout
    assert "GOMP_parallel" in undefined  # the parallel regions were compiled, not dropped
