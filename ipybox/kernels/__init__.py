"""Kernels: the Jupyter Kernel Gateway ipybox starts, the kernelspec it starts kernels from (sandboxed or
not), the client that runs code in one, and the pool of warm kernels a workspace keeps."""
