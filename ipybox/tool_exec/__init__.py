"""`ipybox.tool_exec`: the published import paths of the tool server and its in-kernel client, kept.

Generated tool modules import `ipybox.tool_exec.client` inside kernels, so this package imports nothing
itself. The code lives in [tool_server][ipybox.tool_server], [approval][ipybox.approval] and
[in_kernel][ipybox.in_kernel].
"""
