"""Builds grtool's native FM-index extension; every other piece of metadata lives in pyproject.toml."""

from __future__ import annotations

import platform
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup


def _cpu_flags() -> list[str]:
    """Hardware popcount when the build machine has it (the extension is built where it runs)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return ["-mpopcnt"] if " popcnt" in info else []


setup(
    ext_modules=[
        Pybind11Extension(
            "grtool.index._fm",
            sorted(str(p) for p in Path("grtool/index/native").glob("*.cpp")),
            depends=sorted(str(p) for p in Path("grtool/index/native").glob("*.hpp")),
            cxx_std=17,
            extra_compile_args=["-O3", "-pthread", *_cpu_flags()],
            extra_link_args=["-pthread"],
        )
    ],
    cmdclass={"build_ext": build_ext},
)
