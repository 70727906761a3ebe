"""The GPU check (issues 33, 42 and 53): one call of at most 10 minutes on one H100/H200, no internet, nothing from a hub.

A randomly initialised model with Qwen2.5-7B's shape in bf16 (experiments/configs/gpu_check/qwen2.5-7b.json) and
the embedded SmolLM2 tokenizer (its files travel in .gpu_check/tokenizer, see gpu_check.sh), part by part:

1. ``agreement_fp32`` (first: it is cheap), then ``generation``. ``agreement_fp32``: whether the rollout engine
   gives ``generate``'s greedy tokens where bf16 noise cannot hide a difference (float32, a 0.5B-shape model,
   prompts of different lengths, each row against ``generate`` on its prompt alone): the check for an
   attention-kernel bug like the CPU one docs/scaling.md describes. ``generation``: the engine's tokens/s against
   plain ``generate`` at batch 64 on the 7B shape (greedy, same prompts), with their greedy agreement beside the
   floor of ``generate`` itself (batch 64 against one row at a time, 4 rows);
2. ``lora_step``, ``dapo_step``, ``full_step``, at the one-GPU LoRA recipe's own shape read from its file
   (train_qwen7b_lora_1gpu.json; gpu_check_recipe.py): ``lora_step`` one optimizer step of the recipe's SFT
   micro-batch (4 x 4096 tokens) with its LoRA (r 64, alpha 128, all linear layers), the loss through TRL's fused
   LM head; ``dapo_step`` the recipe's DAPO update through TRL's GRPOTrainer (micro-batch 4, completions of 4096
   tokens in turns of 512 with masked result blocks, 8 generations, 2 updates per rollout batch, checkpointing,
   LoRA r 64) on pre-made rollouts, with its peak and whether it fits 80 GB and 141 GB; ``full_step`` one
   full-parameter micro-batch step with gradient checkpointing (peak memory, tokens/s);
3. ``exact_search``: exact search on the GPU over 21M random 768-dim float16 vectors and over the most that fit
   (``python -m kunlunlab.bench exact-search``), its bandwidth against the GPU's, its top-k against a float64
   brute force on the GPU (2M vectors), and FAISS's exact CPU search on a 1M slice, batches of 64 queries;
4. ``end_to_end``: the workbench itself on the GPU: ``kunlunlab train`` with the one-GPU LoRA recipe
   (train_qwen7b_lora_1gpu.json) on a randomly initialised model of Qwen2.5-0.5B's architecture at a size that fits
   the call (a few SFT and DAPO steps, evaluations before and after), then ``kunlunlab eval`` on its final model:
   wall time and peak GPU memory per stage.

Parts run in that order while the time budget (``--budget-s``) lasts; a part that would not fit is recorded as
skipped with the seconds left. Each part's numbers, or the error that stopped it, go into one JSON (``--out``;
``$OUT/gpu_check.json`` on the device machine, else experiments/results/gpu_check/gpu_check.json); the last line
printed is that JSON. Everything else (the DAPO checkpoint, the end-to-end run) is written under ``--work``
(/tmp), never beside the JSON: a device call brings back 8 files of 16 MiB at most. ``--tiny`` runs every part at
toy size on the CPU (the training parts at the recipe's shape scaled by gpu_check_recipe.TINY_RULE), which is how
the script is tested (tests/training/test_gpu_check.py, in the GPU environments' versions: ``make test-gpuenv``;
``pytest -m gpuenv`` in any other)."""
from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import kunlunlab  # noqa: F401  first: it keeps JAX off the GPU (kunlunlab/__init__.py)
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helper module beside it, however it is started
from gpu_check_recipe import RECIPE, part_dapo_step, part_lora_step, recipe_shape  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ROOT / "experiments/configs/gpu_check/qwen2.5-7b.json"
LORA_RECIPE = RECIPE
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}
# Qwen2.5-0.5B's architecture (its published config.json) for the end-to-end run: the recipe's code path at a size
# whose SFT, DAPO and evaluations fit the call's minutes
SMALL = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "tie_word_embeddings": True}
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "numpy", "huggingface_hub", "tokenizers",
            "safetensors", "sentence-transformers", "faiss-cpu", "fastapi", "pydantic", "typing_extensions", "pandas",
            "pyarrow", "scikit-learn", "scipy", "setuptools", "vllm", "deepspeed")
