"""nymph python runner shim: python3 shim.py MODULE QUALNAME

Reads msgpack args from $NYMPH_ARGS_PATH, imports MODULE, calls QUALNAME
(dict args as **kwargs, list args as *args, no args as f(), anything else as
a single positional), and writes the msgpack-encoded return value to
$NYMPH_RESULT_PATH. An exception is written as {type, message, traceback}
JSON to $NYMPH_ERROR_PATH and the shim exits 1.

It carries its own msgpack codec so that it needs nothing beyond the
standard library.
"""

import importlib
import json
import os
import struct
import sys
import traceback


class MsgpackError(ValueError):
    pass


def packb(obj):
    out = bytearray()
    _pack(obj, out, 0)
    return bytes(out)


def _pack(obj, out, depth):
    if depth > 512:
        raise MsgpackError("value nested too deeply to encode")
    if obj is None:
        out.append(0xC0)
    elif obj is True:
        out.append(0xC3)
    elif obj is False:
        out.append(0xC2)
    elif isinstance(obj, int):
        _pack_int(obj, out)
    elif isinstance(obj, float):
        out.append(0xCB)
        out += struct.pack(">d", obj)
    elif isinstance(obj, str):
        b = obj.encode("utf-8", "surrogatepass")
        n = len(b)
        if n < 32:
            out.append(0xA0 | n)
        elif n < 0x100:
            out += struct.pack(">BB", 0xD9, n)
        elif n < 0x10000:
            out += struct.pack(">BH", 0xDA, n)
        else:
            out += struct.pack(">BI", 0xDB, n)
        out += b
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        b = bytes(obj)
        n = len(b)
        if n < 0x100:
            out += struct.pack(">BB", 0xC4, n)
        elif n < 0x10000:
            out += struct.pack(">BH", 0xC5, n)
        else:
            out += struct.pack(">BI", 0xC6, n)
        out += b
    elif isinstance(obj, (list, tuple)):
        n = len(obj)
        if n < 16:
            out.append(0x90 | n)
        elif n < 0x10000:
            out += struct.pack(">BH", 0xDC, n)
        else:
            out += struct.pack(">BI", 0xDD, n)
        for item in obj:
            _pack(item, out, depth + 1)
    elif isinstance(obj, dict):
        n = len(obj)
        if n < 16:
            out.append(0x80 | n)
        elif n < 0x10000:
            out += struct.pack(">BH", 0xDE, n)
        else:
            out += struct.pack(">BI", 0xDF, n)
        for k, v in obj.items():
            _pack(k, out, depth + 1)
            _pack(v, out, depth + 1)
    else:
        raise TypeError("cannot msgpack-encode a value of type %s" % type(obj).__name__)


def _pack_int(n, out):
    if 0 <= n < 0x80:
        out.append(n)
    elif -32 <= n < 0:
        out.append(n & 0xFF)
    elif 0 <= n < 0x100:
        out += struct.pack(">BB", 0xCC, n)
    elif 0 <= n < 0x10000:
        out += struct.pack(">BH", 0xCD, n)
    elif 0 <= n < 0x100000000:
        out += struct.pack(">BI", 0xCE, n)
    elif 0 <= n < 0x10000000000000000:
        out += struct.pack(">BQ", 0xCF, n)
    elif -0x80 <= n < 0:
        out += struct.pack(">Bb", 0xD0, n)
    elif -0x8000 <= n < 0:
        out += struct.pack(">Bh", 0xD1, n)
    elif -0x80000000 <= n < 0:
        out += struct.pack(">Bi", 0xD2, n)
    elif -0x8000000000000000 <= n < 0:
        out += struct.pack(">Bq", 0xD3, n)
    else:
        raise OverflowError("integer %d does not fit in 64 bits" % n)


def unpackb(data):
    data = memoryview(data)
    obj, pos = _unpack(data, 0, 0)
    if pos != len(data):
        raise MsgpackError("%d trailing bytes after the msgpack value" % (len(data) - pos))
    return obj


def _take(data, pos, n):
    end = pos + n
    if end > len(data):
        raise MsgpackError("truncated msgpack data")
    return data[pos:end], end


_FIXED = {
    0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
    0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
    0xCA: ">f", 0xCB: ">d",
}


def _unpack(data, pos, depth):
    if depth > 512:
        raise MsgpackError("msgpack value nested too deeply")
    b, pos = _take(data, pos, 1)
    t = b[0]
    if t <= 0x7F:
        return t, pos
    if t >= 0xE0:
        return t - 0x100, pos
    if 0x80 <= t <= 0x8F:
        return _unpack_map(data, pos, t & 0x0F, depth)
    if 0x90 <= t <= 0x9F:
        return _unpack_array(data, pos, t & 0x0F, depth)
    if 0xA0 <= t <= 0xBF:
        raw, pos = _take(data, pos, t & 0x1F)
        return _str(raw), pos
    if t == 0xC0:
        return None, pos
    if t == 0xC2:
        return False, pos
    if t == 0xC3:
        return True, pos
    if t in _FIXED:
        fmt = _FIXED[t]
        raw, pos = _take(data, pos, struct.calcsize(fmt))
        return struct.unpack(fmt, raw)[0], pos
    if t in (0xC4, 0xC5, 0xC6, 0xD9, 0xDA, 0xDB):
        fmt = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}[t]
        raw, pos = _take(data, pos, struct.calcsize(fmt))
        n = struct.unpack(fmt, raw)[0]
        raw, pos = _take(data, pos, n)
        if t in (0xC4, 0xC5, 0xC6):
            return bytes(raw), pos
        return _str(raw), pos
    if t in (0xDC, 0xDD):
        fmt = ">H" if t == 0xDC else ">I"
        raw, pos = _take(data, pos, struct.calcsize(fmt))
        return _unpack_array(data, pos, struct.unpack(fmt, raw)[0], depth)
    if t in (0xDE, 0xDF):
        fmt = ">H" if t == 0xDE else ">I"
        raw, pos = _take(data, pos, struct.calcsize(fmt))
        return _unpack_map(data, pos, struct.unpack(fmt, raw)[0], depth)
    raise MsgpackError("unsupported msgpack type byte 0x%02x" % t)


def _str(raw):
    return bytes(raw).decode("utf-8", "surrogateescape")


def _unpack_array(data, pos, n, depth):
    out = []
    for _ in range(n):
        item, pos = _unpack(data, pos, depth + 1)
        out.append(item)
    return out, pos


def _unpack_map(data, pos, n, depth):
    out = {}
    for _ in range(n):
        k, pos = _unpack(data, pos, depth + 1)
        v, pos = _unpack(data, pos, depth + 1)
        if isinstance(k, list):
            k = tuple(k)
        out[k] = v
    return out, pos


def _resolve(module_name, qualname):
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _call(fn, raw):
    if len(raw) == 0:
        return fn()
    args = unpackb(raw)
    if isinstance(args, dict) and all(isinstance(k, str) for k in args):
        return fn(**args)
    if isinstance(args, list):
        return fn(*args)
    return fn(args)


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: shim.py MODULE QUALNAME\n")
        return 2
    module_name, qualname = sys.argv[1], sys.argv[2]
    try:
        with open(os.environ["NYMPH_ARGS_PATH"], "rb") as f:
            raw = f.read()
        fn = _resolve(module_name, qualname)
        result = packb(_call(fn, raw))
    except Exception as e:
        err = {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
        with open(os.environ["NYMPH_ERROR_PATH"], "w") as f:
            json.dump(err, f)
        return 1
    with open(os.environ["NYMPH_RESULT_PATH"], "wb") as f:
        f.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
