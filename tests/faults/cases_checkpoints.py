#!/usr/bin/python3
"""Malformed Hugging Face checkpoints for `analyze --checkpoint DIR [--tokens FILE]` and
`archs --checkpoint DIR`: each exits 2 with one stderr line `gradflow: error: ...` that names the file
at fault (its basename: model.safetensors, model-0000K-of-00002.safetensors,
model.safetensors.index.json, config.json, tokens.txt), the tensor in single quotes when the problem
is about one tensor, the position and the id for a bad token; prints nothing on stdout and writes
nothing (-o out.json is not left behind).

The checkpoints are made here with the standard library and numpy (no torch, no `safetensors`
package): a tiny Llama (hidden 16, 2 layers, 2 heads, 1 KV head, FFN 24, vocab 11, untied) in F32
and BF16, single-file and in two shards, and a tiny GPT-2 (n_embd 16, 2 layers, 2 heads, 16
positions, tied). Each case breaks one thing of a valid one.

Usage: cases_checkpoints.py GRADFLOW_BINARY      run the table
       cases_checkpoints.py --self-test          check the fixtures (no binary needed): the valid
                                                 checkpoints are valid, every broken one is broken in
                                                 exactly the intended way, every regex matches a
                                                 plausible message and not one naming another culprit
       cases_checkpoints.py --dump DIR           write the valid checkpoints to DIR/{llama-f32,
                                                 llama-bf16,llama-sharded,gpt2} to try by hand
"""
import dataclasses
import json
import math
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_table import Case, run_table  # noqa: E402

# =====================================================================================================
# The valid checkpoints

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 24, "vocab_size": 11,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 32, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "initializer_range": 0.02, "torch_dtype": "float32",
}
GPT2_CONFIG = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 2,
    "n_positions": 16, "n_ctx": 16, "n_inner": None, "vocab_size": 11, "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new", "initializer_range": 0.02,
}
TOKENS = "1 2 3 4 5 6\n"
META = {"format": "pt"}
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")

# safetensors dtypes and their element sizes (huggingface/safetensors, src/tensor.rs `Dtype`)
DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
READABLE = {"F32", "BF16", "F16", "F64"}  # the floating dtypes a checkpoint's weights may come in


def llama_shapes(config):
    """(required [(name, shape)] in Hugging Face's order, optional names) of a Llama config."""
    h, heads, inter, vocab = (config["hidden_size"], config["num_attention_heads"], config["intermediate_size"],
                              config["vocab_size"])
    kv, head_dim = config.get("num_key_value_heads", heads), h // heads
    shapes = [("model.embed_tokens.weight", [vocab, h])]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes += [(p + "input_layernorm.weight", [h]),
                   (p + "self_attn.q_proj.weight", [heads * head_dim, h]),
                   (p + "self_attn.k_proj.weight", [kv * head_dim, h]),
                   (p + "self_attn.v_proj.weight", [kv * head_dim, h]),
                   (p + "self_attn.o_proj.weight", [h, heads * head_dim]),
                   (p + "post_attention_layernorm.weight", [h]),
                   (p + "mlp.gate_proj.weight", [inter, h]),
                   (p + "mlp.up_proj.weight", [inter, h]),
                   (p + "mlp.down_proj.weight", [h, inter])]
    shapes.append(("model.norm.weight", [h]))
    head = [("lm_head.weight", [vocab, h])]
    if config.get("tie_word_embeddings", False):   # LlamaConfig's default: untied
        return shapes, dict(head)
    return shapes + head, {}


def gpt2_shapes(config):
    """The same for GPT-2: Conv1D weights are stored (in, out); the head is tied to wte."""
    n, vocab = config["n_embd"], config["vocab_size"]
    inner = config.get("n_inner") or 4 * n
    shapes = [("wte.weight", [vocab, n]), ("wpe.weight", [config["n_positions"], n])]
    for layer in range(config["n_layer"]):
        p = f"h.{layer}."
        shapes += [(p + "ln_1.weight", [n]), (p + "ln_1.bias", [n]),
                   (p + "attn.c_attn.weight", [n, 3 * n]), (p + "attn.c_attn.bias", [3 * n]),
                   (p + "attn.c_proj.weight", [n, n]), (p + "attn.c_proj.bias", [n]),
                   (p + "ln_2.weight", [n]), (p + "ln_2.bias", [n]),
                   (p + "mlp.c_fc.weight", [n, inner]), (p + "mlp.c_fc.bias", [inner]),
                   (p + "mlp.c_proj.weight", [inner, n]), (p + "mlp.c_proj.bias", [n])]
    shapes += [("ln_f.weight", [n]), ("ln_f.bias", [n])]
    head = [("lm_head.weight", [vocab, n])]
    if config.get("tie_word_embeddings", True):   # GPT2Config's default: tied
        return shapes, dict(head)
    return shapes + head, {}


FAMILIES = {"llama": llama_shapes, "gpt2": gpt2_shapes}


def initial_values(shapes, seed):
    """name -> float32 array: norm scales 1, norm biases 0, everything else N(0, 0.02^2)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in shapes:
        norm = "norm" in name or ".ln_" in name or name.startswith("ln_")
        if norm:
            arrays[name] = (np.zeros if name.endswith(".bias") else np.ones)(shape, dtype=np.float32)
        else:
            arrays[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return arrays


def encode(array, dtype):
    """Little-endian bytes of a float32 array as F32, or as BF16 (the upper 16 bits of each float32)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "F32":
        return array.astype("<f4").tobytes()
    if dtype == "BF16":
        return (array.view(np.uint32) >> 16).astype("<u2").tobytes()
    raise ValueError(dtype)


def decode(raw, dtype):
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4")
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    raise ValueError(dtype)


@dataclasses.dataclass
class T:
    """One tensor of a safetensors file as the writer lays it out (and the knobs to break it)."""
    name: str
    dtype: str
    shape: list
    data: bytes
    key: str = None         # the header key when not the name (two entries under one key)
    gap_before: int = 0     # bytes of no tensor written before this one's data
    stored: bool = True     # False: the data section holds no bytes for it (the entry points elsewhere)
    patch: object = None    # callable(entry, placed) editing the header entry, or returning its replacement;
    #                         placed: name -> data_offsets of the tensors before


def tensors_of(config, dtype="F32", seed=0, edit=None):
    """The valid tensors of a config, in Hugging Face's order; edit(arrays) may change values first."""
    shapes, _ = FAMILIES[config["model_type"]](config)
    arrays = initial_values(shapes, seed)
    if edit:
        edit(arrays)
    return [T(name, dtype, list(shape), encode(arrays[name], dtype)) for name, shape in shapes]


def object_text(pairs):
    """JSON object text from (key, value) pairs, keeping repeated keys (json.dumps of a dict cannot)."""
    return "{" + ",".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in pairs) + "}"


def pack(tensors, *, metadata=META, header=None, length=None, tail=b"", cut=None):
    """safetensors bytes: u64 LE header length, the header padded with spaces to a multiple of 8, the data.
    header: replaces the header text (str or bytes); length: the u64 written instead of the true one;
    tail: bytes after the last tensor; cut: keep only the first `cut` bytes of the file."""
    pairs = [("__metadata__", metadata)] if metadata is not None else []
    data, placed = bytearray(), {}
    for t in tensors:
        data += b"\0" * t.gap_before
        begin = len(data)
        if t.stored:
            data += t.data
        entry = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [begin, begin + len(t.data)]}
        if t.patch:
            entry = t.patch(entry, placed) or entry
        placed[t.name] = entry.get("data_offsets") if isinstance(entry, dict) else None
        pairs.append((t.key or t.name, entry))
    text = object_text(pairs) if header is None else header
    text = text.encode() if isinstance(text, str) else text
    text += b" " * (-len(text) % 8)
    blob = struct.pack("<Q", len(text) if length is None else length) + text + bytes(data) + tail
    return blob if cut is None else blob[:cut]


def vary(tensors, name, **changes):
    """The tensors with `name`'s fields changed."""
    assert any(t.name == name for t in tensors), name
    return [dataclasses.replace(t, **changes) if t.name == name else t for t in tensors]


def without(tensors, name):
    assert any(t.name == name for t in tensors), name
    return [t for t in tensors if t.name != name]


