from epd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("handle_id", "max_chunk_bytes")
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    handle_id: str
    max_chunk_bytes: int
    def __init__(self, handle_id: _Optional[str] = ..., max_chunk_bytes: _Optional[int] = ...) -> None: ...

class PullChunk(_message.Message):
    __slots__ = ("meta", "offset_bytes", "data")
    META_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    meta: _common_pb2.TensorMeta
    offset_bytes: int
    data: bytes
    def __init__(self, meta: _Optional[_Union[_common_pb2.TensorMeta, _Mapping]] = ..., offset_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("handle_id",)
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    handle_id: str
    def __init__(self, handle_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class RendezvousRequest(_message.Message):
    __slots__ = ("backends",)
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    backends: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, backends: _Optional[_Iterable[str]] = ...) -> None: ...

class RendezvousResponse(_message.Message):
    __slots__ = ("group_id", "store_host", "store_port", "backend", "timeout_ms")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    store_host: str
    store_port: int
    backend: str
    timeout_ms: int
    def __init__(self, group_id: _Optional[str] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("handle_id", "group_id", "tag")
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    handle_id: str
    group_id: str
    tag: int
    def __init__(self, handle_id: _Optional[str] = ..., group_id: _Optional[str] = ..., tag: _Optional[int] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("sent_bytes",)
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    sent_bytes: int
    def __init__(self, sent_bytes: _Optional[int] = ...) -> None: ...

class ExportIpcRequest(_message.Message):
    __slots__ = ("handle_id",)
    HANDLE_ID_FIELD_NUMBER: _ClassVar[int]
    handle_id: str
    def __init__(self, handle_id: _Optional[str] = ...) -> None: ...

class CudaIpcTensor(_message.Message):
    __slots__ = ("device_uuid", "ipc_handle", "storage_size_bytes", "storage_offset_bytes", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required", "tensor_offset_bytes", "nbytes")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    ipc_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    tensor_offset_bytes: int
    nbytes: int
    def __init__(self, device_uuid: _Optional[str] = ..., ipc_handle: _Optional[bytes] = ..., storage_size_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ..., tensor_offset_bytes: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class ExportIpcResponse(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[CudaIpcTensor]
    def __init__(self, tensors: _Optional[_Iterable[_Union[CudaIpcTensor, _Mapping]]] = ...) -> None: ...
