"""Builds arenaplan's shared library with Go while the package builds; the
package's metadata is in pyproject.toml.

    python3 -m pip install --no-build-isolation ./python

needs Go 1.25+ and a C and C++ compiler (the library is the project's one
cgo artifact). ARENAPLAN_GO names another go binary.
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


cmdclass = {"build_py": BuildWithGo}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """The wheel holds a native library but no Python extension: it is
        tagged for the platform (linux_x86_64), for any Python 3."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: pip installs from the source tree
    pass


setup(cmdclass=cmdclass)
