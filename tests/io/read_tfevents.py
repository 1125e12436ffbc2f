#!/usr/bin/env python3
"""Reads a TensorBoard events file independently of pipetrain's writer, so its tests check the
bytes against the format rather than against the writer's own idea of it.

Checks every record's TFRecord framing and both masked CRC-32Cs (computed here bit by bit, not with
the C++ table), decodes the Event/Summary fields scalar logging uses, and prints
{"file_version": ..., "scalars": [{"tag", "step", "value", "wall_time"}, ...]} as JSON.
Exits non-zero with a message on any framing, CRC or protobuf error. Standard library only.
"""

import json
import struct
import sys


def crc32c(data):
    """CRC-32C: Castagnoli polynomial, reflected (0x82F63B78), bitwise."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            if crc & 1:
                crc = (crc >> 1) ^ 0x82F63B78
            else:
                crc >>= 1
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class FormatError(Exception):
    pass


def read_varint(buf, pos):
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise FormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise FormatError("varint too long")


def fields(buf):
    """Yields (field_number, wire_type, value) for each field of a serialized message."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise FormatError("truncated fixed64")
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = read_varint(buf, pos)
            if pos + size > len(buf):
                raise FormatError("truncated length-delimited field %d" % field)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            if pos + 4 > len(buf):
                raise FormatError("truncated fixed32")
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise FormatError("unsupported wire type %d" % wire)
        yield field, wire, value


def expect_wire(field, wire, expected, what):
    if wire != expected:
        raise FormatError("%s (field %d) has wire type %d, expected %d" %
                          (what, field, wire, expected))


def records(data):
    pos = 0
    index = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise FormatError("record %d: truncated header" % index)
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked_crc32c(header):
            raise FormatError("record %d: length crc mismatch" % index)
        start = pos + 12
        if start + length + 4 > len(data):
            raise FormatError("record %d: truncated data" % index)
        payload = data[start:start + length]
        (data_crc,) = struct.unpack("<I", data[start + length:start + length + 4])
        if data_crc != masked_crc32c(payload):
            raise FormatError("record %d: data crc mismatch" % index)
        yield payload
        pos = start + length + 4
        index += 1


def parse(data):
    file_version = None
    scalars = []
    for payload in records(data):
        wall_time, step, summary = 0.0, 0, None
        for field, wire, value in fields(payload):
            if field == 1:
                expect_wire(field, wire, 1, "Event.wall_time")
                (wall_time,) = struct.unpack("<d", value)
            elif field == 2:
                expect_wire(field, wire, 0, "Event.step")
                step = value - (1 << 64) if value >= (1 << 63) else value
            elif field == 3:
                expect_wire(field, wire, 2, "Event.file_version")
                file_version = value.decode("utf-8")
            elif field == 5:
                expect_wire(field, wire, 2, "Event.summary")
                summary = value
        if summary is None:
            continue
        for field, wire, value in fields(summary):
            if field != 1:
                continue
            expect_wire(field, wire, 2, "Summary.value")
            tag, simple_value = None, None
            for vfield, vwire, vvalue in fields(value):
                if vfield == 1:
                    expect_wire(vfield, vwire, 2, "Value.tag")
                    tag = vvalue.decode("utf-8")
                elif vfield == 2:
                    expect_wire(vfield, vwire, 5, "Value.simple_value")
                    (simple_value,) = struct.unpack("<f", vvalue)
            if tag is None or simple_value is None:
                raise FormatError("Summary.Value without tag or simple_value")
            scalars.append({"tag": tag, "step": step, "value": simple_value,
                            "wall_time": wall_time})
    return {"file_version": file_version, "scalars": scalars}


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: read_tfevents.py EVENTS_FILE\n")
        return 2
    with open(argv[1], "rb") as f:
        data = f.read()
    if crc32c(b"123456789") != 0xE3069283:
        sys.stderr.write("read_tfevents: own crc32c is wrong\n")
        return 3
    try:
        result = parse(data)
    except (FormatError, UnicodeDecodeError) as error:
        sys.stderr.write("read_tfevents: %s: %s\n" % (argv[1], error))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