def with_after(tensors, after, extra):
    i = [t.name for t in tensors].index(after)
    return tensors[:i + 1] + [extra] + tensors[i + 1:]


def config_text(config, **changes):
    return json.dumps({**config, **changes}, indent=2)


def single(tensors=None, *, config=LLAMA_CONFIG, tokens=TOKENS, blob=None, **pack_options):
    """A single-file checkpoint ck/ as a Case's files."""
    if blob is None:
        blob = pack(tensors if tensors is not None else tensors_of(config), **pack_options)
    files = {"ck/config.json": config_text(config), "ck/model.safetensors": blob}
    if tokens is not None:
        files["ck/tokens.txt"] = tokens
    return files


def split(tensors):
    """The tensors in two shards: the embedding and layer 0, then layer 1, the final norm and the head."""
    first = [t for t in tensors if t.name == "model.embed_tokens.weight" or t.name.startswith("model.layers.0.")]
    return first, [t for t in tensors if t not in first]


def index_text(shards, weight_map=None, pairs=None):
    """model.safetensors.index.json for {shard file: tensors}; weight_map replaces the map, pairs its text."""
    total = sum(len(t.data) for ts in shards.values() for t in ts)
    if weight_map is None:
        weight_map = {t.name: file for file, ts in shards.items() for t in ts}
        weight_map = dict(sorted(weight_map.items()))
    body = object_text(pairs) if pairs is not None else json.dumps(weight_map, indent=2)
    return '{\n  "metadata": {"total_size": %d},\n  "weight_map": %s\n}\n' % (total, body)


def sharded(shards=None, *, index=None, drop=(), blobs=None, config=LLAMA_CONFIG, tokens=TOKENS):
    """A two-shard checkpoint ck/: shards {file: tensors} (default: the Llama split), the index text,
    shard files to leave out, blobs {file: bytes} replacing a shard's bytes."""
    if shards is None:
        shards = dict(zip(SHARDS, split(tensors_of(config))))
    files = {"ck/config.json": config_text(config),
             "ck/model.safetensors.index.json": index if index is not None else index_text(shards)}
    for file, ts in shards.items():
        if file not in drop:
            files[f"ck/{file}"] = (blobs or {}).get(file) or pack(ts)
    if tokens is not None:
        files["ck/tokens.txt"] = tokens
    return files


LLAMA = tensors_of(LLAMA_CONFIG)
LLAMA_BF16 = tensors_of(LLAMA_CONFIG, "BF16")
GPT2 = tensors_of(GPT2_CONFIG)
VALID = {
    "llama-f32": single(LLAMA),
    "llama-bf16": single(LLAMA_BF16),
    "llama-sharded": sharded(),
    "gpt2": single(GPT2, config=GPT2_CONFIG),
}
LLAMA_BLOB = VALID["llama-f32"]["ck/model.safetensors"]
(HEADER_LENGTH,) = struct.unpack("<Q", LLAMA_BLOB[:8])
HEADER_TEXT = LLAMA_BLOB[8:8 + HEADER_LENGTH]
DATA_BYTES = sum(len(t.data) for t in LLAMA)

# =====================================================================================================
# The reference reader: every defect of a checkpoint directory, for the self-test (not the binary's
# order of checks: the binary stops at the first, which these fixtures make the only one)


def _pairs_hook(duplicates):
    def hook(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                duplicates.append(key)
            seen.add(key)
        return dict(pairs)
    return hook


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_safetensors(blob, file):
    """(entries {name: (dtype, shape, bytes) or None when the entry is bad}, defects). entries is None
    when the file as a whole cannot be read."""
    if len(blob) < 8:
        return None, {("file shorter than 8 bytes", file)}
    (length,) = struct.unpack("<Q", blob[:8])
    if length < 2:
        return None, {("header length below 2", file)}
    if 8 + length > len(blob):
        return None, {("header past the end of the file", file)}
    duplicates = []
    try:
        header = json.loads(blob[8:8 + length].decode("utf-8"), object_pairs_hook=_pairs_hook(duplicates))
    except (UnicodeDecodeError, ValueError):
        return None, {("header not JSON", file)}
    if not isinstance(header, dict):
        return None, {("header not an object", file)}
    if duplicates:
        return None, {("header names a tensor twice", file, name) for name in duplicates}
    data = blob[8 + length:]
    entries, defects, spans = {}, set(), []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                defects.add(("__metadata__ not a map of strings", file))
            continue
        entries[name] = None
        if not isinstance(entry, dict):
            defects.add(("entry not an object", file, name))
            continue
        missing = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
        for key in missing:
            defects.add((f"entry without {key}", file, name))
        if missing:
            continue
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZE:
            defects.add(("unknown dtype", file, name))
            continue
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            defects.add(("shape not a list of counts", file, name))
            continue
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
            defects.add(("data_offsets not two counts", file, name))
            continue
        begin, end = offsets
        if end < begin:
            defects.add(("end before begin", file, name))
            continue
        if end > len(data):
            defects.add(("tensor past the end of the data", file, name))
            continue
        if end - begin != math.prod(shape) * DTYPE_SIZE[dtype]:
            defects.add(("byte count not shape x dtype size", file, name))
            continue
        if dtype not in READABLE:
            defects.add(("dtype not a float gradflow reads", file, name))
            continue
        spans.append((begin, end, name))
        entries[name] = (dtype, shape, data[begin:end])
    if defects:
        return entries, defects
    # the data section: covered exactly, in order (what the official loader's validate() demands)
    position = 0
    for begin, end, name in sorted(spans, key=lambda s: (s[0], s[1])):
        if begin > position:
            defects.add(("bytes of no tensor before", file, name))
        elif begin < position:
            defects.add(("overlaps the tensor before", file, name))
        position = max(position, end)
    if position < len(data):
        defects.add(("bytes of no tensor after the last", file))
    return entries, defects


def checkpoint_defects(files, args):
    """The set of defects of the case's files for a command line (analyze or archs)."""
    defects = set()
    if "--arch" in args:
        defects.add(("--arch with --checkpoint",))
    ck = args[args.index("--checkpoint") + 1]
    within = {path[len(ck) + 1:]: content for path, content in files.items() if path.startswith(ck + "/")}
    config = None
    if ck in files:
        defects.add(("checkpoint not a directory", ck))
    elif not within:
        defects.add(("no checkpoint directory", ck))
    elif "config.json" not in within:
        defects.add(("no file", "config.json"))
    else:
        try:
            config = json.loads(within["config.json"])
        except ValueError:
            defects.add(("not JSON", "config.json"))
        if config is not None and config.get("model_type") not in FAMILIES:
            defects.add(("model_type gradflow does not read", "config.json", config.get("model_type")))
            config = None
    complete = config is not None   # every tensor was read: the model-level checks apply
    found = {}                      # name -> {file: entry}
    weight_map = None
    if "model.safetensors" in within:
        weight_files = ["model.safetensors"]
        if "model.safetensors.index.json" in within:   # which is stale? gradflow refuses to guess
            defects.add(("single file and index both present", "model.safetensors.index.json"))
    elif "model.safetensors.index.json" in within:
        duplicates = []
        try:
            index = json.loads(within["model.safetensors.index.json"], object_pairs_hook=_pairs_hook(duplicates))
        except ValueError:
            index = None
            defects.add(("not JSON", "model.safetensors.index.json"))
        if index is not None and not (isinstance(index, dict) and isinstance(index.get("weight_map"), dict)
                                      and all(isinstance(f, str) for f in index["weight_map"].values())):
            defects.add(("no weight_map of names to files", "model.safetensors.index.json"))
            index = None
        for name in duplicates:
            defects.add(("index maps a tensor twice", "model.safetensors.index.json", name))
        weight_map = index["weight_map"] if index is not None else None
        weight_files = sorted(set(weight_map.values())) if weight_map is not None else []
        for file in [f for f in weight_files if f in ("", ".", "..") or "/" in f or "\\" in f]:
            defects.add(("index maps to a path, not a file name", "model.safetensors.index.json", file))
            weight_files.remove(file)
            complete = False
        complete = complete and weight_map is not None
    else:
        weight_files = []
        if "pytorch_model.bin" in within or "pytorch_model.bin.index.json" in within:
            defects.add(("only a pickle checkpoint", ck))
        elif within:
            defects.add(("no model.safetensors nor index", ck))
        complete = False
    for file in weight_files:
        if file not in within:
            defects.add(("no file", file))
            complete = False
            continue
        entries, file_defects = read_safetensors(within[file], file)
        defects |= file_defects
        if entries is None:
            complete = False
            continue
        for name, entry in entries.items():
            found.setdefault(name, {})[file] = entry
    if weight_map is not None:
        for name, file in weight_map.items():
            if file in within and name not in found.get(name, {}) and file not in found.get(name, {}):
                defects.add(("index puts it in a shard that lacks it", file, name))
        for name, where in found.items():
            if name not in weight_map:
                defects.add(("tensor in a shard the index does not list", name))
            elif len(where) > 1:
                defects.add(("tensor in two shards", name))
    if complete:
        shapes, optional = FAMILIES[config["model_type"]](config)
        expected = dict(shapes)
        for name, shape in expected.items():
            if name not in found:
                defects.add(("missing tensor", name))
        for name, where in found.items():
            shape = expected.get(name, optional.get(name))
            if shape is None:
                defects.add(("unknown tensor", name))
                continue
            for entry in where.values():
                if entry is None:
                    continue                   # already a defect of its file
                dtype, got, raw = entry
                if got != shape:
                    defects.add(("shape disagrees with config.json", name))
                elif not np.isfinite(decode(raw, dtype)).all():
                    defects.add(("non-finite value", name))
    if args[0] == "analyze" and "--tokens" in args:
        path = args[args.index("--tokens") + 1]
        if path not in files:
            defects.add(("no file", os.path.basename(path)))
        else:
            words = files[path].split()
            vocab = (config or {}).get("vocab_size")
            for position, word in enumerate(words):
                if not re.fullmatch(r"-?[0-9]+", word):
                    defects.add(("token not an integer", position, word))
                    break
                if int(word) < 0 or (vocab is not None and int(word) >= vocab) or int(word) >= 2 ** 63:
                    defects.add(("token id out of range", position, word))
                    break
            else:
                if len(words) < 2:
                    defects.add(("fewer than 2 tokens", len(words)))
                elif config and config["model_type"] == "gpt2" and len(words) > config["n_positions"]:
                    defects.add(("more tokens than n_positions", len(words)))
    return defects


def tensor_changes(base, broken):
    """The names whose (key, dtype, shape, bytes) differ between two readable safetensors files."""
    def table(blob):
        (length,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + length])
        data = blob[8 + length:]
        out = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = e["data_offsets"]
                raw = data[begin:end] if 0 <= begin <= end else None
            except (KeyError, TypeError, ValueError):
                raw = None
            out[name] = (json.dumps(e.get("dtype")) if isinstance(e, dict) else None,
                         json.dumps(e.get("shape")) if isinstance(e, dict) else None, raw)
        return out
    a, b = table(base), table(broken)
    return {name for name in a.keys() | b.keys() if a.get(name) != b.get(name)}


