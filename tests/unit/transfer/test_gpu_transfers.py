"""GPU transfers between real processes: cuda_ipc (one GPU is enough) and nccl between two GPUs, bit-exact,
the owner's lease freed by the ack. Skipped without CUDA (the CPU paths of the same code run on gloo)."""

from __future__ import annotations

import pytest
import torch

from epd.bench.transfer import Peer, receiver_device
from epd.bench.transfer_peer import expected_payload
from epd.transfer import TransferReceiver

SIZE = 8 << 20

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs (one rank each)")


def _round_trip(backend: str) -> None:
    device = receiver_device(backend)
    receiver = TransferReceiver(timeout_s=60.0, device=device)
    try:
        with Peer(backend, SIZE) as peer:
            for _ in range(2):  # the second one reuses the channel (and for nccl the group)
                handle, meta = peer.publish()
                [(name, got)] = receiver.fetch(handle, [meta], "kv")
                assert name == "payload" and got.device == device
                assert torch.equal(got.cpu(), expected_payload(SIZE))
                assert receiver.wait_for_acks()
                assert not receiver.release(handle)  # fetch acked already: the owner freed it
    finally:
        receiver.close()


@needs_cuda
def test_cuda_ipc_round_trip_between_processes():
    _round_trip("cuda_ipc")


@needs_two_gpus
def test_nccl_round_trip_between_two_gpus():
    _round_trip("nccl")


@pytest.mark.parametrize("backend", ["grpc", "shm", "nccl"])
def test_the_same_round_trip_in_cpu_memory(backend):
    _round_trip(backend)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_ipc_is_refused_without_cuda_and_cpu_leases_cannot_be_exported(make_owner):
    import grpc

    from epd.transfer import TransferSender
    from epd.transfer.channels import ChannelPool
    from epd.v1 import transfer_pb2, transfer_pb2_grpc

    with pytest.raises(ValueError, match="cuda_ipc needs a CUDA device"):
        TransferSender("cuda_ipc", "127.0.0.1:1")
    owner = make_owner("grpc")
    handle = owner.publish([("x", torch.ones(4))], "kv", ttl_s=30.0)
    channels = ChannelPool(1)
    try:
        stub = transfer_pb2_grpc.TransferStub(channels.get(owner.owner_address))
        with pytest.raises(grpc.RpcError) as info:
            stub.ExportIpc(transfer_pb2.ExportIpcRequest(handle_id=handle.handle_id), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "GPU memory" in info.value.details()
    finally:
        channels.close()
        owner.release(handle.handle_id)
