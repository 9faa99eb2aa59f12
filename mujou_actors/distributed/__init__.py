"""Nets beyond one process: groups of nodes in processes of their own (docs/processes.md).

`placement` checks a placement and the net factory before anything starts;
`wire` encodes port messages for the data plane (msgpack, raw tensor bytes,
shared memory for large tensors, never pickle); `system` runs the private
Thespian actor system that starts, watches and stops the group processes (the
control plane); `group` is what runs inside a group process (a kernel for its
nodes, driven over the data plane); `placed` is the host side: the driver of
the global delta cycles and the `Run` of a placed net.
"""
