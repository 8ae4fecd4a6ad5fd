#!/usr/bin/python3
"""Reads a ZeRO-Pipe checkpoint with h5py (no ZeRO-Pipe code) and prints what it sees as JSON.

Run by tests/mpi/test_checkpoint_file.cpp with Debian's /usr/bin/python3 (python3-h5py):
    h5py_reads_checkpoint.py FILE  ->  {"format": 1, "attrs": {...}, "datasets": {path: {...}}}

Per dataset: the numpy dtype h5py chose, the shape, every value as float, whether the stored bytes
of every recorded slice match its "slice_checksums" crc32 (zlib), and for bf16 (HDF5 user-defined
16-bit float, 8 exponent bits) whether h5py's float32 conversion equals the bf16 bit pattern shifted
into a float32, i.e. exact. h5py 3.7 / HDF5 1.10.8 read the bf16 type as float32 and our f16 type
as float16.
"""
import json
import sys
import zlib

import h5py
import numpy as np


def raw_bytes(ds):
    """The dataset's stored bytes (file dtype, little-endian), flattened, as unsigned integers."""
    ftype = ds.id.get_type()
    size = ftype.get_size()
    raw = np.empty(ds.shape, dtype={1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}[size])
    if raw.size:
        ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=ftype)
    return raw.reshape(-1), ftype


def attr_value(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def main(path):
    out = {"datasets": {}, "attrs": {}}
    with h5py.File(path, "r") as f:
        out["format"] = int(f.attrs["zeropipe_format"])
        out["attrs"] = {k: attr_value(v) for k, v in f.attrs.items()}

        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            raw, ftype = raw_bytes(obj)
            values = obj[...].astype(np.float64).reshape(-1)
            entry = {"dtype": str(obj.dtype), "shape": list(obj.shape), "values": values.tolist()}
            rows = obj.attrs.get("slice_checksums")
            if rows is not None:
                rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
                entry["crc_ok"] = bool(all(
                    zlib.crc32(raw[off:off + cnt].tobytes()) == (int(crc) & 0xFFFFFFFF)
                    for off, cnt, crc in rows))
            if isinstance(ftype, h5py.h5t.TypeFloatID) and ftype.get_size() == 2 and ftype.get_fields()[2] == 8:
                as_f32 = (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                entry["bf16_exact"] = bool(np.array_equal(as_f32, values, equal_nan=True))
            out["datasets"]["/" + name] = entry

        f.visititems(visit)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
