"""The port phantora gives rank 0's c10d store (MASTER_PORT) is held from the moment it is chosen
until the run ends, so another job on the machine cannot take it while rank 0 starts up
(phantora/simulator/launch.py `_reserve_port`)."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist

from phantora.simulator.launch import _reserve_port


def test_no_other_socket_is_given_the_reserved_port():
    holder = _reserve_port()
    port = holder.getsockname()[1]
    others = []
    try:
        for _ in range(2000):  # the kernel's port-0 bind, as gloo and other launchers use it
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            others.append(s)
            s.bind(("127.0.0.1", 0))
            assert s.getsockname()[1] != port
    finally:
        for s in others:
            s.close()
        holder.close()


def test_rank_0s_store_can_listen_on_the_reserved_port_while_it_is_held():
    holder = _reserve_port()
    port = holder.getsockname()[1]
    try:
        server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=10), wait_for_workers=False)
        client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
        client.set("from", "rank 1")
        assert server.get("from") == b"rank 1"
    finally:
        holder.close()
