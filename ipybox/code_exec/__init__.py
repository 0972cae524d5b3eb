"""Code execution: the kernel gateway, kernels on it, and the client that runs code in them."""
