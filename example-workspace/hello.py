# A first cell for ipybox: state, output and the workspace as working directory.
import os
import platform

counter = sum(range(10))
print(f"Hello from an ipybox kernel (Python {platform.python_version()}) in {os.getcwd()}")
print(f"sum(range(10)) = {counter}")
