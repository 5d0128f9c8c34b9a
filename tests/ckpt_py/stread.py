"""Independent reader of safetensors files and libdtensor checkpoints, for the tests: standard
library and numpy only, never our C code. Parses the safetensors layout (8-byte little-endian
header length, JSON header, contiguous data), checks it strictly as the safetensors library
does, and computes CRC32C (Castagnoli) itself."""
import json
import os
import struct

import numpy as np

# safetensors dtype names -> (numpy dtype, bytes per element). BF16 has no numpy type: it is
# kept as its raw uint16 bits (the upper half of an f32).
ST_DTYPES = {
    "F64": (np.dtype("<f8"), 8), "F32": (np.dtype("<f4"), 4), "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2), "I64": (np.dtype("<i8"), 8), "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2), "I8": (np.dtype("i1"), 1), "U8": (np.dtype("u1"), 1),
    "U16": (np.dtype("<u2"), 2), "U32": (np.dtype("<u4"), 4), "U64": (np.dtype("<u8"), 8),
    "BOOL": (np.dtype("?"), 1),
}

# libdtensor dtype names (dt_dtype_name) -> safetensors names.
DT_TO_ST = {"f32": "F32", "f64": "F64", "f16": "F16", "bf16": "BF16", "i32": "I32",
            "i64": "I64", "u8": "U8"}


class FormatError(Exception):
    pass


# ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF) ----
def _crc_tables():
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t0.append(c)
    # Slicing-by-8 tables: tk[i] = CRC of byte i followed by k zero bytes.
    tabs = [t0]
    for _ in range(7):
        prev = tabs[-1]
        tabs.append([(prev[i] >> 8) ^ t0[prev[i] & 0xFF] for i in range(256)])
    return tabs


_T = _crc_tables()


def crc32c(data, crc=0):
    """CRC32C of bytes-like `data`, continuing from a previous result `crc`."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _T
    mv = memoryview(data).cast("B")
    n = len(mv)
    c = crc ^ 0xFFFFFFFF
    i = 0
    # Eight bytes per step (slicing-by-8); the pure-Python loop is the cost here.
    words = n // 8
    if words:
        q = struct.unpack_from("<%dQ" % words, mv, 0)
        for w in q:
            x = (w ^ c) & 0xFFFFFFFFFFFFFFFF
            c = (t7[x & 0xFF] ^ t6[(x >> 8) & 0xFF] ^ t5[(x >> 16) & 0xFF]
                 ^ t4[(x >> 24) & 0xFF] ^ t3[(x >> 32) & 0xFF] ^ t2[(x >> 40) & 0xFF]
                 ^ t1[(x >> 48) & 0xFF] ^ t0[x >> 56])
        i = words * 8
    for b in mv[i:]:
        c = (c >> 8) ^ t0[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


# ---- safetensors ---------------------------------------------------------------------------
class SafeTensorsFile:
    """One parsed safetensors file: .header (tensor entries), .metadata (__metadata__ or {}),
    .data (the bytes after the header), .header_len, .path."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            raw = f.read()
        if len(raw) < 8:
            raise FormatError(f"{path}: {len(raw)} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack_from("<Q", raw, 0)
        if 8 + n > len(raw):
            raise FormatError(f"{path}: header length {n} runs past the end ({len(raw)} bytes)")
        self.header_len = n
        text = raw[8:8 + n]
        try:
            hdr = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise FormatError(f"{path}: header is not UTF-8 JSON: {e}")
        if not isinstance(hdr, dict):
            raise FormatError(f"{path}: header is not a JSON object")
        if not text.startswith(b"{"):
            raise FormatError(f"{path}: header must start with '{{'")
        self.metadata = hdr.pop("__metadata__", {}) or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.metadata.items()):
            raise FormatError(f"{path}: __metadata__ must map strings to strings")
        self.header = hdr
        self.data = memoryview(raw)[8 + n:]
        self._check()

    def _check(self):
        """The rules the safetensors library enforces: known dtypes, byte sizes that match the
        shapes, data offsets contiguous from 0 to the end of the file, no overlap, no gap."""
        spans = []
        for name, e in self.header.items():
            for k in ("dtype", "shape", "data_offsets"):
                if k not in e:
                    raise FormatError(f"{self.path}: tensor '{name}' has no '{k}'")
            if e["dtype"] not in ST_DTYPES:
                raise FormatError(f"{self.path}: tensor '{name}': unknown dtype {e['dtype']}")
            b, end = e["data_offsets"]
            numel = 1
            for s in e["shape"]:
                if not isinstance(s, int) or s < 0:
                    raise FormatError(f"{self.path}: tensor '{name}': bad shape {e['shape']}")
                numel *= s
            if end - b != numel * ST_DTYPES[e["dtype"]][1]:
                raise FormatError(f"{self.path}: tensor '{name}': {end - b} bytes for shape "
                                  f"{e['shape']} {e['dtype']}")
            spans.append((b, end, name))
        spans.sort()
        pos = 0
        for b, end, name in spans:
            if b != pos:
                raise FormatError(f"{self.path}: tensor '{name}' starts at {b}, expected {pos} "
                                  "(data must be contiguous)")
            pos = end
        if pos != len(self.data):
            raise FormatError(f"{self.path}: data holds {len(self.data)} bytes, tensors cover "
                              f"{pos}")

    def raw(self, name):
        b, end = self.header[name]["data_offsets"]
        return self.data[b:end]

    def array(self, name):
        e = self.header[name]
        dt, _ = ST_DTYPES[e["dtype"]]
        return np.frombuffer(self.raw(name), dtype=dt).reshape(e["shape"])


def bf16_bits_to_f32(bits):
    """BF16 raw bits (uint16 array) -> float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 values exactly representable in bf16 -> their bf16 bits."""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def list_files(d):
    return sorted(f for f in os.listdir(d) if not f.startswith("."))
