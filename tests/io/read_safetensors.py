#!/usr/bin/env python3
# An independent safetensors reader and writer for safetensors_test, in plain Python (struct and
# json only, no torch or safetensors package), so the C++ code is checked against a second reading
# of the format spec rather than against itself.
#   read_safetensors.py FILE           prints {"metadata": {...}, "tensors": {name: {"dtype",
#                                      "shape", "sum"}}} as JSON; exits 1 with a message on a bad file
#   read_safetensors.py --write FILE   writes a small file of every dtype (the values are below)
import json
import struct
import sys

# dtype -> (struct code per element, bytes per element); BF16 is decoded by hand.
FORMATS = {
    "F64": ("d", 8),
    "F32": ("f", 4),
    "F16": ("e", 2),
    "BF16": (None, 2),
    "I64": ("q", 8),
    "I32": ("i", 4),
    "I16": ("h", 2),
    "I8": ("b", 1),
    "U8": ("B", 1),
    "BOOL": ("?", 1),
}

# What --write stores: name -> (dtype, shape, values in row-major order).
SAMPLE = {
    "weight": ("F32", [2, 3], [0.5, -1.25, 2.0, 3.75, -4.0, 100.125]),
    "bias": ("F64", [3], [0.001, -2.5, 1e10]),
    "half": ("F16", [2, 2], [0.5, -1.5, 2048.0, 0.25]),
    "brain": ("BF16", [3], [1.0, -2.0, 3.140625]),
    "step": ("I64", [], [-7]),
    "ids": ("I32", [4], [1, -2, 2147483647, -2147483648]),
    "short": ("I16", [2], [-32768, 32767]),
    "tiny": ("I8", [3], [-128, 0, 127]),
    "bytes": ("U8", [2, 2], [0, 1, 254, 255]),
    "mask": ("BOOL", [3], [True, False, True]),
    "empty": ("F32", [0, 4], []),
}
SAMPLE_METADATA = {"format": "pt", "writer": "read_safetensors.py"}


def fail(path, message):
    sys.stderr.write(f"read_safetensors.py: {path}: {message}\n")
    sys.exit(1)


def decode(dtype, raw):
    code, size = FORMATS[dtype]
    count = len(raw) // size
    if code is not None:
        return list(struct.unpack(f"<{count}{code}", raw))
    # bfloat16 is the top half of a float32.
    halves = struct.unpack(f"<{count}H", raw)
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]


def encode(dtype, values):
    code, _ = FORMATS[dtype]
    if code is not None:
        return struct.pack(f"<{len(values)}{code}", *values)
    halves = [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in values]
    return struct.pack(f"<{len(halves)}H", *halves)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail(path, "shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        fail(path, "header length larger than the file")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except ValueError as e:
        fail(path, f"header is not JSON: {e}")
    if not isinstance(header, dict):
        fail(path, "header is not an object")
    metadata = header.pop("__metadata__", {})
    buffer = data[8 + n :]
    tensors = {}
    end = 0
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, stop = info["data_offsets"]
        if begin != end:
            fail(path, f"tensor {name} does not start where the previous one ended")
        count = 1
        for dim in info["shape"]:
            count *= dim
        if stop - begin != count * FORMATS[info["dtype"]][1]:
            fail(path, f"tensor {name}: shape and dtype do not match data_offsets")
        end = stop
        values = decode(info["dtype"], buffer[begin:stop])
        tensors[name] = {
            "dtype": info["dtype"],
            "shape": info["shape"],
            "sum": float(sum(float(v) for v in values)),
        }
    if end != len(buffer):
        fail(path, "tensors do not cover the data buffer exactly")
    return {"metadata": metadata, "tensors": tensors}


def write(path):
    header = {"__metadata__": SAMPLE_METADATA}
    chunks = []
    offset = 0
    # Data in reverse name order, header keys sorted: readers must go by offsets, not key order.
    for name in sorted(SAMPLE, reverse=True):
        dtype, shape, values = SAMPLE[name]
        raw = encode(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write(sys.argv[2])
    elif len(sys.argv) == 2:
        print(json.dumps(read(sys.argv[1]), sort_keys=True))
    else:
        sys.stderr.write("usage: read_safetensors.py FILE | read_safetensors.py --write FILE\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
