from epd.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
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
