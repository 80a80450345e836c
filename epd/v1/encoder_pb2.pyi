from epd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImageInput(_message.Message):
    __slots__ = ("image_digest", "data")
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    image_digest: str
    data: bytes
    def __init__(self, image_digest: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("request_id", "images", "deadline_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    images: _containers.RepeatedCompositeFieldContainer[ImageInput]
    deadline_ms: int
    def __init__(self, request_id: _Optional[str] = ..., images: _Optional[_Iterable[_Union[ImageInput, _Mapping]]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("embeddings",)
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[_common_pb2.EmbeddingRef]
    def __init__(self, embeddings: _Optional[_Iterable[_Union[_common_pb2.EmbeddingRef, _Mapping]]] = ...) -> None: ...
