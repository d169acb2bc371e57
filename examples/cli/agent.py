# The README's first CLI example runs this in a sandbox: what it sees.
import os
import platform

print(f"agent on {platform.node()}: {os.cpu_count()} CPUs, home {os.path.expanduser('~')}, in {os.getcwd()}")