# =====================================================================================================
# The cases

ANALYZE = ["analyze", "--checkpoint", "ck", "--tokens", "ck/tokens.txt", "-q", "-o", "out.json"]
ARCHS = ["archs", "--checkpoint", "ck"]

SINGLE = r"(?<![\w-])model\.safetensors(?!\.index)"
SHARD1 = r"model-00001-of-00002\.safetensors"
SHARD2 = r"model-00002-of-00002\.safetensors"
INDEX = r"model\.safetensors\.index\.json"
CONFIG = r"config\.json"
TOKENS_FILE = r"tokens\.txt"


def says(*parts):
    """The one stderr line: the prefix, then every part somewhere after it, in any order."""
    return "^gradflow: error: " + "".join(f"(?=.*{p})" for p in parts)


def tensor(name):
    return "'" + re.escape(name) + "'"


def either(*alternatives):
    return "(?:" + "|".join(alternatives) + ")"


def number(text):
    return r"(?<![\w.+-])" + re.escape(str(text)) + r"(?![\w.])"


def position(n):
    return rf"position {n}\b"


CASES = []
META_OF = {}   # case name -> what the self-test checks


def add(name, files, message, *, expect, example, culprits=(), args=ANALYZE, changed=None, base=LLAMA_BLOB,
        check=None):
    """expect: the defects the reference reader must find, and nothing else; example: a message the
    binary could print, which the regex must match, and must stop matching when any culprit (a substring
    of the example) is replaced; changed: the tensors that differ from the valid file `base` (None: not
    compared); check: a further assertion on the files."""
    CASES.append(Case(name, list(args), message, files=files))
    META_OF[name] = dict(expect=set(expect), example=example, culprits=list(culprits), args=list(args),
                         changed=changed, base=base, check=check)


K1 = "model.layers.1.self_attn.k_proj.weight"
V1 = "model.layers.1.self_attn.v_proj.weight"
LAST = LLAMA[-1].name   # lm_head.weight
F = "model.safetensors"


def require(predicate, what):
    """A check: predicate(files) must hold, else `what` is the failure."""
    def check(files):
        assert predicate(files), what
    return check


def last_end_check(files, path="ck/model.safetensors"):
    blob = files[path]
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    last_end = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
    assert len(blob) < 8 + n + last_end, "not truncated"
    assert blob == LLAMA_BLOB[:len(blob)] or path != "ck/model.safetensors", "not a prefix of the valid file"


# ---- the container: the 8-byte length, the header, the data section -------------------------------
TRUNCATED = single(blob=LLAMA_BLOB[:-100])
# A download or copy cut short: the last tensor's bytes run past the end of the file. Reading it
# blindly (mmap, or a read that returns short) gives garbage or a crash.
add("truncated data section", TRUNCATED, says(SINGLE),
    expect={("tensor past the end of the data", F, LAST)},
    example="gradflow: error: ck/model.safetensors: truncated: 'lm_head.weight' ends at byte 5248 of the "
            "data section, which holds 5148", culprits=["model.safetensors"], check=last_end_check)
# archs reads the same files: it must refuse the same file, not describe a model it cannot load.
add("archs: truncated data section", TRUNCATED, says(SINGLE), args=ARCHS,
    expect={("tensor past the end of the data", F, LAST)},
    example="gradflow: error: ck/model.safetensors: truncated", culprits=["model.safetensors"],
    check=last_end_check)
# The first 8 bytes promise a header longer than the file: reading N bytes would read past the end.
add("header length past the end of the file", single(LLAMA, length=len(LLAMA_BLOB)), says(SINGLE),
    expect={("header past the end of the file", F)},
    example="gradflow: error: ck/model.safetensors: header length 5888 runs past the end of the file (5888 bytes)",
    culprits=["model.safetensors"],
    check=require(lambda f: struct.unpack("<Q", f["ck/model.safetensors"][:8])[0] + 8 > len(f["ck/model.safetensors"]),
                  "the header length fits the file"))
# 2^64 - 1: 8 + N wraps around in u64 arithmetic, and allocating N bytes up front throws bad_alloc
# (which must not escape as an uncaught exception or exit 1).
add("header length 2^64-1", single(LLAMA, length=2 ** 64 - 1), says(SINGLE),
    expect={("header past the end of the file", F)},
    example="gradflow: error: ck/model.safetensors: header length 18446744073709551615 runs past the end of the file",
    culprits=["model.safetensors"])
# N = 0: no header at all ("{}" is the shortest); an empty JSON text must not be parsed as an object.
add("header length zero", single(LLAMA, length=0), says(SINGLE),
    expect={("header length below 2", F)},
    example="gradflow: error: ck/model.safetensors: header length 0 (a header is at least '{}')",
    culprits=["model.safetensors"])
# N = 1: a header that cannot hold "{}".
add("header length one", single(LLAMA, length=1), says(SINGLE),
    expect={("header length below 2", F)},
    example="gradflow: error: ck/model.safetensors: header length 1", culprits=["model.safetensors"])
# Fewer than 8 bytes: not even the length; a reader that reads 8 bytes unchecked uses garbage.
add("file shorter than 8 bytes", single(blob=LLAMA_BLOB[:5]), says(SINGLE),
    expect={("file shorter than 8 bytes", F)},
    example="gradflow: error: ck/model.safetensors: 5 bytes, shorter than the 8-byte header length",
    culprits=["model.safetensors"])
