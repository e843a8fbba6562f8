"""sparkfleet: take a pair of DGX Sparks to a state proven to serve. Run: pyinfra inventory.py deploy.py

The inventory has already validated the cluster data (sparkfleet.inventory.sparks) before any
connection; each role below reads the same validated model.
"""
from pyinfra import local

# 1. Every node's facts in one table; hard requirements stop the deploy before any change.
local.include("roles/preflight/tasks.py")

# 2. The CX7 fabric: netplan drop-in, applied on change, jumbo frames proven between all nodes.
local.include("roles/fabric/tasks.py")
