"""PagedWeight's Triton kernels: each file a kernel, its checked wrapper and its torch reference.

A regular package, not a namespace one: a namespace package loses to any
regular package of the same name on the path, and Hugging Face's `kernels`
distribution (a requirement of transformers 5.25 and later) is one.
"""
