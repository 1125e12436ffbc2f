"""Token files read and written the way nanoGPT and llm.c do, with nothing but struct.

  token_windows.py write PATH FORMAT COUNT   tokens (i * 7919) % 50257, FORMAT nanogpt or llmc
  token_windows.py read PATH BLOCK INDEX...  window INDEX (BLOCK + 1 tokens from INDEX * BLOCK)
"""
import struct
import sys

LLMC_MAGIC = 20240520


def tokens_of(path):
    data = open(path, "rb").read()
    if len(data) >= 4 and struct.unpack_from("<i", data, 0)[0] == LLMC_MAGIC:
        header = struct.unpack_from("<256i", data, 0)
        assert header[1] == 1, header[1]
        return struct.unpack_from("<%dH" % header[2], data, 1024)
    return struct.unpack_from("<%dH" % (len(data) // 2), data, 0)


def main():
    if sys.argv[1] == "write":
        path, layout, count = sys.argv[2], sys.argv[3], int(sys.argv[4])
        tokens = [(i * 7919) % 50257 for i in range(count)]
        with open(path, "wb") as out:
            if layout == "llmc":
                header = [0] * 256
                header[0], header[1], header[2] = LLMC_MAGIC, 1, count
                out.write(struct.pack("<256i", *header))
            out.write(struct.pack("<%dH" % count, *tokens))
    else:
        path, block = sys.argv[2], int(sys.argv[3])
        tokens = tokens_of(path)
        for index in sys.argv[4:]:
            start = int(index) * block
            print(" ".join(str(t) for t in tokens[start:start + block + 1]))


main()
