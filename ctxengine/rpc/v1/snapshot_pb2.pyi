from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServedModel(_message.Message):
    __slots__ = ("weight_id", "name", "loaded")
    WEIGHT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    weight_id: str
    name: str
    loaded: bool
    def __init__(self, weight_id: _Optional[str] = ..., name: _Optional[str] = ..., loaded: _Optional[bool] = ...) -> None: ...

class ModelsResponse(_message.Message):
    __slots__ = ("models", "kv_dtype")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ServedModel]
    kv_dtype: str
    def __init__(self, models: _Optional[_Iterable[_Union[ServedModel, _Mapping]]] = ..., kv_dtype: _Optional[str] = ...) -> None: ...

class MissingPagesRequest(_message.Message):
    __slots__ = ("weight_id", "keys")
    WEIGHT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    weight_id: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, weight_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class MissingPagesResponse(_message.Message):
    __slots__ = ("missing",)
    MISSING_FIELD_NUMBER: _ClassVar[int]
    missing: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, missing: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Page(_message.Message):
    __slots__ = ("key", "record")
    KEY_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    record: bytes
    def __init__(self, key: _Optional[bytes] = ..., record: _Optional[bytes] = ...) -> None: ...

class PutPagesResponse(_message.Message):
    __slots__ = ("received", "stored")
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    received: int
    stored: int
    def __init__(self, received: _Optional[int] = ..., stored: _Optional[int] = ...) -> None: ...

class GetPagesRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PutManifestRequest(_message.Message):
    __slots__ = ("manifest", "ref", "snapshot_id", "force", "ancestors")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    ANCESTORS_FIELD_NUMBER: _ClassVar[int]
    manifest: bytes
    ref: str
    snapshot_id: str
    force: bool
    ancestors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, manifest: _Optional[bytes] = ..., ref: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., force: _Optional[bool] = ..., ancestors: _Optional[_Iterable[str]] = ...) -> None: ...

class PutManifestResponse(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class GetManifestRequest(_message.Message):
    __slots__ = ("ref",)
    REF_FIELD_NUMBER: _ClassVar[int]
    ref: str
    def __init__(self, ref: _Optional[str] = ...) -> None: ...

class GetManifestResponse(_message.Message):
    __slots__ = ("snapshot_id", "manifest")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    manifest: bytes
    def __init__(self, snapshot_id: _Optional[str] = ..., manifest: _Optional[bytes] = ...) -> None: ...

class SetRefRequest(_message.Message):
    __slots__ = ("name", "snapshot_id", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    snapshot_id: str
    force: bool
    def __init__(self, name: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class SetRefResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRefRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetRefResponse(_message.Message):
    __slots__ = ("snapshot_id",)
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    def __init__(self, snapshot_id: _Optional[str] = ...) -> None: ...

class ListRefsRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class ListRefsResponse(_message.Message):
    __slots__ = ("refs",)
    class RefsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REFS_FIELD_NUMBER: _ClassVar[int]
    refs: _containers.ScalarMap[str, str]
    def __init__(self, refs: _Optional[_Mapping[str, str]] = ...) -> None: ...
