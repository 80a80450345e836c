"""A bounded, least-recently-used pool of gRPC channels keyed by "host:port".

One channel per peer is reused across fetches (a channel is expensive to set up and multiplexes
concurrent calls); the bound keeps a long-lived receiver that has talked to many short-lived peers
from holding a socket to each forever.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import grpc

from epd import tls


class ChannelPool:
    """Thread-safe. An evicted channel is closed, which cancels calls still running on it."""

    def __init__(self, max_channels: int, options: Sequence[tuple[str, int]] = ()) -> None:
        if max_channels < 1:
            raise ValueError(f"max_channels must be >= 1, got {max_channels}")
        self._max_channels = max_channels
        self._options = list(options)
        self._channels: OrderedDict[str, grpc.Channel] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, address: str) -> grpc.Channel:
        """The channel to `address`, created on first use; the least recently used one beyond the bound is closed."""
        evicted: list[grpc.Channel] = []
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = tls.channel(address, options=self._options)  # mutual TLS when configured
                self._channels[address] = channel
                while len(self._channels) > self._max_channels:
                    evicted.append(self._channels.popitem(last=False)[1])
            self._channels.move_to_end(address)
        for old in evicted:  # outside the lock: close() waits on the channel's own threads
            old.close()
        return channel

    def __len__(self) -> int:
        with self._lock:
            return len(self._channels)

    def close(self) -> None:
        """Close every channel; the pool stays usable (a later `get` opens a new one)."""
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.close()