# An empty file (a failed download leaves one): the same refusal, not a crash on a zero-length mmap.
add("empty safetensors file", single(blob=b""), says(SINGLE),
    expect={("file shorter than 8 bytes", F)},
    example="gradflow: error: ck/model.safetensors: empty file", culprits=["model.safetensors"])
BROKEN_JSON = HEADER_TEXT.rstrip()[:-1]          # the closing brace gone (the length still fits)
# A header that is not JSON: the parse error must be the file's, not an uncaught nlohmann exception.
add("header not JSON", single(LLAMA, header=BROKEN_JSON, length=HEADER_LENGTH), says(SINGLE),
    expect={("header not JSON", F)},
    example="gradflow: error: ck/model.safetensors: header is not valid JSON: parse error at byte 1184",
    culprits=["model.safetensors"])
add("archs: header not JSON", single(LLAMA, header=BROKEN_JSON, length=HEADER_LENGTH), says(SINGLE), args=ARCHS,
    expect={("header not JSON", F)},
    example="gradflow: error: ck/model.safetensors: header is not valid JSON", culprits=["model.safetensors"])
# A header that is JSON but not an object: .items() on an array is an nlohmann type_error.
add("header JSON an array", single(LLAMA, header="[1,2]", length=8), says(SINGLE),
    expect={("header not an object", F)},
    example="gradflow: error: ck/model.safetensors: the header is a JSON array, not an object",
    culprits=["model.safetensors"])
# Invalid UTF-8 in a tensor name: the format says UTF-8 JSON; the official loader refuses it.
BAD_UTF8 = HEADER_TEXT.replace(b"model.norm.weight", b"model.norm.w\xffight")
add("header not UTF-8", single(LLAMA, header=BAD_UTF8, length=HEADER_LENGTH), says(SINGLE),
    expect={("header not JSON", F)},
    example="gradflow: error: ck/model.safetensors: header is not valid JSON: invalid UTF-8 byte at byte 1010",
    culprits=["model.safetensors"])
# Two entries under one name: nlohmann keeps the last, so one tensor would silently read another's
# bytes (here k_proj would read v_proj's) and the other's bytes belong to no tensor.
DUPLICATE = single(vary(LLAMA, V1, key=K1))
add("duplicate tensor name in the header", DUPLICATE, says(SINGLE, tensor(K1)),
    expect={("header names a tensor twice", F, K1)},
    example=f"gradflow: error: ck/model.safetensors: the header names '{K1}' twice",
    culprits=["model.safetensors", K1],
    check=require(lambda f: f["ck/model.safetensors"].count(json.dumps(K1).encode()) == 2,
                  "the name is not there twice"))

# ---- one header entry malformed: name the tensor ----------------------------------------------------
UP0 = "model.layers.0.mlp.up_proj.weight"
# Each missing key: nlohmann's at() would throw out_of_range with no tensor named.
for key, victim in [("data_offsets", UP0), ("dtype", "model.layers.1.input_layernorm.weight"),
                    ("shape", "model.layers.0.self_attn.q_proj.weight")]:
    drop_key = (lambda key: lambda e, _: {k: v for k, v in e.items() if k != key})(key)
    add(f"entry without {key}", single(vary(LLAMA, victim, patch=drop_key)),
        says(SINGLE, tensor(victim), re.escape(key)),
        expect={(f"entry without {key}", F, victim)},
        example=f"gradflow: error: ck/model.safetensors: '{victim}' has no {key}",
        culprits=["model.safetensors", victim, key], changed={victim})
# An entry that is not an object at all ("model.norm.weight": [1, 2]): entry["dtype"] on an array
# is an nlohmann type_error.
NORM = "model.norm.weight"
add("entry not an object", single(vary(LLAMA, NORM, patch=lambda e, _: [1, 2])),
    says(SINGLE, tensor(NORM)),
    expect={("entry not an object", F, NORM)},
    example=f"gradflow: error: ck/model.safetensors: '{NORM}' is not an object with dtype, shape and data_offsets",
    culprits=["model.safetensors", NORM], changed={NORM})
# Offsets far past the file (2^62): begin + size must be compared, not used; the last tensor is the one
# moved, so every plausible check (bounds, coverage, ordering) blames the same tensor.
FAR = 2 ** 62
add("offsets out of bounds", single(vary(LLAMA, LAST, stored=False,
                                         patch=lambda e, _: e.update(data_offsets=[FAR, FAR + 704]))),
    says(SINGLE, tensor(LAST)),
    expect={("tensor past the end of the data", F, LAST)},
    example=f"gradflow: error: ck/model.safetensors: '{LAST}' data_offsets [{FAR}, {FAR + 704}] lie past the "
            "end of the data section (4544 bytes)", culprits=["model.safetensors", LAST], changed={LAST})
# A negative offset: nlohmann's get<uint64_t>() on -64 silently wraps to 2^64 - 64.
Q0 = "model.layers.0.self_attn.q_proj.weight"
add("negative offset", single(vary(LLAMA, Q0, patch=lambda e, _: e.update(
        data_offsets=[-64, e["data_offsets"][1]]))), says(SINGLE, tensor(Q0)),
    expect={("data_offsets not two counts", F, Q0)},
    example=f"gradflow: error: ck/model.safetensors: '{Q0}' data_offsets must be two byte offsets, not [-64, 1216]",
    culprits=["model.safetensors", Q0], changed={Q0})
# end < begin: end - begin underflows to a huge size in unsigned arithmetic.
O1 = "model.layers.1.self_attn.o_proj.weight"
add("end before begin", single(vary(LLAMA, O1, patch=lambda e, _: e.update(data_offsets=e["data_offsets"][::-1]))),
    says(SINGLE, tensor(O1)),
    expect={("end before begin", F, O1)},
    example=f"gradflow: error: ck/model.safetensors: '{O1}' data_offsets end 3776 before begin 2752",
    culprits=["model.safetensors", O1], changed={O1})
# The byte count disagrees with shape x dtype size (68 bytes for 16 F32 values): reading shape-many
# values would misalign every tensor after it if offsets were recomputed from shapes.
add("byte count not shape x dtype size", single(vary(LLAMA, NORM, data=LLAMA[-2].data + b"\0\0\0\0")),
    says(SINGLE, tensor(NORM)),
    expect={("byte count not shape x dtype size", F, NORM)},
    example=f"gradflow: error: ck/model.safetensors: '{NORM}' holds 68 bytes, shape [16] of F32 needs 64",
    culprits=["model.safetensors", NORM], changed={NORM})
# The same in the most likely real form: a BF16 file whose header says F32 for one tensor (a
# converter that changed the dtype string but not the data).
QB = "model.layers.0.self_attn.q_proj.weight"
add("BF16 checkpoint with one entry saying F32", single(vary(LLAMA_BF16, QB, dtype="F32")),
    says(SINGLE, tensor(QB)),
    expect={("byte count not shape x dtype size", F, QB)},
    example=f"gradflow: error: ck/model.safetensors: '{QB}' holds 512 bytes, shape [16, 16] of F32 needs 1024",
    culprits=["model.safetensors", QB], changed={QB}, base=VALID["llama-bf16"]["ck/model.safetensors"])
# Two tensors on the same bytes (v_proj aliasing k_proj; the file otherwise exactly covered): each
# reads valid-looking numbers, one of them wrong.
OVERLAP = single(vary(LLAMA, V1, stored=False, patch=lambda e, placed: e.update(data_offsets=placed[K1])))
add("overlapping offsets", OVERLAP, says(SINGLE, either(tensor(K1), tensor(V1))),
    expect={("overlaps the tensor before", F, V1)},
    example=f"gradflow: error: ck/model.safetensors: '{V1}' overlaps '{K1}' (bytes 3264..3776)",
    culprits=["model.safetensors"], changed=None)
