"""The cuda_ipc backend: the receiver maps the owner's GPU memory through CUDA IPC and copies it out.

For workers on one node, including two on one GPU (NCCL refuses two ranks on one device). The owner
exports each tensor's storage with torch's own CUDA sharing (`UntypedStorage._share_cuda_`, what
torch.multiprocessing's reductions use), but the fields go on the wire one by one in a proto message,
never pickled. The receiver opens them (`_new_shared_cuda`), copies the bytes into memory of its
own, waits for the copy, and only then acks: the owner's memory must stay valid until then, and it
does, because the lease holds the tensors until the ack (or its TTL).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from epd.v1 import common_pb2, transfer_pb2
from epd.wire.tensors import dtype_from_proto


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_index(uuid: str) -> int:
    """This process's index of the GPU with `uuid`; LookupError when it cannot see that GPU."""
    for index in range(torch.cuda.device_count()):
        if device_uuid(index) == uuid:
            return index
    raise LookupError(f"GPU {uuid} is not visible to this process (CUDA_VISIBLE_DEVICES)")


def export(views: Sequence[torch.Tensor]) -> list[transfer_pb2.CudaIpcTensor]:
    """IPC references to [nbytes] uint8 CUDA views (the owner's side); ValueError for a CPU tensor."""
    refs = []
    for view in views:
        if not view.numel():
            refs.append(transfer_pb2.CudaIpcTensor(nbytes=0))
            continue
        if not view.is_cuda:
            raise ValueError("cuda_ipc can only export tensors in GPU memory")
        storage = view.untyped_storage()
        (device, handle, size, offset, counter, counter_offset, event, event_sync) = storage._share_cuda_()
        refs.append(transfer_pb2.CudaIpcTensor(
            device_uuid=device_uuid(device), ipc_handle=handle, storage_size_bytes=size,
            storage_offset_bytes=offset, ref_counter_handle=counter, ref_counter_offset=counter_offset,
            event_handle=event or b"", event_sync_required=bool(event_sync),
            tensor_offset_bytes=view.storage_offset() * view.element_size(), nbytes=view.numel()))
    return refs


def open_and_copy(refs: Sequence[transfer_pb2.CudaIpcTensor], metas: Sequence[common_pb2.TensorMeta],
                  device: torch.device) -> list[torch.Tensor]:
    """Fresh tensors on `device` holding the bytes the references point at (the receiver's side).

    ValueError when a reference disagrees with its meta (sizes, bounds); the copy has completed when
    this returns, so the caller may ack at once.
    """
    if len(refs) != len(metas):
        raise ValueError(f"{len(refs)} IPC references for {len(metas)} tensors")
    out = []
    for ref, meta in zip(refs, metas, strict=True):
        tensor = torch.empty(tuple(meta.shape), dtype=dtype_from_proto(meta.dtype), device=device)
        nbytes = tensor.numel() * tensor.element_size()
        if ref.nbytes != nbytes:
            raise ValueError(f"tensor {meta.name!r}: IPC reference has {ref.nbytes} bytes, the meta {nbytes}")
        if nbytes:
            if ref.tensor_offset_bytes < 0 or ref.tensor_offset_bytes + nbytes > ref.storage_size_bytes:
                raise ValueError(f"tensor {meta.name!r}: bytes [{ref.tensor_offset_bytes}, "
                                 f"{ref.tensor_offset_bytes + nbytes}) lie outside a {ref.storage_size_bytes}-byte "
                                 f"storage")
            storage = torch.UntypedStorage._new_shared_cuda(
                local_index(ref.device_uuid), ref.ipc_handle, ref.storage_size_bytes, ref.storage_offset_bytes,
                ref.ref_counter_handle, ref.ref_counter_offset, ref.event_handle or None, ref.event_sync_required)
            source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
                storage, ref.tensor_offset_bytes, (nbytes,))
            tensor.reshape(-1).view(torch.uint8).copy_(source)
        out.append(tensor)
    torch.cuda.synchronize(device)  # every copy done before the owner may free its memory
    return out
