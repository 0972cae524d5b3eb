"""`ipybox.code_exec.server`: the published import path, kept; the code lives in [ipybox.kernels.gateway][ipybox.kernels.gateway]."""

from ipybox.kernels.gateway import GatewayEndpoint as GatewayEndpoint
from ipybox.kernels.gateway import GatewayStartError as GatewayStartError
from ipybox.kernels.gateway import KernelGateway as KernelGateway
from ipybox.kernels.gateway import kernel_base_env as kernel_base_env
from ipybox.kernels.gateway_main import READY_PREFIX as READY_PREFIX
from ipybox.kernels.kernelspec import KERNEL_NAME as KERNEL_NAME
from ipybox.kernels.kernelspec import KernelSpec as KernelSpec

__all__ = [
    "KERNEL_NAME",
    "READY_PREFIX",
    "GatewayEndpoint",
    "GatewayStartError",
    "KernelGateway",
    "KernelSpec",
    "kernel_base_env",
]