# 8 bytes that belong to no tensor: the official loader refuses it (InvalidOffset), and it is how a
# mis-recomputed offset table shows. The message names the tensor after the gap or the one before it,
# or the gap's first byte.
POST0 = "model.layers.0.post_attention_layernorm.weight"
O0 = "model.layers.0.self_attn.o_proj.weight"
GAP_AT = sum(len(t.data) for t in LLAMA[:[t.name for t in LLAMA].index(POST0)])
add("gap between tensors", single(vary(LLAMA, POST0, gap_before=8)),
    says(SINGLE, either(tensor(POST0), tensor(O0), number(GAP_AT))),
    expect={("bytes of no tensor before", F, POST0)},
    example=f"gradflow: error: ck/model.safetensors: bytes {GAP_AT}..{GAP_AT + 8} of the data belong to no "
            f"tensor (before '{POST0}')", culprits=["model.safetensors"], changed=None)
# Bytes after the last tensor: the file is longer than its header says (a concatenation, or a header
# rewritten without the data). The official loader refuses it (MetadataIncompleteBuffer).
add("bytes after the last tensor", single(LLAMA, tail=b"\0" * 16), says(SINGLE),
    expect={("bytes of no tensor after the last", F)},
    example="gradflow: error: ck/model.safetensors: 16 bytes after the last tensor belong to no tensor",
    culprits=["model.safetensors"], changed=set())

# ---- dtypes ---------------------------------------------------------------------------------------
GATE1 = "model.layers.1.mlp.gate_proj.weight"
DOWN0 = "model.layers.0.mlp.down_proj.weight"
NORM0 = "model.layers.0.input_layernorm.weight"
# A real safetensors dtype gradflow does not read (FP8 checkpoints exist): refuse by name, don't
# reinterpret the bytes. The bytes match the shape at 1 byte a value.
add("unsupported dtype F8_E4M3", single(vary(LLAMA, GATE1, dtype="F8_E4M3", data=b"\x38" * (24 * 16))),
    says(SINGLE, tensor(GATE1), "F8_E4M3"),
    expect={("dtype not a float gradflow reads", F, GATE1)},
    example=f"gradflow: error: ck/model.safetensors: '{GATE1}' is F8_E4M3; gradflow reads F32, F16 and BF16",
    culprits=["model.safetensors", GATE1, "F8_E4M3"], changed={GATE1})
# A dtype that is no safetensors dtype at all (a quantiser's own): its size is unknown.
add("unknown dtype Q4", single(vary(LLAMA, DOWN0, dtype="Q4")), says(SINGLE, tensor(DOWN0), "Q4"),
    expect={("unknown dtype", F, DOWN0)},
    example=f"gradflow: error: ck/model.safetensors: '{DOWN0}' has dtype \"Q4\", not a safetensors dtype",
    culprits=["model.safetensors", DOWN0, "Q4"], changed={DOWN0})
# An integer weight (I64, bytes consistent): valid safetensors, but no weight of these models is integral.
add("integer dtype I64 for a weight",
    single(vary(LLAMA, NORM0, dtype="I64", data=np.ones(16, dtype="<i8").tobytes())),
    says(SINGLE, tensor(NORM0), "I64"),
    expect={("dtype not a float gradflow reads", F, NORM0)},
    example=f"gradflow: error: ck/model.safetensors: '{NORM0}' is I64; gradflow reads F32, F16 and BF16",
    culprits=["model.safetensors", NORM0, "I64"], changed={NORM0})

# ---- the tensors against config.json ----------------------------------------------------------------
# k_proj with the query heads' width (16 rows) instead of the KV heads' (8): a config/checkpoint
# mismatch (GQA ignored) that would otherwise index past the weights or mis-split heads.
K_WIDE = single(vary(LLAMA, K1, shape=[16, 16], data=encode(np.full((16, 16), 0.01), "F32")))
add("k_proj with the heads' width, not the KV heads'", K_WIDE, says(either(SINGLE, CONFIG), tensor(K1)),
    expect={("shape disagrees with config.json", K1)},
    example=f"gradflow: error: ck/model.safetensors: '{K1}' has shape [16, 16]; config.json (1 KV head of 8) "
            "implies [8, 16]", culprits=[K1], changed={K1})
add("archs: k_proj with the heads' width", K_WIDE, says(either(SINGLE, CONFIG), tensor(K1)), args=ARCHS,
    expect={("shape disagrees with config.json", K1)},
    example=f"gradflow: error: ck/model.safetensors: '{K1}' has shape [16, 16]", culprits=[K1], changed={K1})
DOWN1 = "model.layers.1.mlp.down_proj.weight"
# A missing weight: without it the layer cannot be built; it must not be zero- or randomly filled.
add("missing tensor", single(without(LLAMA, DOWN1)), says(SINGLE, tensor(DOWN1)),
    expect={("missing tensor", DOWN1)},
    example=f"gradflow: error: ck/model.safetensors has no '{DOWN1}'",
    culprits=["model.safetensors", DOWN1], changed={DOWN1})
add("archs: missing tensor", single(without(LLAMA, DOWN1)), says(SINGLE, tensor(DOWN1)), args=ARCHS,
    expect={("missing tensor", DOWN1)},
    example=f"gradflow: error: ck/model.safetensors has no '{DOWN1}'",
    culprits=["model.safetensors", DOWN1], changed={DOWN1})
# tie_word_embeddings false and no lm_head: silently tying to the embedding would analyse another model.
add("untied config without lm_head", single(without(LLAMA, LAST)), says(SINGLE, tensor(LAST)),
    expect={("missing tensor", LAST)},
    example=f"gradflow: error: ck/model.safetensors has no '{LAST}' (config.json: tie_word_embeddings false)",
    culprits=["model.safetensors", LAST], changed={LAST})
# A tensor gradflow has no place for (a LoRA leftover, another architecture's weight): ignoring it
# would analyse a model other than the one stored.
EXTRA = "model.layers.0.mlp.extra_proj.weight"
add("unknown extra tensor",
    single(with_after(LLAMA, DOWN0, T(EXTRA, "F32", [24, 16], encode(np.zeros((24, 16)), "F32")))),
    says(SINGLE, tensor(EXTRA)),
    expect={("unknown tensor", EXTRA)},
    example=f"gradflow: error: ck/model.safetensors: unknown tensor '{EXTRA}'",
    culprits=["model.safetensors", EXTRA], changed={EXTRA})
# A layer past num_hidden_layers (config.json says 2, the file has a layer 2): the config and the
# weights are of different models.
L2 = "model.layers.2.input_layernorm.weight"
add("tensor of a layer past num_hidden_layers",
    single(with_after(LLAMA, NORM, T(L2, "F32", [16], encode(np.ones(16), "F32")))),
    says(SINGLE, tensor(L2)),
    expect={("unknown tensor", L2)},
    example=f"gradflow: error: ck/model.safetensors: '{L2}' is past num_hidden_layers 2 of config.json",
    culprits=["model.safetensors", L2], changed={L2})

# ---- values -------------------------------------------------------------------------------------------
UP1 = "model.layers.1.mlp.up_proj.weight"
EMBED = "model.embed_tokens.weight"
O0B = "model.layers.0.self_attn.o_proj.weight"


def set_value(name, index, value):
    def edit(arrays):
        arrays[name][index] = value
    return edit


# One NaN in one weight: every gradient figure downstream is NaN; name the tensor, not "NaN in output".
add("NaN in one weight", single(tensors_of(LLAMA_CONFIG, edit=set_value(UP1, (5, 3), np.nan))),
    says(SINGLE, tensor(UP1)),
    expect={("non-finite value", UP1)},
    example=f"gradflow: error: ck/model.safetensors: '{UP1}' holds a NaN at [5, 3]",
    culprits=["model.safetensors", UP1], changed={UP1})
# One +inf in the embedding table: the same, for the one tensor that is gathered rather than multiplied.
add("infinite weight", single(tensors_of(LLAMA_CONFIG, edit=set_value(EMBED, (7, 2), np.inf))),
    says(SINGLE, tensor(EMBED)),
    expect={("non-finite value", EMBED)},
    example=f"gradflow: error: ck/model.safetensors: '{EMBED}' holds inf at [7, 2]",
    culprits=["model.safetensors", EMBED], changed={EMBED})
# A NaN in a BF16 file: the check must run on the widened values (BF16 NaN 0x7FC0), not only on F32.
add("NaN in a BF16 checkpoint", single(tensors_of(LLAMA_CONFIG, "BF16", edit=set_value(O0B, (3, 9), np.nan))),
    says(SINGLE, tensor(O0B)),
    expect={("non-finite value", O0B)},
    example=f"gradflow: error: ck/model.safetensors: '{O0B}' holds a NaN",
    culprits=["model.safetensors", O0B], changed={O0B}, base=VALID["llama-bf16"]["ck/model.safetensors"])

