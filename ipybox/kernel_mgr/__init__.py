"""ipybox 0.9's `ipybox.kernel_mgr` import paths, kept as thin classes over ipybox's own.

- [ipybox.kernel_mgr.server.KernelGateway][ipybox.kernel_mgr.server.KernelGateway], over
  [ipybox.kernels.gateway.KernelGateway][ipybox.kernels.gateway.KernelGateway];
- [ipybox.kernel_mgr.client.KernelClient][ipybox.kernel_mgr.client.KernelClient], `ExecutionResult` and
  `ExecutionError`, over [ipybox.kernels.kernel_client.KernelClient][ipybox.kernels.kernel_client.KernelClient].

ipybox's own names stay primary; nothing inside ipybox imports these (import-linter checks it). Importing
this package imports neither submodule.
"""
