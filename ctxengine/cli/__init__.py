"""The `ctx` command.

numpy's OpenBLAS starts a thread per core when numpy is imported, and they
spin for a while: about 0.1 CPU-second of every `ctx` command on a 2-core
machine, taken from the engine's own threads (and from a pull's transfer).
The engine does its own arithmetic and asks BLAS for nothing that needs
threads, so the command runs it on one thread unless the user says otherwise.
(Set here, before anything imports numpy; a program that imports ctxengine
as a library keeps its own settings.)
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