# ---- sharded checkpoints --------------------------------------------------------------------------------
FIRST, SECOND = split(LLAMA)
# The index names a shard that is not there (a partial download): name the missing shard.
add("index names a missing shard", sharded(drop=[SHARDS[1]]), says(SHARD2),
    expect={("no file", SHARDS[1])},
    example=f"gradflow: error: ck/{SHARDS[1]}: no such file (named by ck/model.safetensors.index.json)",
    culprits=[SHARDS[1]])
# The weight_map puts model.norm.weight in shard 1, which does not hold it: trusting the index means a
# lookup that fails; the message names the tensor and the index or the shard it points to.
WRONG_MAP = dict(sorted({**{t.name: SHARDS[0] for t in FIRST}, **{t.name: SHARDS[1] for t in SECOND},
                         NORM: SHARDS[0]}.items()))
add("weight_map puts a tensor in a shard that lacks it",
    sharded(index=index_text(dict(zip(SHARDS, (FIRST, SECOND))), weight_map=WRONG_MAP)),
    says(tensor(NORM), either(INDEX, SHARD1)),
    expect={("index puts it in a shard that lacks it", SHARDS[0], NORM)},
    example=f"gradflow: error: ck/{SHARDS[0]} has no '{NORM}', which ck/model.safetensors.index.json puts there",
    culprits=[NORM])
# An index that is not JSON: the index's parse error, naming the index.
add("index not JSON", sharded(index=index_text(dict(zip(SHARDS, (FIRST, SECOND))))[:-40]), says(INDEX),
    expect={("not JSON", "model.safetensors.index.json")},
    example="gradflow: error: ck/model.safetensors.index.json: not valid JSON: parse error at line 31, column 2",
    culprits=["model.safetensors.index.json"])
# An index without a weight_map: a lookup in a missing object must not be an uncaught exception.
add("index without weight_map", sharded(index='{"metadata": {"total_size": %d}}\n' % DATA_BYTES),
    says(INDEX, "weight_map"),
    expect={("no weight_map of names to files", "model.safetensors.index.json")},
    example="gradflow: error: ck/model.safetensors.index.json has no weight_map object",
    culprits=["model.safetensors.index.json", "weight_map"])
# model.safetensors beside an index and its shards (a re-save next to a stale sharded copy): Hugging Face
# silently takes the single file; gradflow refuses to guess which is current, naming both.
add("single file beside an index", {**single(), **{k: v for k, v in sharded().items() if k.endswith("index.json")}},
    says("model\\.safetensors", INDEX),
    expect={("single file and index both present", "model.safetensors.index.json")},
    example="gradflow: error: --checkpoint ck: holds both model.safetensors and model.safetensors.index.json; "
            "remove the one that is stale",
    culprits=["model.safetensors.index.json"])
# model.norm.weight stored in both shards (the index says shard 2): two candidate tensors, possibly
# different; refuse rather than pick one.
add("tensor stored in two shards",
    sharded({SHARDS[0]: FIRST + [t for t in SECOND if t.name == NORM], SHARDS[1]: SECOND},
            index=index_text(dict(zip(SHARDS, (FIRST, SECOND))))),
    says(tensor(NORM), either(SHARD1, SHARD2)),
    expect={("tensor in two shards", NORM)},
    example=f"gradflow: error: ck/{SHARDS[0]}: '{NORM}' is also in ck/{SHARDS[1]} (the index puts it there)",
    culprits=[NORM])
# The weight_map lists model.norm.weight twice, once per shard (nlohmann keeps the last): ambiguous.
TWICE = ([(t.name, SHARDS[0]) for t in FIRST] + [(NORM, SHARDS[0])] + [(t.name, SHARDS[1]) for t in SECOND])
add("tensor listed twice in the weight_map",
    sharded(index=index_text(dict(zip(SHARDS, (FIRST, SECOND))), pairs=TWICE)),
    says(INDEX, tensor(NORM)),
    expect={("index maps a tensor twice", "model.safetensors.index.json", NORM)},
    example=f"gradflow: error: ck/model.safetensors.index.json: weight_map lists '{NORM}' twice",
    culprits=["model.safetensors.index.json", NORM],
    check=require(lambda f: f["ck/model.safetensors.index.json"].count(json.dumps(NORM)) == 2,
                  "the name is not there twice"))
# The weight_map sends shard 2's tensors to "../model-00002-of-00002.safetensors", and that file
# exists, outside the checkpoint: a reader that joins paths blindly loads it and succeeds. Shard
# names are file names in DIR; anything else is refused, naming the index and the path.
OUTSIDE = "../" + SHARDS[1]
add("weight_map names a file outside the directory",
    {**{k: v for k, v in sharded().items() if k != f"ck/{SHARDS[1]}"}, SHARDS[1]: pack(SECOND),
     "ck/model.safetensors.index.json": index_text(dict(zip(SHARDS, (FIRST, SECOND))), weight_map=dict(sorted(
         {**{t.name: SHARDS[0] for t in FIRST}, **{t.name: OUTSIDE for t in SECOND}}.items())))},
    says(INDEX, re.escape(OUTSIDE)),
    expect={("index maps to a path, not a file name", "model.safetensors.index.json", OUTSIDE)},
    example=f"gradflow: error: ck/model.safetensors.index.json: tensor '{NORM}' maps to {OUTSIDE}, not a file "
            "name in the directory", culprits=["model.safetensors.index.json", OUTSIDE])
# A container fault in the second shard must name that shard, not the index or shard 1.
add("second shard truncated", sharded(blobs={SHARDS[1]: pack(SECOND)[:-100]}), says(SHARD2),
    expect={("tensor past the end of the data", SHARDS[1], LAST)},
    example=f"gradflow: error: ck/{SHARDS[1]}: truncated: '{LAST}' ends past the end of the file",
    culprits=[SHARDS[1]], check=lambda f: last_end_check(f, f"ck/{SHARDS[1]}"))

# ---- config.json and the directory --------------------------------------------------------------------
NO_CONFIG = {k: v for k, v in single(LLAMA).items() if k != "ck/config.json"}
# Weights without config.json: the shapes alone do not give the heads, norms or epsilon.
add("config.json missing", NO_CONFIG, says(CONFIG),
    expect={("no file", "config.json")},
    example="gradflow: error: ck/config.json: no such file", culprits=["config.json"])
add("archs: config.json missing", NO_CONFIG, says(CONFIG), args=ARCHS,
    expect={("no file", "config.json")},
    example="gradflow: error: ck/config.json: no such file", culprits=["config.json"])
# A config.json that is not JSON: the config's parse error, naming config.json (not the weights).
add("config.json not JSON", {**single(LLAMA), "ck/config.json": config_text(LLAMA_CONFIG)[:-30]}, says(CONFIG),
    expect={("not JSON", "config.json")},
    example="gradflow: error: ck/config.json: not valid JSON: parse error at line 17, column 1",
    culprits=["config.json"])
MAMBA = {**single(LLAMA), "ck/config.json": config_text(LLAMA_CONFIG, model_type="mamba")}
# A family gradflow has no block for: refuse by name (--arch cannot rescue it: it is refused with
# --checkpoint, and the tensor names are the family's own anyway).
add("unsupported model_type mamba", MAMBA, says(CONFIG, "mamba"),
    expect={("model_type gradflow does not read", "config.json", "mamba")},
    example="gradflow: error: ck/config.json: model_type \"mamba\" is not a family gradflow reads "
            "checkpoints of (gpt2, llama, ...)", culprits=["config.json", "mamba"])
add("archs: unsupported model_type mamba", MAMBA, says(CONFIG, "mamba"), args=ARCHS,
    expect={("model_type gradflow does not read", "config.json", "mamba")},
    example="gradflow: error: ck/config.json: model_type \"mamba\" is not a family gradflow reads",
    culprits=["config.json", "mamba"])
