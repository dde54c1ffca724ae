"""Build script: setuptools drives CMake, which builds the runtime library and the _C module.

`pip install --no-build-isolation -e .` (what `make install` runs) configures ./build once
with Ninja and ccache when present, then rebuilds incrementally. ACCEL_BUILD_DIR and
ACCEL_BUILD_TYPE (Release by default) override the defaults.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        sys.exit("torch_accel: cmake is needed to build (pip install cmake, or apt install cmake)")
    return exe


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        # Locate torch without importing it: importing would autoload the installed
        # torch_accel, which is what is being rebuilt.
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            sys.exit("torch_accel: torch is needed to build (pip install 'torch>=2.11')")
        torch_dir = Path(spec.origin).parent

        build_dir = Path(os.environ.get("ACCEL_BUILD_DIR", ROOT / "build")).resolve()
        build_type = os.environ.get("ACCEL_BUILD_TYPE", "Release")
        package_dir = build_dir / "package" / "torch_accel"
        cmake = _cmake()
        args = [
            f"-DCMAKE_BUILD_TYPE={build_type}",
            "-DACCEL_BUILD_PYTHON=ON",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DACCEL_TORCH_DIR={torch_dir}",
            f"-DACCEL_PACKAGE_DIR={package_dir}",
        ]
        if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
            args += ["-G", "Ninja"]
        subprocess.check_call([cmake, "-S", str(ROOT), "-B", str(build_dir), *args])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.check_call(
            [cmake, "--build", str(build_dir), "--target", "torch_accel_python", "-j", jobs]
        )

        # The extension and the runtime library (in lib/, found through RPATH $ORIGIN/lib).
        ext_path = Path(self.get_ext_fullpath(ext.name))
        targets = {ext_path.parent}
        if self.editable_mode or self.inplace:
            targets.add(ROOT / "torch_accel")
        built = next(package_dir.glob("_C*.so"))
        for target in targets:
            (target / "lib").mkdir(parents=True, exist_ok=True)
            replace_file(built, target / ext_path.name)
            for lib in (package_dir / "lib").glob("*.so"):
                replace_file(lib, target / "lib" / lib.name)
            # Generated headers that Inductor's C++ wrapper code includes (c_shim_accel.h).
            (target / "include").mkdir(parents=True, exist_ok=True)
            for header in (package_dir / "include").glob("*.h"):
                replace_file(header, target / "include" / header.name)


def replace_file(src: Path, dst: Path) -> None:
    """Copies to a temporary name, then renames over `dst`: processes that have the old library
    loaded keep their (unlinked) copy instead of crashing on a file rewritten under them."""
    if dst.exists() and src.samefile(dst):
        return
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


setup(
    ext_modules=[CMakeExtension("torch_accel._C")],
    cmdclass={"build_ext": CMakeBuild},
)
