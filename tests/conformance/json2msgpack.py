#!/usr/bin/env python3
"""Converts a JSON file to MessagePack, with the standard library only:
the C conformance runner reads scenarios.json this way (msgpack-c is
already a dependency; a JSON library for C would be one more).

    json2msgpack.py IN.json OUT.msgpack"""

import json
import struct
import sys


def pack(v, out: bytearray) -> None:
    if v is None:
        out += b"\xc0"
    elif v is True:
        out += b"\xc3"
    elif v is False:
        out += b"\xc2"
    elif isinstance(v, int):
        if 0 <= v < 0x80:
            out += struct.pack("B", v)
        elif -32 <= v < 0:
            out += struct.pack("b", v)
        elif v >= 0:
            out += b"\xcf" + struct.pack(">Q", v)
        else:
            out += b"\xd3" + struct.pack(">q", v)
    elif isinstance(v, float):
        out += b"\xcb" + struct.pack(">d", v)
    elif isinstance(v, str):
        b = v.encode()
        out += b"\xdb" + struct.pack(">I", len(b)) + b
    elif isinstance(v, list):
        out += b"\xdd" + struct.pack(">I", len(v))
        for e in v:
            pack(e, out)
    elif isinstance(v, dict):
        out += b"\xdf" + struct.pack(">I", len(v))
        for k, e in v.items():
            pack(k, out)
            pack(e, out)
    else:
        raise TypeError(f"cannot pack {v!r}")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        value = json.load(f)
    out = bytearray()
    pack(value, out)
    with open(sys.argv[2], "wb") as f:
        f.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
