"""ReceiveBuffers on exact sizes: which requests get a warm buffer, when one is reused, and the budget."""

from __future__ import annotations

import pytest
import torch

from epd.transfer.buffers import ReceiveBuffers

MIB = 1 << 20


def test_a_dropped_tensors_buffer_is_reused_and_a_kept_ones_is_not():
    pool = ReceiveBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    first = pool.tensor((MIB,), torch.float32)  # 4 MiB
    first_ptr = first.data_ptr()
    kept = pool.tensor((MIB,), torch.float32)
    assert kept.data_ptr() != first_ptr and pool.in_use() == 2 and pool.held_bytes == 8 * MIB
    del first
    again = pool.tensor((1000, 1024), torch.float32)  # a little smaller: the same buffer serves
    assert again.data_ptr() == first_ptr and pool.held_bytes == 8 * MIB
    assert again.shape == (1000, 1024) and again.dtype == torch.float32


def test_any_view_keeps_the_buffer_in_use():
    pool = ReceiveBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    tensor = pool.tensor((2 * MIB,), torch.uint8)
    ptr = tensor.data_ptr()
    row_view, array = tensor.view(2, MIB)[1], tensor[:10].numpy()
    del tensor
    assert pool.in_use() == 1 and pool.tensor((2 * MIB,), torch.uint8).data_ptr() != ptr
    del row_view
    assert pool.in_use() == 1  # the numpy array still views the first buffer (the second was dropped)
    del array
    assert pool.in_use() == 0


def test_small_and_oversized_requests_get_plain_tensors():
    pool = ReceiveBuffers(max_bytes=8 * MIB, min_bytes=MIB)
    small, huge = pool.tensor((MIB - 1,), torch.uint8), pool.tensor((9 * MIB,), torch.uint8)
    assert small.numel() == MIB - 1 and huge.numel() == 9 * MIB
    assert pool.held_bytes == 0


def test_a_buffer_over_twice_the_request_is_not_used_for_it():
    pool = ReceiveBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    big_ptr = pool.tensor((9 * MIB,), torch.uint8).data_ptr()  # dropped at once: free
    small = pool.tensor((4 * MIB,), torch.uint8)
    assert small.data_ptr() != big_ptr and pool.held_bytes == 13 * MIB


def test_the_budget_drops_free_buffers_first_and_then_hands_out_plain_tensors():
    pool = ReceiveBuffers(max_bytes=10 * MIB, min_bytes=MIB)
    pool.tensor((4 * MIB,), torch.uint8)  # dropped: free
    held = pool.tensor((4 * MIB,), torch.uint8)  # reuses it
    other = pool.tensor((5 * MIB,), torch.uint8)  # 4 + 5 fit
    assert pool.held_bytes == 9 * MIB and pool.in_use() == 2
    del other
    third = pool.tensor((6 * MIB,), torch.uint8)  # 4 + 6 fit once the free 5 MiB one is dropped
    assert pool.held_bytes == 10 * MIB and pool.in_use() == 2
    plain = pool.tensor((3 * MIB,), torch.uint8)  # everything in use, no room: not pooled
    assert pool.held_bytes == 10 * MIB and plain.numel() == 3 * MIB
    del held, third
    pool.clear()
    assert pool.held_bytes == 0


def test_tensors_are_writable_in_every_dtype():
    pool = ReceiveBuffers(max_bytes=64 * MIB, min_bytes=MIB)
    for dtype in (torch.bfloat16, torch.float32, torch.int64, torch.bool):
        tensor = pool.tensor((1024, 1024), dtype)
        tensor.fill_(1)
        assert tensor.dtype == dtype and bool((tensor == 1).all())


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        ReceiveBuffers(max_bytes=-1)
    with pytest.raises(ValueError, match="min_bytes"):
        ReceiveBuffers(min_bytes=0)
