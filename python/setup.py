"""Builds arenaplan's shared library with Go and installs the Python package.

    python3 -m pip install --no-build-isolation ./python

needs Go 1.25+ and a C compiler (the library is the project's one cgo
artifact). ARENAPLAN_GO names another go binary.
"""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class BuildWithGo(build_py):
    """Runs go build -buildmode=c-shared into the package before copying it."""

    def run(self):
        out = os.path.join(HERE, "arenaplan", "_lib", "libarenaplan.so")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1")
        go = os.environ.get("ARENAPLAN_GO", "go")
        subprocess.check_call([go, "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./cmd/libarenaplan"],
                              cwd=ROOT, env=env)
        super().run()


setup(
    name="arenaplan",
    version="0.1.0",
    description="Planned GPU memory for PyTorch: CUDA graphs at the lower bound of live bytes",
    packages=["arenaplan"],
    package_data={"arenaplan": ["_lib/libarenaplan.so"]},
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithGo},
    zip_safe=False,
)
