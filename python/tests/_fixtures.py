"""Shared by the Python tests: fixture paths and the golden references, read with json + numpy
(the safetensors format is an 8-byte little-endian header length, a JSON header, then raw data)."""

import functools
import json
import os
import pathlib
import struct

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("GDN_FIXTURES_DIR", REPO / "tests" / "fixtures"))
MODELS = ["qwen35_tied", "qwen35_cond_mtp", "qwen35_cond_mtp_single", "qwen35_f32params", "qwen3next_dense"]
# Absolute tolerance on logits against transformers in float32, as tests/test_model_fixtures.cpp.
LOGIT_TOLERANCE = 2e-3

_DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "F16": np.float16, "U8": np.uint8}


def model_dir(name):
    return str(FIXTURES / "models" / name)


def reference_name(model):
    return "qwen35_cond_mtp" if model == "qwen35_cond_mtp_single" else model


def read_safetensors(path):
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data, dtype=_DTYPES[info["dtype"]], count=(end - begin) // np.dtype(_DTYPES[info["dtype"]]).itemsize,
                                  offset=base + begin).reshape(info["shape"])
    return out


@functools.lru_cache(maxsize=None)
def reference(model):
    return read_safetensors(FIXTURES / "reference" / (reference_name(model) + ".safetensors"))


def library_path():
    path = os.environ.get("GDN_LIBRARY") or str(REPO / "build" / "lib" / "libgdn.so")
    if not os.path.exists(path):
        raise FileNotFoundError(f"libgdn.so not found at {path} (set GDN_LIBRARY)")
    return path
