"""Code that runs inside the kernels: their entry point, the tool runner generated modules call, fresh tool
packages after a regeneration, the sandbox's hint on refused writes, shell-command approval, the
working-dir reset after each cell, and the set-up of kernels that share no files with the host (`remote`),
whose import hook loads the generated packages from the tool server (`remote_modules`).

Standard library only (the kernel's entry point also imports ipykernel, the kernel itself), and nothing
else of ipybox: it is loaded into every kernel, which must start without the host's package (and, sandboxed,
without anything the sandbox hides). `tests/test_architecture.py` checks this.
"""
