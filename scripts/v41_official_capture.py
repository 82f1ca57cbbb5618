#!/usr/bin/env python3
"""Run DeepSeek's official V4.1 inference code (a folder holding run_official.py, its CPU kernel port and
the official inference/ files) on a preset, and convert its capture (.npz) into a safetensors file the
C++ side reads (ced::read_safetensors): docs/v41.md §9.4.

Run it with the python of a venv that has torch, numpy and safetensors (scripts/v41-official-compare.sh
passes both paths). Writes OUT (safetensors) holding, as F32 / I32 / I8 tensors:
  input_ids [N], logits_last [V] (the official Transformer.forward's), logits [N, V] (the official
  head op, F.linear(final_normed.float(), head.float()), over every position), layer{i}_in,
  layer{i}_engram_in [N, hc, dim], layer{i}_pre_mix [N, hc], layer{i}_engram_hash_ids [N, cols],
  layer{i}_topk_idxs [N, k], layer{i}_compress_kv, layer{i}_index_k, layer{i}_candidates (I8),
  final_collapsed, final_normed [N, dim]; layer{i}_attn_x, _attn_out, _ffn_x, _ffn_out [N, dim] (each
  Attention's and MoE's input and output), layer{i}_latent (a kv source's compressor output, before RoPE),
  layer{i}_gate_experts / _gate_weights [N, k] (ascending expert id), layer{i}_attn_q [N, H, hd],
  _attn_kv [rows, hd], _attn_idx [N, k], _attn_o [N, H, hd] (sparse_attn's inputs and output); engram_token_map [V]; engram_multipliers_hi/_lo
  [layers, max_ngram] (the int64 multipliers as two 32-bit halves); rope_{swa,compressed}_{cos,sin}
  [N, rope_head_dim / 2] (the official precompute_freqs_cis). Metadata: the official run's JSON line,
  the weights file's path and the .npz's meta.

With --checkpoint DIR (a folder `ced export` wrote) and an OUT ending in .h5 it writes instead the v41 run
file of docs/v41.md §12, the layout `ced run --out` writes: the golden files of golden/v41/ (regenerated
by scripts/v41-official-golden.sh).

With --decode-steps K (run files only) the tokens are N + K this script draws (torch.randint over the
vocabulary from --input-seed); the official code prefills the first N and then runs the other K as
decode steps (Transformer.forward with start_pos N, N + 1, ...: the path of generate.py), and the
run file gains /decode: the seed the decode started from (every layer's window ring and compressor
group after the prefill), and per step the layers' captures, the final collapse and the logits.
"""
import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", required=True, help="the folder holding run_official.py")
    ap.add_argument("--out", required=True, help="the safetensors file to write")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--mode", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--n", type=int, default=17)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--input-seed", type=int, default=0)
    ap.add_argument("--checkpoint", help="run this release-layout folder instead of a preset")
    ap.add_argument("--config-name", help="with --checkpoint: the built-in the folder was exported from")
    ap.add_argument("--weight-seed", type=int, help="with --checkpoint: the --weight-seed it was exported with")
    ap.add_argument("--lean", action="store_true",
                    help="leave sparse_attn's query and output out of a run file "
                         "(the gate then judges sparse_attn and the output projection by budgets)")
    ap.add_argument("--decode-steps", type=int, default=0,
                    help="after the prefill of N tokens, K teacher-forced decode steps (run files)")
    ap.add_argument("--tokens", help="the prompt's ids (whitespace-separated, at least N; the first N taken) instead "
                    "of the --input-seed draw: the stress prompts of docs/v41.md §13.12 (`ced spans --stress N` prints "
                    "them)")
    ap.add_argument("--boost", action="append", default=[],
                    help="with --checkpoint: a `ced export --boost TENSOR=K` it was exported with (recorded)")
    args = ap.parse_args()
    to_h5 = args.out.endswith(".h5")
    if to_h5 and not (args.checkpoint and args.config_name and args.weight_seed is not None):
        raise SystemExit("v41_official_capture.py: an .h5 run file needs --checkpoint, --config-name and --weight-seed")

    if args.decode_steps and (not to_h5 or args.decode_steps < 0):
        raise SystemExit("v41_official_capture.py: --decode-steps K needs an .h5 run file and K > 0")

    official = Path(args.official).resolve()
    out = Path(args.out).resolve()
    import tempfile
    # The official driver's own .npz: beside a safetensors OUT (the compare script reads both), in a
    # temporary folder for a run file.
    scratch = tempfile.TemporaryDirectory()  # removed when main returns
    npz = Path(scratch.name) / "capture.npz" if to_h5 else out.with_suffix(".npz")

    import io
    import contextlib

    import numpy as np
    import torch
    from safetensors.numpy import save_file

    sys.path.insert(0, str(official))
    import run_official as RO  # noqa: E402  the official folder's driver, run in this process

    # Sublayer captures, by global module hooks (the official files stay untouched): each Attention's and
    # MoE's input and output, each Compressor's latent (before Attention rotates it in place) and each
    # Gate's choice, keyed by the layer the enclosing Attention / MoE belongs to.
    extra, current = {}, {"moe": None, "attn": None}
    # During the decode steps every capture goes to that step's dict instead of the prefill's.
    decode = {"phase": "prefill", "steps": [], "seed": {}}

    def sink():
        return extra if decode["phase"] != "decode" else decode["steps"][-1]

    def pre_hook(mod, inp):
        if type(mod).__name__ == "MoE":
            current["moe"] = mod.layer_id
        elif type(mod).__name__ == "Attention":
            current["attn"] = mod.layer_id

    def post_hook(mod, inp, outp):
        name = type(mod).__name__
        extra = sink()
        if name == "Attention":
            extra[f"layer{mod.layer_id}_attn_x"] = inp[0][0].float().numpy().copy()
            extra[f"layer{mod.layer_id}_attn_out"] = outp[0].float().numpy().copy()
        elif name == "MoE":
            extra[f"layer{mod.layer_id}_ffn_x"] = inp[0][0].float().numpy().copy()
            extra[f"layer{mod.layer_id}_ffn_out"] = outp[0].float().numpy().copy()
        elif name == "Gate" and current["moe"] is not None:
            w, idx = outp
            order = idx.argsort(dim=-1)
            extra[f"layer{current['moe']}_gate_experts"] = idx.gather(-1, order).numpy().astype(np.int32)
            extra[f"layer{current['moe']}_gate_weights"] = w.gather(-1, order).float().numpy().copy()
        elif name == "Compressor" and outp is not None:
            extra[f"layer{current['attn']}_latent"] = outp[0].float().numpy().copy()
        elif name == "Transformer" and decode["phase"] == "prefill" and args.decode_steps:
            run_decode_steps(mod, inp)

    # sparse_attn's inputs and output per layer: model.py calls the kernel module's function through its
    # own global, so observing it means wrapping that global once the module is loaded (observation
    # only: the run's logits sha256 is the same with and without it).
    load_official = RO.load_official

    def load_and_observe(*a, **k):
        M, K = load_official(*a, **k)
        kernel_sparse_attn = M.sparse_attn

        def observed(q, kv, attn_sink, idx, scale):
            o = kernel_sparse_attn(q, kv, attn_sink, idx, scale)
            L, extra = current["attn"], sink()
            extra[f"layer{L}_attn_idx"] = idx[0].numpy().astype(np.int32)
            extra[f"layer{L}_attn_q"] = q[0].float().numpy().copy()
            extra[f"layer{L}_attn_o"] = o[0].float().numpy().copy()
            if decode["phase"] != "decode":  # a step's rows are the whole ring and cache: left out
                extra[f"layer{L}_attn_kv"] = kv[0].float().numpy().copy()
            return o

        M.sparse_attn = observed

        # Each block's hc mixes (pre, post, comb of its attention, then of its FFN), the Sinkhorn's outputs
        # the gate feeds to hc_post (docs/sound-bounds.md §14.2): observed as sparse_attn is.
        block_mixes = M.Block.hc_mixes

        def observed_mixes(block, x, hc_fn, hc_scale, hc_base):
            mixes = block_mixes(block, x, hc_fn, hc_scale, hc_base)
            part, extra = ("attn" if hc_fn is block.hc_attn_fn else "ffn"), sink()
            for name, v in zip(("pre", "post", "comb"), mixes):
                extra[f"layer{block.layer_id}_{part}_{name}"] = v[0].float().numpy().copy()
            return mixes

        M.Block.hc_mixes = observed_mixes
        return M, K

    RO.load_official = load_and_observe

    def step_pre_hook(mod, inp):
        # The captures run_official.py's own hooks make of a prefill, for a decode step.
        name, extra = type(mod).__name__, sink()
        if name == "Block":
            extra[f"layer{mod.layer_id}_in"] = inp[0][0].float().numpy().copy()
            extra[f"layer{mod.layer_id}_pre_mix"] = inp[2][0].float().numpy().copy()
        elif name == "Engram":
            extra[f"layer{mod.layer_id}_engram_in"] = inp[0][0].float().numpy().copy()
            extra[f"layer{mod.layer_id}_engram_hash_ids"] = inp[1][0].numpy().copy()
        elif name == "RMSNorm" and mod is decode["model"].norm:
            extra["final_collapsed"] = inp[0][0].float().numpy().copy()

    def step_post_hook(mod, inp, outp):
        name, extra = type(mod).__name__, sink()
        if name == "Indexer":
            extra[f"layer{current['attn']}_topk_idxs"] = outp[0].numpy().astype(np.int32)
        elif name == "RMSNorm" and mod is decode["model"].norm:
            extra["final_normed"] = outp[0].float().numpy().copy()

    def run_decode_steps(model, inp):
        """Called when the prefill's Transformer.forward returns: record the seed, then run the decode
        steps with the driver's own hooks set aside (they would overwrite the prefill's captures) and
        the shared candidate pool put back afterwards (the driver reads the prefill's after the call)."""
        import torch
        n0 = inp[0].size(1)
        decode["model"] = model
        for i, layer in enumerate(model.layers):
            attn = layer.attn
            decode["seed"][f"layer{i}_window"] = attn.window_kv_cache[0].float().numpy().copy()
            comp = attn.compressor
            if comp is not None and attn.compress_ratio > 1:
                decode["seed"][f"layer{i}_kv_state"] = comp.kv_state[0].float().numpy().copy()
                decode["seed"][f"layer{i}_score_state"] = comp.score_state[0].float().numpy().copy()
        shared = sys.modules["v41_official_model"].shared_attn
        candidates = shared.candidates
        cand_src = [i for i, layer in enumerate(model.layers)
                    if layer.attn.indexer is not None and layer.attn.indexer.is_candidate_source]
        stash = [(m, dict(m._forward_pre_hooks), dict(m._forward_hooks)) for m in model.modules()]
        for m, _, _ in stash:
            m._forward_pre_hooks.clear()
            m._forward_hooks.clear()
        h3 = torch.nn.modules.module.register_module_forward_pre_hook(step_pre_hook)
        h4 = torch.nn.modules.module.register_module_forward_hook(step_post_hook)
        decode["phase"] = "decode"
        for s, tok in enumerate(decode["tokens"]):
            decode["steps"].append({})
            _, logits, _ = model(torch.tensor([[tok]], dtype=torch.long), n0 + s)
            step = decode["steps"][-1]
            step["logits"] = logits.float().numpy().copy()  # [1, V]: the head of the one position
            if shared.candidates is not None and cand_src:
                step[f"layer{cand_src[0]}_candidates"] = shared.candidates[0].numpy().astype(np.uint8)
        decode["phase"] = "done"
        h3.remove()
        h4.remove()
        for m, pre, post in stash:
            m._forward_pre_hooks.update(pre)
            m._forward_hooks.update(post)
        shared.candidates = candidates


    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    h2 = torch.nn.modules.module.register_module_forward_hook(post_hook)
    source = ["--checkpoint", str(Path(args.checkpoint).resolve())] if args.checkpoint else ["--preset", args.preset]
    argv = source + ["--mode", args.mode, "--n", str(args.n), "--threads", str(args.threads),
            "--input-seed", str(args.input_seed), "--out", str(npz)]
    if args.tokens:
        if args.decode_steps:
            raise SystemExit("v41_official_capture.py: --tokens and --decode-steps: give one")
        argv = source + ["--mode", args.mode, "--n", str(args.n), "--tokens", str(Path(args.tokens).resolve()),
                         "--threads", str(args.threads), "--out", str(npz)]
    if args.decode_steps:
        # The whole prompt drawn here; the driver prefills its first N - K from a token file, with room in
        # its caches (max_seq_len) for the steps.
        cfg = json.loads((Path(args.checkpoint) / "inference" / "config.json").read_text())
        total = args.n + args.decode_steps
        ids = torch.randint(0, cfg["vocab_size"], (total,), generator=torch.Generator().manual_seed(args.input_seed))
        ids = ids.tolist()
        decode["tokens"] = ids[args.n:]
        tok_file = Path(scratch.name) / "prompt.txt"
        tok_file.write_text(" ".join(map(str, ids[:args.n])))
        argv = source + ["--mode", args.mode, "--tokens", str(tok_file), "--threads", str(args.threads),
                         "--set", f"max_seq_len={total}", "--out", str(npz)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = RO.main(argv)
    h1.remove()
    h2.remove()
    if rc != 0:
        raise SystemExit(f"run_official.py {' '.join(argv)}: exit {rc}")
    line = json.loads(buf.getvalue().strip().splitlines()[-1])
    M = sys.modules["v41_official_model"]
    if args.decode_steps and len(decode["steps"]) != args.decode_steps:
        raise SystemExit(f"v41_official_capture.py: {len(decode['steps'])} decode steps ran, {args.decode_steps} asked")
    from engram import compute_hash_multipliers  # noqa: E402  the official inference/engram.py

    d = np.load(npz)
    meta = json.loads(str(d["meta"]))
    margs = meta["model_args"]
    t = {}
    t["input_ids"] = d["input_ids"][0].astype(np.int32)
    t["logits_last"] = d["logits"][0].astype(np.float32)
    for k in d.files:
        if k in ("meta", "logits", "input_ids"):
            continue
        v = d[k][0]
        if v.dtype == np.uint8:
            t[k] = v.astype(np.int8)
        elif v.dtype.kind in "iu":
            t[k] = v.astype(np.int32)
        else:
            t[k] = v.astype(np.float32)

    from safetensors import safe_open
    weights = Path(line["weights"])
    if weights.is_dir():  # a folder: the shard the index names for head.weight
        index = json.loads((weights / "model.safetensors.index.json").read_text())
        weights = weights / index["weight_map"]["head.weight"]
    with safe_open(str(weights), "pt") as f:
        head = f.get_tensor("head.weight").float()
    with torch.no_grad():
        t["logits"] = torch.nn.functional.linear(torch.from_numpy(t["final_normed"]).float(), head).numpy()

    n = len(t["input_ids"])  # the prefill's rows
    if margs["engram_layer_ids"]:
        vocab = margs["vocab_size"]
        t["engram_token_map"] = (np.arange(vocab) // 2).astype(np.int32)  # run_official's StubTokenizer
        mult = compute_hash_multipliers(tuple(margs["engram_layer_ids"]), margs["engram_max_ngram_size"],
                                        margs["engram_compressed_vocab_size"]).numpy().astype(np.int64)
        t["engram_multipliers_hi"] = (mult >> 32).astype(np.int32)
        t["engram_multipliers_lo"] = (mult & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    with torch.no_grad():
        torch.set_default_dtype(torch.float32)
        for kind, (orig, theta) in {"swa": (0, margs["rope_theta"]),
                                    "compressed": (margs["original_seq_len"], margs["compress_rope_theta"])}.items():
            fc = M.precompute_freqs_cis(margs["rope_head_dim"], n, orig, theta, margs["rope_factor"],
                                        margs["beta_fast"], margs["beta_slow"])
            t[f"rope_{kind}_cos"] = fc.real.contiguous().numpy().astype(np.float32)
            t[f"rope_{kind}_sin"] = fc.imag.contiguous().numpy().astype(np.float32)
    t.update(extra)
    t = {k: np.ascontiguousarray(v) for k, v in t.items()}
    if to_h5:
        write_run_file(out, t, line, meta, args, official, decode if args.decode_steps else None)
        print(json.dumps({"out": str(out), "weights": line["weights"], "logits_sha256": line["logits_sha256"]}))
        return 0
    save_file(t, str(out), metadata={"run": json.dumps(line), "weights": line["weights"],
                                     "meta": json.dumps(meta), "format": "ced-v41-official-capture 1"})
    print(json.dumps({"out": str(out), "weights": line["weights"], "logits_sha256": line["logits_sha256"]}))
    return 0


# The capture's names -> the run file's /layers/L/NAME (docs/v41.md §12); the rest keep theirs.
RENAMED = {"engram_hash_ids": "hash_ids", "gate_experts": "experts", "gate_weights": "expert_weights"}


def weights_digest(folder: Path) -> str:
    """v41_weights_digest of the C++ side: FNV-1a 64 over every tensor's name, dtype, shape (int64 LE) and
    bytes, in name order, over the shards the index names."""
    import struct
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        raw = (folder / shard).read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            tensors[name] = (info["dtype"], info["shape"], raw[8 + n + a:8 + n + b])
    h = 0xCBF29CE484222325
    mask = (1 << 64) - 1

    def mix(data: bytes):
        nonlocal h
        for byte in data:
            h = ((h ^ byte) * 0x100000001B3) & mask

    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        mix(name.encode())
        mix(dtype.encode())
        mix(struct.pack(f"<{len(shape)}q", *shape))
        mix(data)
    return f"{h:016x}"


def write_run_file(out: Path, t: dict, line: dict, meta: dict, args, official: Path, decode=None) -> None:
    """The v41 run file (docs/v41.md §12), written to a temporary name and renamed into place. Values that
    are all bf16 are stored as their 16 bits (encoding = "bf16"), the rest as float32; both exact. With
    decode steps, /decode holds their tokens, seed and per-step captures in the same per-layer names."""
    import hashlib
    import platform
    import h5py
    import numpy as np

    folder = Path(args.checkpoint).resolve()
    tmp = out.with_name(out.name + ".tmp")

    def put(f, path, v, compress=True):
        v = np.ascontiguousarray(v)
        # a decode step's datasets are one row each: chunked storage would triple their size
        opts = {"compression": "gzip", "compression_opts": 9, "shuffle": True} if compress and v.size > 64 else {}
        if v.dtype.kind == "f":
            v32 = v.astype(np.float32)
            bits = v32.view(np.uint32)
            if np.all(bits & 0xFFFF == 0):
                d = f.create_dataset(path, data=(bits >> 16).astype(np.uint16), **opts)
                d.attrs["encoding"] = "bf16"
            else:
                f.create_dataset(path, data=v32, **opts)
        else:
            f.create_dataset(path, data=v.astype(np.int64), **opts)

    with h5py.File(tmp, "w", track_order=True) as f:
        # the harness's one file format (io/file_identity.hpp), family v41: a full prefill of version 3
        f.attrs["format"] = "ced-harness"
        f.attrs["format_version"] = np.int64(3)
        f.attrs["family"] = "v41"
        f.attrs["generator"] = ("DeepSeek-V4.1-Flash inference/model.py (revision "
                                "dba1be0a40aa45a94ad051997016db3960a90277) through run_official.py, "
                                "scripts/v41_official_capture.py")
        f.attrs["config"] = (folder / "inference" / "config.json").read_text()
        f.attrs["config_name"] = args.config_name
        f.attrs["regime"] = "release" if args.mode == "fp8" else "bf16"
        f.attrs["weights_digest"] = weights_digest(folder)
        f.attrs["weight_seed"] = np.uint64(args.weight_seed)
        p = f.create_group("provenance")
        p.attrs["torch"] = meta["torch"]
        p.attrs["numpy"] = np.__version__
        p.attrs["python"] = platform.python_version()
        p.attrs["threads"] = str(meta["threads"])
        p.attrs["official_mode"] = args.mode
        p.attrs["input_seed"] = "none" if args.tokens else str(args.input_seed)
        if args.tokens:
            p.attrs["prompt"] = Path(args.tokens).stem  # the stress prompt's name (docs/v41.md §13.12)
        p.attrs["official_sha256"] = json.dumps(meta["official_sha256"], sort_keys=True)
        p.attrs["kernel_module"] = meta["kernel_module"]
        p.attrs["run_official_sha256"] = hashlib.sha256((official / "run_official.py").read_bytes()).hexdigest()
        p.attrs["capture_script_sha256"] = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        p.attrs["checkpoint_sha256"] = meta["weights_sha256"]
        p.attrs["logits_sha256"] = line["logits_sha256"]
        if args.boost:
            p.attrs["boost"] = ",".join(args.boost)
        f.create_dataset("tokens", data=t["input_ids"].astype(np.int64))
        lay = f.create_group("layers", track_order=True)
        for l in range(meta["model_args"]["n_layers"]):
            lay.create_group(str(l))
        for k, v in t.items():
            # sparse_attn's query and output are 60 % of a file: --lean drops them.
            if not k.startswith("layer") or (args.lean and k.endswith(("_attn_q", "_attn_o"))):
                continue
            head, name = k.split("_", 1)
            put(f, f"layers/{int(head[5:])}/{RENAMED.get(name, name)}", v)
        put(f, "final/collapsed", t["final_collapsed"])
        put(f, "final/normed", t["final_normed"])
        put(f, "logits", t["logits"])
        put(f, "logits_last", t["logits_last"])
        for kind in ("swa", "compressed"):
            for part in ("cos", "sin"):
                put(f, f"rope/{kind}_{part}", t[f"rope_{kind}_{part}"])
        if decode:
            f.create_dataset("decode/tokens", data=np.asarray(decode["tokens"], dtype=np.int64))
            n_layers = meta["model_args"]["n_layers"]

            def put_layers(prefix, caps):
                for l in range(n_layers):
                    f.create_group(f"{prefix}/layers/{l}")
                for k, v in caps.items():
                    if k.startswith("layer"):
                        head, name = k.split("_", 1)
                        put(f, f"{prefix}/layers/{int(head[5:])}/{RENAMED.get(name, name)}", v, compress=False)

            put_layers("decode/seed", decode["seed"])
            for s, caps in enumerate(decode["steps"]):
                put_layers(f"decode/steps/{s}", caps)
                put(f, f"decode/steps/{s}/final/collapsed", caps["final_collapsed"], compress=False)
                put(f, f"decode/steps/{s}/final/normed", caps["final_normed"], compress=False)
                put(f, f"decode/steps/{s}/logits", caps["logits"], compress=False)
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
