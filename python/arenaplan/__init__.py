"""arenaplan: GPU memory planned offline, for CUDA graphs without bloat.

The PyTorch bridge lives in :mod:`arenaplan.torch`::

    import arenaplan.torch as ap
    ap.install()                 # before anything touches CUDA
    step = ap.graph(lambda: model(x))
    out = step.replay()

This package is a thin layer over the shared library built from the Go
project (``libarenaplan.so``); it holds no memory logic of its own.
"""

__version__ = "0.6.0.dev0"  # after 0.5.0 (CHANGELOG.md)
