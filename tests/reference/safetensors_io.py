"""Minimal reader / writer of the safetensors format (no dependency on the `safetensors` package).

Layout (huggingface/safetensors, README "Format"): 8-byte little-endian u64 N, then N bytes of a
UTF-8 JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian tensor bytes; offsets are relative to the first byte after the header.
The official writer pads the header with spaces so the data section starts 8-byte aligned.
"""
import json
import struct

import numpy as np
import torch

# safetensors dtype string -> (torch dtype, bytes per element). BF16 has no numpy type: it is moved
# through int16 and reinterpreted with Tensor.view(torch.bfloat16).
DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
TORCH_TO_NAME = {torch_dtype: name for name, (torch_dtype, _) in DTYPES.items()}
HEADER_ALIGNMENT = 8


def tensor_bytes(tensor):
    """Raw little-endian bytes of a tensor, row-major (C order)."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.numpy().astype(tensor.numpy().dtype.newbyteorder("<"), copy=False).tobytes()


def serialize(tensors, metadata=None):
    """Bytes of a safetensors file holding `tensors` (a dict, written in its iteration order)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in TORCH_TO_NAME:
            raise ValueError(f"tensor {name!r}: dtype {tensor.dtype} has no safetensors name")
        blob = tensor_bytes(tensor)
        header[name] = {"dtype": TORCH_TO_NAME[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * ((HEADER_ALIGNMENT - len(header_bytes) % HEADER_ALIGNMENT) % HEADER_ALIGNMENT)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(blobs)


def save_file(tensors, path, metadata=None):
    """Write `tensors` (dict name -> torch.Tensor) to `path`, contiguously in the order given."""
    with open(path, "wb") as handle:
        handle.write(serialize(tensors, metadata))


def read_header(path):
    """(header dict, byte offset of the data section) of a safetensors file."""
    with open(path, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len).decode("utf-8"))
    return header, 8 + header_len


def load_file(path, with_metadata=False):
    """dict name -> torch.Tensor (in the file's dtype; BF16 as torch.bfloat16), header order.

    Checks what a careful reader must: offsets inside the file, byte counts matching the shape.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len].decode("utf-8"))
    data = memoryview(raw)[8 + header_len:]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        torch_dtype, itemsize = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64)) if info["shape"] else 1
        if not 0 <= begin <= end <= len(data) or end - begin != count * itemsize:
            raise ValueError(f"{path}: tensor {name!r} has inconsistent data_offsets {info['data_offsets']}")
        chunk = bytes(data[begin:end])
        if torch_dtype == torch.bfloat16:
            array = np.frombuffer(chunk, dtype="<i2").copy()
            tensor = torch.from_numpy(array).view(torch.bfloat16)
        elif torch_dtype == torch.bool:
            tensor = torch.from_numpy(np.frombuffer(chunk, dtype=np.uint8).copy()).to(torch.bool)
        else:
            np_dtype = torch.empty((), dtype=torch_dtype).numpy().dtype.newbyteorder("<")
            tensor = torch.from_numpy(np.frombuffer(chunk, dtype=np_dtype).astype(np_dtype.newbyteorder("="))
                                      .copy())
        tensors[name] = tensor.reshape(info["shape"])
    return (tensors, metadata) if with_metadata else tensors