ELSEWHERE = ["analyze", "--checkpoint", "no-such-ck", "--tokens", "tokens.txt", "-q", "-o", "out.json"]
# A mistyped directory: say which, once, not "config.json: no such file".
add("checkpoint directory does not exist", {"tokens.txt": TOKENS}, says(re.escape("no-such-ck")),
    args=ELSEWHERE, expect={("no checkpoint directory", "no-such-ck")},
    example="gradflow: error: --checkpoint no-such-ck: no such directory", culprits=["no-such-ck"])
# A file given for the directory (someone passes model.safetensors itself).
add("checkpoint is a file", {"ck": "not a directory\n", "tokens.txt": TOKENS},
    says(r"(?<![\w/.-])ck(?![\w/.-])", either("director", r"\bfile\b")),
    args=["analyze", "--checkpoint", "ck", "--tokens", "tokens.txt", "-q", "-o", "out.json"],
    expect={("checkpoint not a directory", "ck")},
    example="gradflow: error: --checkpoint ck is not a directory", culprits=["ck is", "directory"])
NO_WEIGHTS = {"ck/config.json": config_text(LLAMA_CONFIG), "ck/tokens.txt": TOKENS}
# A directory holding only config.json (a weights download that never ran): name the directory and
# what is missing.
add("config.json but no safetensors", NO_WEIGHTS, says(r"\bck\b", "safetensors"),
    expect={("no model.safetensors nor index", "ck")},
    example="gradflow: error: ck: no model.safetensors nor model.safetensors.index.json",
    culprits=["ck:", "safetensors nor model.safetensors"])
add("archs: config.json but no safetensors", NO_WEIGHTS, says(r"\bck\b", "safetensors"), args=ARCHS,
    expect={("no model.safetensors nor index", "ck")},
    example="gradflow: error: ck: no model.safetensors nor model.safetensors.index.json",
    culprits=["ck:", "safetensors nor model.safetensors"])
# A checkpoint saved as pytorch_model.bin only (a pickle; some Pythia revisions): refused by name,
# saying how to convert it, never loaded.
PICKLE_ONLY = {**NO_WEIGHTS, "ck/pytorch_model.bin": "PK\x03\x04 a pickle in a zip\n"}
PICKLE_INDEX = {**NO_WEIGHTS, "ck/pytorch_model.bin.index.json": '{"weight_map": {}}\n'}
for label, files in (("pytorch_model.bin only", PICKLE_ONLY), ("pytorch_model.bin index only", PICKLE_INDEX)):
    for prefix, args in (("", ANALYZE), ("archs: ", ARCHS)):
        add(prefix + label, files, says(r"\bck\b", "pytorch_model.bin", "pickle", "safe_serialization"),
            args=args, expect={("only a pickle checkpoint", "ck")},
            example="gradflow: error: --checkpoint ck: holds pytorch_model.bin (a pickle); convert it with "
                    "save_pretrained(OUT, safe_serialization=True)",
            culprits=["ck:", "pytorch_model.bin", "pickle", "safe_serialization"])

# ---- the tokens file -----------------------------------------------------------------------------------


def tokens_case(name, text, message, expect, example, culprits, config=LLAMA_CONFIG, tensors=LLAMA):
    add(name, single(tensors, config=config, tokens=text), message, expect=expect, example=example,
        culprits=culprits)


# id == vocab_size: the off-by-one an embedding gather reads past the table with.
tokens_case("token id equal to vocab_size", "1 2 3 11 4 5\n", says(TOKENS_FILE, position(3), number(11)),
            {("token id out of range", 3, "11")},
            "gradflow: error: ck/tokens.txt: position 3: token id 11 is not below vocab_size 11",
            ["tokens.txt", "position 3"])   # 11 is also vocab_size: the regex cannot tell them apart
# Far past the vocabulary at position 0 (the first position is an off-by-one of its own).
tokens_case("token id past vocab at position 0", "200 1 2\n", says(TOKENS_FILE, position(0), number(200)),
            {("token id out of range", 0, "200")},
            "gradflow: error: ck/tokens.txt: position 0: token id 200 is not below vocab_size 11",
            ["tokens.txt", "position 0", "200"])
# A negative id: stoul/strtoul accept "-4" and wrap it to 2^64 - 4.
tokens_case("negative token id", "1 2 -4 3\n", says(TOKENS_FILE, position(2), number(-4)),
            {("token id out of range", 2, "-4")},
            "gradflow: error: ck/tokens.txt: position 2: token id -4 is negative",
            ["tokens.txt", "position 2", "-4"])
# "12a": stoi reads 12 and ignores the rest; the whole word must be the number.
tokens_case("non-integer token", "1 12a 3\n", says(TOKENS_FILE, position(1), number("12a")),
            {("token not an integer", 1, "12a")},
            "gradflow: error: ck/tokens.txt: position 1: '12a' is not a token id",
            ["tokens.txt", "position 1", "12a"])
# 20 digits: more than 64 bits; must be refused, not wrapped or clamped to a valid id.
BIG = "99999999999999999999"
tokens_case("token id past 64 bits", f"1 2 3 4 {BIG}\n", says(TOKENS_FILE, position(4), number(BIG)),
            {("token id out of range", 4, BIG)},
            f"gradflow: error: ck/tokens.txt: position 4: token id {BIG} is not below vocab_size 11",
            ["tokens.txt", "position 4", BIG])
TOO_FEW = either(r"at least (?:2|two)", r"(?:2|two) or more", r"empty", r"no tokens?\b", r"\b0 tokens")
# An empty file: no loss at all; must not run on zero tokens (or divide by a count of 0).
tokens_case("empty tokens file", "", says(TOKENS_FILE, TOO_FEW),
            {("fewer than 2 tokens", 0)},
            "gradflow: error: ck/tokens.txt holds no tokens; the LM loss needs at least 2",
            ["tokens.txt", "no tokens; the LM loss needs at least 2"])
# Whitespace only: the same as empty once split.
tokens_case("whitespace-only tokens file", " \n\t\n  \n", says(TOKENS_FILE, TOO_FEW),
            {("fewer than 2 tokens", 0)},
            "gradflow: error: ck/tokens.txt holds no tokens; the LM loss needs at least 2",
            ["tokens.txt", "no tokens; the LM loss needs at least 2"])
# One id: the next-token loss has no target (T - 1 = 0 predictions); the message must say 2 are needed.
tokens_case("one token", "5\n", says(TOKENS_FILE, either(r"at least (?:2|two)", r"(?:2|two) or more")),
            {("fewer than 2 tokens", 1)},
            "gradflow: error: ck/tokens.txt holds 1 token; the LM loss needs at least 2",
            ["tokens.txt", "at least 2"])
# --tokens naming no file.
add("tokens file missing", {k: v for k, v in single(LLAMA).items() if k != "ck/tokens.txt"}, says(TOKENS_FILE),
    expect={("no file", "tokens.txt")},
    example="gradflow: error: ck/tokens.txt: no such file", culprits=["tokens.txt"])
# GPT-2 has learned positions: 17 tokens with n_positions 16 would read past wpe.
SEVENTEEN = " ".join(str(i % 10 + 1) for i in range(17)) + "\n"
tokens_case("more tokens than gpt2 n_positions", SEVENTEEN,
            says(TOKENS_FILE, either("n_positions", number(16))),
            {("more tokens than n_positions", 17)},
            "gradflow: error: ck/tokens.txt holds 17 tokens; GPT-2's n_positions is 16",
            ["tokens.txt", "n_positions is 16"], config=GPT2_CONFIG, tensors=GPT2)

# ---- flags ---------------------------------------------------------------------------------------------
# The placement is the model's own (config.json's family): --arch with --checkpoint is an input
# error, not a silent override and not ignored.
add("--arch with --checkpoint", single(LLAMA), says("--arch", "--checkpoint"),
    args=ANALYZE[:5] + ["--arch", "pre-ln"] + ANALYZE[5:],
    expect={("--arch with --checkpoint",)},
    example="gradflow: error: --arch pre-ln: a --checkpoint model's placement is its own (config.json's model_type)",
    culprits=["--arch", "--checkpoint"])

