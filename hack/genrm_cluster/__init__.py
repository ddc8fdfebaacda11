"""Local control plane and node agent built from Go modules (no Docker).

Entry point for Python callers (tests, `make dev`): `LocalCluster`, a context manager that starts
etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a node agent that runs pods as
processes in per-pod network namespaces. See cluster.py, controlplane.py, nodeagent.py, netns.py.
"""

from genrm_cluster.cluster import LocalCluster
from genrm_cluster.nodeagent import NodeConfig

__all__ = ["LocalCluster", "NodeConfig"]
