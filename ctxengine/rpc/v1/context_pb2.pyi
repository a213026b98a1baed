from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContextInfo(_message.Message):
    __slots__ = ("name", "model", "weight_id", "n_tokens", "snapshot_id", "labels", "token_ids", "text", "lora")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_ID_FIELD_NUMBER: _ClassVar[int]
    N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    weight_id: str
    n_tokens: int
    snapshot_id: str
    labels: _containers.ScalarMap[str, str]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    lora: _containers.RepeatedCompositeFieldContainer[LoraUse]
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., weight_id: _Optional[str] = ..., n_tokens: _Optional[int] = ..., snapshot_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., lora: _Optional[_Iterable[_Union[LoraUse, _Mapping]]] = ...) -> None: ...

class LoraUse(_message.Message):
    __slots__ = ("name", "scale", "blake3")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    BLAKE3_FIELD_NUMBER: _ClassVar[int]
    name: str
    scale: float
    blake3: str
    def __init__(self, name: _Optional[str] = ..., scale: _Optional[float] = ..., blake3: _Optional[str] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("model", "name", "system", "labels", "lora")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    model: str
    name: str
    system: str
    labels: _containers.ScalarMap[str, str]
    lora: LoraList
    def __init__(self, model: _Optional[str] = ..., name: _Optional[str] = ..., system: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., lora: _Optional[_Union[LoraList, _Mapping]] = ...) -> None: ...

class LoraList(_message.Message):
    __slots__ = ("uses",)
    USES_FIELD_NUMBER: _ClassVar[int]
    uses: _containers.RepeatedCompositeFieldContainer[LoraUse]
    def __init__(self, uses: _Optional[_Iterable[_Union[LoraUse, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("name", "text", "ids", "parse_special")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    PARSE_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    text: str
    ids: TokenIds
    parse_special: bool
    def __init__(self, name: _Optional[str] = ..., text: _Optional[str] = ..., ids: _Optional[_Union[TokenIds, _Mapping]] = ..., parse_special: _Optional[bool] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("n_new", "context")
    N_NEW_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    n_new: int
    context: ContextInfo
    def __init__(self, n_new: _Optional[int] = ..., context: _Optional[_Union[ContextInfo, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPEAT_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPEAT_LAST_N_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repeat_penalty: _Optional[float] = ..., repeat_last_n: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("name", "max_tokens", "stop", "sampling")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    name: str
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    sampling: SamplingParams
    def __init__(self, name: _Optional[str] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class Piece(_message.Message):
    __slots__ = ("text", "token_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_id: int
    def __init__(self, text: _Optional[str] = ..., token_id: _Optional[int] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("finish_reason", "prompt_tokens", "completion_tokens", "n_tokens")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_TOKENS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    n_tokens: int
    def __init__(self, finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., n_tokens: _Optional[int] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("piece", "done")
    PIECE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    piece: Piece
    done: Done
    def __init__(self, piece: _Optional[_Union[Piece, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("name", "new_name")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NEW_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    new_name: str
    def __init__(self, name: _Optional[str] = ..., new_name: _Optional[str] = ...) -> None: ...

class RewindRequest(_message.Message):
    __slots__ = ("name", "n")
    NAME_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    name: str
    n: int
    def __init__(self, name: _Optional[str] = ..., n: _Optional[int] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("name", "ref", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ref: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., ref: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("snapshot_id", "n_pages", "pages_written", "ref")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    N_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    n_pages: int
    pages_written: int
    ref: str
    def __init__(self, snapshot_id: _Optional[str] = ..., n_pages: _Optional[int] = ..., pages_written: _Optional[int] = ..., ref: _Optional[str] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("ref", "name")
    REF_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ref: str
    name: str
    def __init__(self, ref: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("contexts",)
    CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    contexts: _containers.RepeatedCompositeFieldContainer[ContextInfo]
    def __init__(self, contexts: _Optional[_Iterable[_Union[ContextInfo, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("name", "include_tokens")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    name: str
    include_tokens: bool
    def __init__(self, name: _Optional[str] = ..., include_tokens: _Optional[bool] = ...) -> None: ...