# ---- GPT-2 --------------------------------------------------------------------------------------------
GPT2_BLOB = VALID["gpt2"]["ck/model.safetensors"]
CATTN = "h.1.attn.c_attn.weight"
# c_attn of width 2 n_embd (q and k only): splitting it in three would read past it.
add("gpt2 c_attn with the wrong width",
    single(vary(GPT2, CATTN, shape=[16, 32], data=encode(np.full((16, 32), 0.01), "F32")), config=GPT2_CONFIG),
    says(either(SINGLE, CONFIG), tensor(CATTN)),
    expect={("shape disagrees with config.json", CATTN)},
    example=f"gradflow: error: ck/model.safetensors: '{CATTN}' has shape [16, 32]; config.json implies [16, 48]",
    culprits=[CATTN], changed={CATTN}, base=GPT2_BLOB)
# c_attn stored (out, in) as nn.Linear does, not (in, out) as GPT-2's Conv1D: the same byte count,
# transposed; reading it as Conv1D scrambles q, k and v.
add("gpt2 c_attn transposed",
    single(vary(GPT2, CATTN, shape=[48, 16]), config=GPT2_CONFIG),
    says(either(SINGLE, CONFIG), tensor(CATTN)),
    expect={("shape disagrees with config.json", CATTN)},
    example=f"gradflow: error: ck/model.safetensors: '{CATTN}' has shape [48, 16]; GPT-2's Conv1D stores [16, 48]",
    culprits=[CATTN], changed={CATTN}, base=GPT2_BLOB)
WPE = "wpe.weight"
# wpe with fewer rows than n_positions: positions past row 8 would read past the table.
add("gpt2 wpe shorter than n_positions",
    single(vary(GPT2, WPE, shape=[8, 16], data=GPT2[1].data[:8 * 16 * 4]), config=GPT2_CONFIG),
    says(either(SINGLE, CONFIG), tensor(WPE)),
    expect={("shape disagrees with config.json", WPE)},
    example=f"gradflow: error: ck/model.safetensors: '{WPE}' has shape [8, 16]; n_positions 16 implies [16, 16]",
    culprits=[WPE], changed={WPE}, base=GPT2_BLOB)


# =====================================================================================================
# Self-test and dump


def self_test():
    failures = []

    def fail(what):
        failures.append(what)
        print("FAIL", what)

    # 1. The valid checkpoints: no defect, contiguous, padded, the config's shapes, the values decoded.
    for label, files in VALID.items():
        config = json.loads(files["ck/config.json"])
        for args in (ANALYZE, ARCHS):
            found = checkpoint_defects(files, args)
            if found:
                fail(f"valid {label} ({args[0]}): {sorted(found)}")
        shapes, optional = FAMILIES[config["model_type"]](config)
        names = []
        for path, blob in sorted(files.items()):
            if not path.endswith(".safetensors"):
                continue
            (n,) = struct.unpack("<Q", blob[:8])
            header = json.loads(blob[8:8 + n])
            if n % 8 or header.get("__metadata__") != META:
                fail(f"valid {label}: {path}: header length {n} or metadata {header.get('__metadata__')}")
            position = 0
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                names.append(name)
                begin, end = entry["data_offsets"]
                if begin != position or end - begin != math.prod(entry["shape"]) * DTYPE_SIZE[entry["dtype"]]:
                    fail(f"valid {label}: {path}: {name} at [{begin}, {end}], expected from {position}")
                position = end
            if 8 + n + position != len(blob):
                fail(f"valid {label}: {path}: {len(blob)} bytes, header says {8 + n + position}")
        if sorted(names) != sorted(name for name, _ in shapes):
            fail(f"valid {label}: tensors {sorted(set(names) ^ {n for n, _ in shapes})} differ from the config's")
        if "ck/model.safetensors.index.json" in files:
            index = json.loads(files["ck/model.safetensors.index.json"])
            for name, shard in index["weight_map"].items():
                blob = files[f"ck/{shard}"]
                (n,) = struct.unpack("<Q", blob[:8])
                if name not in json.loads(blob[8:8 + n]):
                    fail(f"valid {label}: index puts {name} in {shard}, which lacks it")
            if index["metadata"]["total_size"] != DATA_BYTES:
                fail(f"valid {label}: total_size {index['metadata']['total_size']} != {DATA_BYTES}")
    # The decoded values round-trip (F32 exactly, BF16 to the upper 16 bits), and BF16 is F32 truncated.
    f32 = initial_values(llama_shapes(LLAMA_CONFIG)[0], 0)
    for t32, t16 in zip(LLAMA, LLAMA_BF16):
        a, b = decode(t32.data, "F32"), decode(t16.data, "BF16")
        if not np.array_equal(a, f32[t32.name].ravel()) or not np.array_equal(
                b.view(np.uint32), a.view(np.uint32) & 0xFFFF0000) or np.abs(b - a).max() > 0.01 * np.abs(a).max():
            fail(f"BF16/F32 encoding of {t32.name}")
    # The other helper's reader (tests/reference/safetensors_io.py, needs torch) reads the same values.
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
        import safetensors_io  # noqa: E402
        import tempfile
        with tempfile.TemporaryDirectory() as directory:
            for label in ("llama-f32", "llama-bf16", "gpt2"):
                path = os.path.join(directory, f"{label}.safetensors")
                with open(path, "wb") as handle:
                    handle.write(VALID[label]["ck/model.safetensors"])
                loaded = safetensors_io.load_file(path)
                source = {"llama-f32": LLAMA, "llama-bf16": LLAMA_BF16, "gpt2": GPT2}[label]
                for t in source:
                    got = loaded[t.name].float().numpy().ravel()
                    if list(loaded[t.name].shape) != t.shape or not np.array_equal(got, decode(t.data, t.dtype)):
                        fail(f"safetensors_io reads {label} {t.name} differently")
        print("cross-check: tests/reference/safetensors_io.py reads the valid files identically")
    except ImportError as error:
        print(f"cross-check with tests/reference/safetensors_io.py skipped ({error})")

    # 2. Each broken checkpoint: exactly the intended defects; the tensors changed are the intended ones.
    for case in CASES:
        meta = META_OF[case.name]
        found = checkpoint_defects(case.files, meta["args"])
        if found != meta["expect"]:
            fail(f"{case.name}: defects {sorted(map(str, found))}, intended {sorted(map(str, meta['expect']))}")
        if meta["changed"] is not None:
            changed = tensor_changes(meta["base"], case.files["ck/model.safetensors"])
            if changed != meta["changed"]:
                fail(f"{case.name}: tensors changed {sorted(changed)}, intended {sorted(meta['changed'])}")
        if meta["check"]:
            try:
                meta["check"](case.files)
            except AssertionError as error:
                fail(f"{case.name}: {error}")
        # 3. The regex: matches the example, and no longer when a culprit is replaced.
        message = case.message
        try:
            re.compile(message)
        except re.error as error:
            fail(f"{case.name}: regex {message!r}: {error}")
            continue
        if not re.search(message, meta["example"] + "\n"):
            fail(f"{case.name}: /{message}/ does not match its example {meta['example']!r}")
        for culprit in meta["culprits"]:
            if culprit not in meta["example"]:
                fail(f"{case.name}: culprit {culprit!r} not in the example")
            elif re.search(message, meta["example"].replace(culprit, "zz")):
                fail(f"{case.name}: /{message}/ still matches with {culprit!r} replaced")
        for other in ("gradflow: error: ck: invalid checkpoint", "gradflow: warning: " + meta["example"][17:],
                      "error: " + meta["example"][17:]):
            if re.search(message, other):
                fail(f"{case.name}: /{message}/ matches {other!r}")
    # 4. The table's own shape: the cases the brief lists are there, names unique, every case exits 2.
    names = [case.name for case in CASES]
    if len(set(names)) != len(names):
        fail("case names repeat")
    if any(case.exit != 2 for case in CASES):
        fail("a case expects an exit other than 2")
    print(f"self-test: {len(VALID)} valid checkpoints, {len(CASES)} cases, {len(failures)} problems")
    return not failures


def dump(directory):
    for label, files in VALID.items():
        for path, content in files.items():
            target = os.path.join(directory, label, os.path.relpath(path, "ck"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb" if isinstance(content, bytes) else "w") as handle:
                handle.write(content)
        print(os.path.join(directory, label))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    if sys.argv[1:2] == ["--dump"] and len(sys.argv) == 3:
        dump(sys.argv[2])
        sys.exit(0)
    run_table(CASES)
