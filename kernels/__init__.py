"""Triton kernels for log-linear attention, installed as ``loglin_edu.kernels``.

Triton is imported lazily, by the modules of this package only: ``import loglin_edu`` never needs
triton or a GPU. Without CUDA the kernels run under Triton's interpreter, which needs
``TRITON_INTERPRET=1`` in the environment before triton is first imported.
"""
