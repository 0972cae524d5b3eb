"""Code that runs inside the kernels: their entry point, the tool runner generated modules call, fresh tool
packages after a regeneration, and the sandbox's hint on refused writes.

Standard library only, and importing nothing else of ipybox: it is loaded into every kernel (and, sandboxed,
must not need anything the sandbox hides).
"""