# seconds a part needs at least on the GPU, at or above its time on the H200 (experiments/results/gpu_check,
# 2026-11-28: agreement 40.1, generation 84.2, full 1.1, end-to-end 229.3); lora, dapo and search changed shape
# since (issue 53) and are estimates until measured. The budget skips a part that would not fit.
NEEDS = {"generation": 90, "agreement_fp32": 45, "lora_step": 20, "dapo_step": 60, "full_step": 10, "exact_search": 60,
         "end_to_end": 240}
# seconds of a device call (560) minus gpu_check.sh's set-up before the budget starts (wheels installed, torch and
# transformers imported, the tokenizer read): the default --budget-s
CALL_S, SETUP_S = 560, 40
# memory bandwidth of the GPUs the check runs on (TB/s, their data sheets), for exact search's share of it
BANDWIDTH_TBS = {"H200": 4.8, "H100 80GB HBM3": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "A100-SXM4-80GB": 2.04,
                 "A100 80GB PCIe": 1.94}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_gb(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.startswith("cuda") else None


def _reset(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def package_versions() -> dict:
    """The versions of the packages the project reaches, as installed (the image's, or a carried wheel's)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def model_config(overrides: dict):
    data = json.loads(SHAPE.read_text())
    data.pop("_comment")
    return AutoConfig.for_model(**{**data, **overrides})


def build_model(shape: dict, device: str, dtype: torch.dtype):
    """A randomly initialised model of the 7B shape with ``shape``'s overrides (TINY, SMALL), seeded."""
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(model_config(shape), dtype=dtype)


def greedy_generate(model, tok, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int) -> list[list[int]]:
    """``model.generate``'s greedy continuation of each row, exactly ``new_tokens`` long (the reference side of
    the agreement figures)."""
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, pad_token_id=tok.pad_token_id)
    return out[:, ids.shape[1]:].tolist()


def tokenizer_from(folder: str | None):
    if folder:
        tok = AutoTokenizer.from_pretrained(folder)
    else:
        from kunlunlab.models import resolve_llm

        tok = AutoTokenizer.from_pretrained(resolve_llm(None))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def part_generation(model, tok, device: str, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """Tokens/s of the KV-cached rollout engine against ``model.generate`` on the same greedy batch, and how far their
    greedy tokens agree; ``generate`` at batch 64 against ``generate`` one row at a time (4 rows) is the floor that
    bf16 arithmetic alone gives (batch-dependent kernels move near-tied argmaxes). EOS ends no row on either side,
    so both decode ``batch`` x ``new_tokens`` tokens (``generate``'s ``min_new_tokens`` bans EOS; the engine decodes
    it as a token, ``stop_at_eos=False``): a row whose argmax is EOS parts from ``generate``'s there."""
    from kunlunlab.agent.backends import generate_once
    from kunlunlab.agent.transformers_backend import TransformersBackend

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(100, len(tok) - 100, (batch, prompt_len), generator=g).tolist()
    model.eval()
    backend = TransformersBackend(model=model, tokenizer=tok, dtype=str(model.dtype).split(".")[-1])
    generate_once(backend, prompts[:2], 4, stop=())  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    session = backend.open(prompts)
    finished = session.generate(range(batch), new_tokens, stop=(), stop_at_eos=False)
    _sync(device)
    engine_s = time.perf_counter() - t0
    segments = [finished[i] for i in range(batch)]
    engine_tokens = sum(len(s.token_ids) for s in segments)
    ids = torch.tensor(prompts, device=device)

    def plain(rows):
        return greedy_generate(model, tok, rows, torch.ones_like(rows), new_tokens)

    with torch.no_grad():
        model.generate(ids[:2], max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        _sync(device)
        t0 = time.perf_counter()
        plain_rows = plain(ids)
        _sync(device)
        plain_s = time.perf_counter() - t0
        singles = [plain(ids[i:i + 1])[0] for i in range(min(4, batch))]
    plain_tokens = len(plain_rows[0]) * batch
    engine_rows = [s.token_ids for s in segments]
    prefix = [_shared_prefix(e, p) / new_tokens for e, p in zip(engine_rows, plain_rows)]
    floor = [_shared_prefix(s, p) / new_tokens for s, p in zip(singles, plain_rows)]
    engine_rate, plain_rate = engine_tokens / engine_s, plain_tokens / plain_s
    return {"batch": batch, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
            "engine_tokens_per_s": round(engine_rate, 1), "generate_tokens_per_s": round(plain_rate, 1),
            "engine_over_generate": round(engine_rate / plain_rate, 3), "engine_tokens": engine_tokens,
            "greedy_rows_identical": round(sum(e == p for e, p in zip(engine_rows, plain_rows)) / batch, 3),
            "greedy_shared_prefix": round(sum(prefix) / batch, 3),
            "generate_batch_vs_single_shared_prefix": round(sum(floor) / len(floor), 3),
            "peak_gb": _peak_gb(device)}


def part_agreement_fp32(tok, device: str, tiny: bool) -> dict:
    """Whether the rollout engine's attention path gives ``generate``'s greedy tokens, where bf16 noise cannot hide a
    bug: a randomly initialised model of Qwen2.5-0.5B's architecture in float32 (TF32 off), prompts of different
    lengths in one batch (so the engine pads, as a rollout does), each engine row against ``generate`` on that
    prompt alone (no padding: the reference). ``generate`` on the same left-padded batch against the same reference
    is reported beside it. The generation part's 7B bf16 run cannot answer this: on random weights its argmaxes
    are near ties and ``generate`` disagrees with itself after 4.7 % of the tokens (H200, 2026-11-28)."""
    from kunlunlab.agent.backends import generate_once
    from kunlunlab.agent.transformers_backend import TransformersBackend

    batch, new_tokens, lengths = (4, 8, (4, 8)) if tiny else (16, 64, (16, 160))
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = build_model(TINY if tiny else SMALL, device, torch.float32)
        model.eval()
        g = torch.Generator().manual_seed(2)
        sizes = torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=g).tolist()
        prompts = [torch.randint(100, len(tok) - 100, (n,), generator=g).tolist() for n in sizes]
        backend = TransformersBackend(model=model, tokenizer=tok, dtype="float32")
        engine_rows = [s.token_ids for s in generate_once(backend, prompts, new_tokens, stop=())]
        width = max(sizes)
        padded = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with torch.no_grad():
            batched_rows = greedy_generate(model, tok, padded, mask, new_tokens)
            single_rows = [greedy_generate(model, tok, row, torch.ones_like(row), new_tokens)[0]
                           for row in (torch.tensor([p], device=device) for p in prompts)]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
    del model
    _reset(device)

    def agreement(rows):
        return {"rows_identical": round(sum(r == s for r, s in zip(rows, single_rows)) / batch, 3),
                "shared_prefix": round(sum(_shared_prefix(r, s) for r, s in zip(rows, single_rows))
                                       / (batch * new_tokens), 3)}

    return {"model": "random init, Qwen2 0.5B shape" if not tiny else "toy", "dtype": "float32", "batch": batch,
            "prompt_tokens": [min(sizes), max(sizes)], "new_tokens": new_tokens,
            "engine_vs_single_generate": agreement(engine_rows),
            "padded_generate_vs_single_generate": agreement(batched_rows)}


def _train_step(model, device: str, micro: int, seq: int) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, foreach=False)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(100, 40000, (micro, seq), device=device)
    _reset(device)
    _sync(device)
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - t0
    result = {"micro_batch": micro, "tokens": micro * seq, "seconds": round(seconds, 3),
              "tokens_per_s": round(micro * seq / seconds, 1), "peak_gb": _peak_gb(device),
              "trainable_params": sum(p.numel() for p in params), "loss": round(float(loss), 4)}
    del optimizer
    model.gradient_checkpointing_disable()
    return result


def part_full_step(model, device: str, micro: int, seq: int) -> dict:
    model.requires_grad_(True)
    result = _train_step(model, device, micro, seq)
    for p in model.parameters():
        p.grad = None
    return result


def bandwidth(result: dict, device_name: str) -> dict:
    """The search's read of the stored vectors per second (GB/s), and its share of the GPU's memory bandwidth."""
    read_gb = result["n"] * result["dim"] * (2 if result["dtype"] in ("float16", "bfloat16") else 4) / 1e9
    rate = read_gb / (result["search_ms_per_batch"] / 1000)
    peak = next((1000 * tbs for name, tbs in BANDWIDTH_TBS.items() if name in device_name), None)
    return {"read_gb_per_s": round(rate, 1), "gpu_gb_per_s": peak,
            "bandwidth_utilisation": round(rate / peak, 3) if peak else None,
            "floor_ms": round(1000 * read_gb / peak, 2) if peak else None}


def exactness_on_device(device: str, n: int, dim: int = 768, queries: int = 64, k: int = 10) -> dict:
    """The torch index's float16 top-k against a float64 brute force over the same stored vectors, on the device
    (its kernels, not the CPU's): how many queries' rows differ, and how many took the float32 fallback."""
    from kunlunlab.retrieval.indexes import TorchFlatIndex

    g = torch.Generator(device=device).manual_seed(5)
    vectors = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, device=device), dim=1).half()
    q = torch.nn.functional.normalize(torch.randn(queries, dim, generator=g, device=device), dim=1)
    index = TorchFlatIndex(dim, device, "float16", keep_host=False)
    index.add_tensor(vectors)
    _, rows = index.search(q.cpu().numpy(), k)
    step = 1 << 20
    best = torch.cat([torch.topk(q.double() @ vectors[i:i + step].double().T, min(k, len(vectors[i:i + step])),
                                 dim=1).values for i in range(0, n, step)], 1)
    reference = torch.topk(best, k, dim=1).values  # the float64 top-k scores
    found = torch.stack([(q[i].double() * vectors[torch.from_numpy(rows[i]).to(device)].double()).sum(1)
                         for i in range(queries)])  # the float64 scores of the rows the index returned
    wrong = int((~torch.isclose(found, reference, rtol=0, atol=1e-6).all(1)).sum())
    again = index.searched_again
    del vectors, index
    _reset(device)
    return {"n": n, "queries": queries, "k": k, "queries_not_exact": wrong, "searched_again": again}


