from epd.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "embeddings", "mm_positions", "sampling", "deadline_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MM_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[_common_pb2.EmbeddingRef]
    mm_positions: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    deadline_ms: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., embeddings: _Optional[_Iterable[_Union[_common_pb2.EmbeddingRef, _Mapping]]] = ..., mm_positions: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "kv", "prompt_tokens", "finish_reason")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    kv: _common_pb2.KvRef
    prompt_tokens: int
    finish_reason: _common_pb2.FinishReason
    def __init__(self, first_token_id: _Optional[int] = ..., kv: _Optional[_Union[_common_pb2.KvRef, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ...) -> None: ...
