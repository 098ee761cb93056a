from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CompressionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[CompressionType]
    LZ4: _ClassVar[CompressionType]
    ZLIB: _ClassVar[CompressionType]
    ZSTD: _ClassVar[CompressionType]
    SNAPPY: _ClassVar[CompressionType]
NONE: CompressionType
LZ4: CompressionType
ZLIB: CompressionType
ZSTD: CompressionType
SNAPPY: CompressionType

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class OffloadContext(_message.Message):
    __slots__ = ("uidMsb", "uidLsb", "complete", "bookkeeperDeleted", "timestamp")
    UIDMSB_FIELD_NUMBER: _ClassVar[int]
    UIDLSB_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    BOOKKEEPERDELETED_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    uidMsb: int
    uidLsb: int
    complete: bool
    bookkeeperDeleted: bool
    timestamp: int
    def __init__(self, uidMsb: _Optional[int] = ..., uidLsb: _Optional[int] = ..., complete: _Optional[bool] = ..., bookkeeperDeleted: _Optional[bool] = ..., timestamp: _Optional[int] = ...) -> None: ...

class NestedPositionInfo(_message.Message):
    __slots__ = ("ledgerId", "entryId")
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    entryId: int
    def __init__(self, ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ...) -> None: ...

class ManagedLedgerInfo(_message.Message):
    __slots__ = ("ledgerInfo", "terminatedPosition", "properties")
    class LedgerInfo(_message.Message):
        __slots__ = ("ledgerId", "entries", "size", "timestamp", "offloadContext")
        LEDGERID_FIELD_NUMBER: _ClassVar[int]
        ENTRIES_FIELD_NUMBER: _ClassVar[int]
        SIZE_FIELD_NUMBER: _ClassVar[int]
        TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
        OFFLOADCONTEXT_FIELD_NUMBER: _ClassVar[int]
        ledgerId: int
        entries: int
        size: int
        timestamp: int
        offloadContext: OffloadContext
        def __init__(self, ledgerId: _Optional[int] = ..., entries: _Optional[int] = ..., size: _Optional[int] = ..., timestamp: _Optional[int] = ..., offloadContext: _Optional[_Union[OffloadContext, _Mapping]] = ...) -> None: ...
    LEDGERINFO_FIELD_NUMBER: _ClassVar[int]
    TERMINATEDPOSITION_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    ledgerInfo: _containers.RepeatedCompositeFieldContainer[ManagedLedgerInfo.LedgerInfo]
    terminatedPosition: NestedPositionInfo
    properties: _containers.RepeatedCompositeFieldContainer[KeyValue]
    def __init__(self, ledgerInfo: _Optional[_Iterable[_Union[ManagedLedgerInfo.LedgerInfo, _Mapping]]] = ..., terminatedPosition: _Optional[_Union[NestedPositionInfo, _Mapping]] = ..., properties: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ...) -> None: ...

class LongProperty(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: int
    def __init__(self, name: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...

class StringProperty(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ManagedCursorInfo(_message.Message):
    __slots__ = ("cursorsLedgerId", "markDeleteLedgerId", "markDeleteEntryId", "properties", "lastActive", "cursorProperties")
    CURSORSLEDGERID_FIELD_NUMBER: _ClassVar[int]
    MARKDELETELEDGERID_FIELD_NUMBER: _ClassVar[int]
    MARKDELETEENTRYID_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    LASTACTIVE_FIELD_NUMBER: _ClassVar[int]
    CURSORPROPERTIES_FIELD_NUMBER: _ClassVar[int]
    cursorsLedgerId: int
    markDeleteLedgerId: int
    markDeleteEntryId: int
    properties: _containers.RepeatedCompositeFieldContainer[LongProperty]
    lastActive: int
    cursorProperties: _containers.RepeatedCompositeFieldContainer[StringProperty]
    def __init__(self, cursorsLedgerId: _Optional[int] = ..., markDeleteLedgerId: _Optional[int] = ..., markDeleteEntryId: _Optional[int] = ..., properties: _Optional[_Iterable[_Union[LongProperty, _Mapping]]] = ..., lastActive: _Optional[int] = ..., cursorProperties: _Optional[_Iterable[_Union[StringProperty, _Mapping]]] = ...) -> None: ...

class ManagedInfoMetadata(_message.Message):
    __slots__ = ("compressionType", "uncompressedSize")
    COMPRESSIONTYPE_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSEDSIZE_FIELD_NUMBER: _ClassVar[int]
    compressionType: CompressionType
    uncompressedSize: int
    def __init__(self, compressionType: _Optional[_Union[CompressionType, str]] = ..., uncompressedSize: _Optional[int] = ...) -> None: ...

class SchemaPosition(_message.Message):
    __slots__ = ("ledgerId", "entryId")
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    entryId: int
    def __init__(self, ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ...) -> None: ...

class SchemaIndexEntry(_message.Message):
    __slots__ = ("version", "position", "hash")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    version: int
    position: SchemaPosition
    hash: bytes
    def __init__(self, version: _Optional[int] = ..., position: _Optional[_Union[SchemaPosition, _Mapping]] = ..., hash: _Optional[bytes] = ...) -> None: ...

class SchemaLocator(_message.Message):
    __slots__ = ("info", "index")
    INFO_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    info: SchemaIndexEntry
    index: _containers.RepeatedCompositeFieldContainer[SchemaIndexEntry]
    def __init__(self, info: _Optional[_Union[SchemaIndexEntry, _Mapping]] = ..., index: _Optional[_Iterable[_Union[SchemaIndexEntry, _Mapping]]] = ...) -> None: ...

class MessageMetadata(_message.Message):
    __slots__ = ("producer_name", "sequence_id", "publish_time", "num_messages_in_batch")
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    NUM_MESSAGES_IN_BATCH_FIELD_NUMBER: _ClassVar[int]
    producer_name: str
    sequence_id: int
    publish_time: int
    num_messages_in_batch: int
    def __init__(self, producer_name: _Optional[str] = ..., sequence_id: _Optional[int] = ..., publish_time: _Optional[int] = ..., num_messages_in_batch: _Optional[int] = ...) -> None: ...