def part_exact_search(device: str, tiny: bool, timeout: float) -> dict:
    """``kunlunlab.bench exact-search`` on the GPU at 21M and at the largest N that fits, with its bandwidth; the top-k
    checked against a float64 brute force on the GPU; FAISS's IndexFlatIP on the CPU (all cores) over a slice, so
    the per-batch times can be set side by side."""
    def bench(*args) -> dict:
        done = subprocess.run([sys.executable, "-m", "kunlunlab.bench", "exact-search", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=max(30.0, timeout / 3))
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-2000:] or done.stdout.strip()[-2000:])
        return json.loads(done.stdout.strip().splitlines()[-1])

    if tiny:
        gpu = bench("--device", "cpu", "--n", "20000", "--queries", "64", "--backend", "torch", "--dtype", "float16")
        return {"gpu": {**gpu, **bandwidth(gpu, "cpu")}, "largest": None,
                "exact": exactness_on_device("cpu", 20000),
                "cpu": bench("--device", "cpu", "--n", "20000", "--queries", "64", "--backend", "faiss")}
    name = torch.cuda.get_device_name(0)
    try:  # 21M x 768 in float16 is 30 GiB: it fits an H100's 80 GB; else the largest N that does
        gpu = bench("--device", "cuda", "--n", "21000000", "--queries", "64", "--dtype", "float16", "--backend",
                    "torch")
    except RuntimeError as err:
        gpu = {"21M_error": str(err)[-300:]}
    largest = bench("--device", "cuda", "--n", "max", "--queries", "64", "--dtype", "float16", "--backend", "torch")
    return {"gpu": {**gpu, **(bandwidth(gpu, name) if "n" in gpu else {})},
            "largest": {**largest, **bandwidth(largest, name)}, "exact": exactness_on_device("cuda", 2_000_000),
            "cpu": bench("--device", "cpu", "--n", "1000000", "--queries", "64", "--backend", "faiss")}


