"""Admin requests parsed strictly: what the server does not understand refuses the whole request.

protobuf-python keeps a field it does not know, and a known field sent with another wire type, as an unknown
field and parses the rest: a `validate_only` sent length-delimited read as false and the update was applied, a
length-delimited `expected_version` as unset (applied unconditionally), a mistyped `to_version` as "the
previous version". So a request is parsed, and then it and every message inside it must hold no unknown field:

    a field number its message does not have is refused by number, a known one of another wire type by name
    (repeated numbers may come packed or not: protobuf reads both, and keeps neither as unknown)
    nesting is bounded by the parser (protobuf's recursion limit, 100 messages or groups): 100k nested unknown
        groups fail to parse, which gRPC's own deserializer answered INTERNAL, and are refused here like any
        other malformed message (a string that is not UTF-8, a length past the end)

A refusal is a ConfigError (INVALID_ARGUMENT) naming the message, the field and the wire types. The server
hands each handler its request unparsed (`Unparsed`), so that it is parsed only once the caller is authorized.
"""
from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from dspark.models.errors import ConfigError

VARINT, FIXED64, LENGTH_DELIMITED, GROUP_START, GROUP_END, FIXED32 = range(6)
WIRE_NAMES = {VARINT: "a varint", FIXED64: "64-bit", LENGTH_DELIMITED: "length-delimited",
              GROUP_START: "a group", GROUP_END: "a group end", FIXED32: "32-bit"}
FIXED64_TYPES = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64)
FIXED32_TYPES = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32)
DELIMITED_TYPES = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE)


@dataclass(frozen=True)
class Unparsed:
    """A request's wire bytes and the message they should be (the gRPC server's request_deserializer)."""
    message_class: type
    data: bytes

    def parse(self) -> Message:
        """The request, or a ConfigError naming what is unknown, mistyped or malformed in it."""
        name = self.message_class.DESCRIPTOR.name
        try:
            message = self.message_class.FromString(self.data)
        except DecodeError:
            raise ConfigError(f"{name} is malformed: cut off, nested too deep (unknown groups, say) or holding a "
                              "string that is not UTF-8") from None
        refuse_unknown_fields(message, name)
        return message


def refuse_unknown_fields(message: Message, where: str) -> None:
    """A ConfigError for the first unknown field of `message` or of a message inside it (`where`: its path)."""
    descriptor = message.DESCRIPTOR
    for unknown in UnknownFieldSet(message):
        number, wire = unknown.field_number, unknown.wire_type
        sent = WIRE_NAMES.get(wire, f"wire type {wire}")
        field = descriptor.fields_by_number.get(number)
        if field is None:
            raise ConfigError(f"{where} has a field number {number} ({sent}) this server does not know; its "
                              f"fields: {[f.name for f in descriptor.fields]}")
        raise ConfigError(f"{where}.{field.name} (field {number}) was sent as {sent}; it is "
                          f"{WIRE_NAMES[wire_type(field)]}")
    for field, value in message.ListFields():  # (no admin message holds a map)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for inner in (value if field.is_repeated else [value]):
                refuse_unknown_fields(inner, f"{where}.{field.name}")


def wire_type(field: FieldDescriptor) -> int:
    if field.type in DELIMITED_TYPES:
        return LENGTH_DELIMITED
    if field.type in FIXED64_TYPES:
        return FIXED64
    return FIXED32 if field.type in FIXED32_TYPES else VARINT