def _cli(args: list[str], log, timeout: float) -> dict:
    """One ``kunlunlab`` command in a fresh process, its output appended to the log; returns its exit code, wall
    seconds and the process's peak GPU memory."""
    code = ("import json, sys, torch\nfrom kunlunlab.cli import main\nrc = main(sys.argv[1:])\n"
            "peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None\n"
            "print('GPU_CHECK_PEAK ' + json.dumps(peak), flush=True)\nsys.exit(rc)")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    log.write(f"$ kunlunlab {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    log.flush()
    lines = done.stdout.splitlines()
    peaks = [line.split(" ", 1)[1] for line in lines if line.startswith("GPU_CHECK_PEAK ")]
    printed = [line for line in lines if line.startswith("{")]  # the command's JSON line (its last one)
    if done.returncode != 0:
        raise RuntimeError(f"kunlunlab {args[0]} exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    return {"rc": done.returncode, "wall_s": round(time.perf_counter() - t0, 1),
            "peak_gpu_gb": json.loads(peaks[-1]) if peaks else None,
            "printed": json.loads(printed[-1]) if printed else {}}


def part_end_to_end(tok, device: str, tiny: bool, work: Path, log, timeout: float) -> dict:
    """``kunlunlab train`` with the one-GPU LoRA recipe on a randomly initialised small Qwen2 model (the recipe's
    code path: LoRA merged after each stage, bf16, checkpointing, rollouts on the GPU; BM25 retrieval, as the
    device reaches no hub for the recipe's e5 embedder), then ``kunlunlab eval`` on the trained model."""
    model_dir, run_dir = work / "e2e_model", work / "e2e_run"
    for folder in (model_dir, run_dir):
        shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(0)
    config = model_config({**(TINY if tiny else SMALL), "vocab_size": len(tok),
                           "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if tiny else torch.bfloat16)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    del model
    sizes = {  # (tiny on the CPU, the GPU): a few steps of each stage, evaluations of 4 / 32 held-out questions
        "world_passages": (300, 2000), "train_questions": (24, 200), "mixing.epochs": (2, 2),
        "mixing.turning_epoch": (1, 1), "mixing.samples_per_epoch": (8, 64), "sft.max_steps": (1, 8),
        "sft.batch_size": (2, 4), "sft.grad_accum": (1, 2), "sft.max_length": (1024, 4096), "sft.save_steps": (100, 100),
        "dapo.steps": (2, 2), "dapo.prompts_per_step": (2, 8), "dapo.num_generations": (2, 8),
        "dapo.micro_batch_size": (2, 4), "dapo.max_turn_tokens": (16, 256), "dapo.max_total_tokens": (48, 1024),
        "eval.world_questions": (4, 32), "eval.batch_size": (4, 32), "eval.max_turn_tokens": (16, 256),
        "eval.max_total_tokens": (48, 1024)}
    overrides = [f"{k}={v[0] if tiny else v[1]}" for k, v in sizes.items()]
    overrides += [f"model={model_dir}", "index_kind=bm25", "embedder=null", "hotpot=false", "report_to=[]",
                  "eval.hotpot_questions=0", "eval.summary_questions=0", "summary_share=0.0"]
    if tiny:
        overrides += ["device=cpu", "model_dtype=float32", "bf16=false"]
    deadline = time.perf_counter() + timeout
    train = _cli(["train", "--config", str(LORA_RECIPE), "--run-dir", str(run_dir), "--set", *overrides], log,
                 timeout)
    summary = json.loads((run_dir / "training_summary.json").read_text())
    state = json.loads((run_dir / "state.json").read_text())
    evaluate = _cli(["eval", "--model", str(run_dir / "dapo" / "final"), "--dataset", "world", "--limit",
                     "4" if tiny else "32", "--index-kind", "bm25", "--batch-size", "4" if tiny else "32",
                     "--device", "cpu" if tiny else "cuda", "--out", str(work / "e2e_eval.jsonl")], log,
                    max(30.0, deadline - time.perf_counter()))
    printed = evaluate.pop("printed")
    train.pop("printed")
    return {"model": f"random init, Qwen2 {'toy' if tiny else '0.5B'} shape", "parameters": parameters,
            "train": {**train, "stage_seconds": state.get("seconds"), "steps": state.get("steps"),
                      "peak_gpu_gb_per_stage": state.get("peak_gpu_gb"),
                      "eval_seconds": {tag: state.get(f"eval_{tag}", {}).get("seconds") for tag in ("before", "after")},
                      "world_em_before_after": [summary.get("em_before"), summary.get("em_after")],
                      "heldout_questions": summary.get("heldout_questions")},
            "eval": {**evaluate, "n": printed.get("n"), "em": printed.get("em"),
                     "seconds_per_question": printed.get("seconds_per_question")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="every part at toy size on the CPU (tests the script)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded one)")
    ap.add_argument("--out", default=None, help="JSON file (default: $OUT/gpu_check.json, else experiments/results)")
    ap.add_argument("--work", default=None, help="scratch folder for checkpoints and runs (default: a new /tmp one)")
    ap.add_argument("--budget-s", type=float, default=float(CALL_S - SETUP_S),
                    help="seconds for all parts (a part that would not fit is skipped and recorded)")
    ap.add_argument("--skip", nargs="*", default=[],
                    help="parts to leave out: generation agreement lora full dapo search e2e")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible (use --tiny to test the script on a CPU)", file=sys.stderr)
        return 2
    out = Path(args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT")
                            else ROOT / "experiments/results/gpu_check/gpu_check.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="kunlunlab-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    import transformers

    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "tiny": args.tiny,
              "torch": torch.__version__, "transformers": transformers.__version__,
              "python": sys.version.split()[0], "shape": "toy" if args.tiny else "Qwen2.5-7B (random init, bf16)",
              "packages": package_versions(), "budget_s": args.budget_s, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    dtype = torch.float32 if args.tiny else torch.bfloat16
    tok = tokenizer_from(args.tokenizer)
    sizes = {"generation": (2, 8, 8) if args.tiny else (64, 128, 256), "full": (1, 32) if args.tiny else (1, 4096)}
    shape = recipe_shape(RECIPE, args.tiny)  # the training parts' shape: the recipe file's (scaled at --tiny)
    skip = {"generation": "generation", "agreement": "agreement_fp32", "lora": "lora_step", "full": "full_step",
            "dapo": "dapo_step",
            "search": "exact_search", "e2e": "end_to_end"}
    skipped = {skip[s] for s in args.skip if s in skip}
    log = (out.parent / (out.stem + ".log")).open("w")

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    def run_part(name: str, fn) -> None:
        if name in skipped:
            return
        if not args.tiny and left() < NEEDS[name]:
            report[name] = {"skipped": f"time budget: {left():.0f} s left, the part needs about {NEEDS[name]} s"}
        else:
            t0 = time.perf_counter()
            try:
                report[name] = fn()
            except Exception as err:  # recorded in the JSON, with its traceback's tail: the other parts still run
                report[name] = {"error": f"{type(err).__name__}: {err}"[:1500], "trace": traceback.format_exc()[-1500:]}
            report[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        out.write_text(json.dumps(report, indent=1))
        print(f"gpu_check: {name}: {json.dumps(report[name])[:400]}", flush=True)

    run_part("agreement_fp32", lambda: part_agreement_fp32(tok, device, args.tiny))
    if not {"generation", "lora_step", "dapo_step", "full_step"} <= skipped:  # the parts on the 7B-shape model
        model = build_model(TINY if args.tiny else {}, device, dtype)
        report["parameters"] = sum(p.numel() for p in model.parameters())
        run_part("generation", lambda: part_generation(model, tok, device, *sizes["generation"]))
        run_part("lora_step", lambda: part_lora_step(model, device, shape))
        run_part("dapo_step", lambda: part_dapo_step(model, tok, device, shape, args.tiny, work / "dapo_run"))
        run_part("full_step", lambda: part_full_step(model, device, *sizes["full"]))
        del model
        _reset(device)
    shutil.rmtree(work / "dapo_run", ignore_errors=True)
    run_part("exact_search", lambda: part_exact_search(device, args.tiny, max(60.0, left())))
    run_part("end_to_end", lambda: part_end_to_end(tok, device, args.tiny, work, log, max(60.0, left())))
    log.close()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    report["wall_s"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(report, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
