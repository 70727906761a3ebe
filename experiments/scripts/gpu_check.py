"""The GPU check of issue 33, one call on one H100/H200 with no internet and nothing from a model hub.

A randomly initialised model with Qwen2.5-7B's shape in bf16 (experiments/configs/gpu_check/qwen2.5-7b.json) and
the embedded SmolLM2 tokenizer (its files travel in .gpu_check/tokenizer, see gpu_check.sh):

1. generation: the rollout engine's tokens/s against plain ``generate`` at batch 64 (greedy, same prompts);
2. one LoRA micro-batch step and one full-parameter micro-batch step with gradient checkpointing (peak memory,
   tokens/s);
3. one DAPO step through the rollout engine with LoRA (``run_dapo`` + ``SearchRollout``, 8 prompts × 8 samples;
   retrieval is a fixed passage list: this measures the trainer, not a corpus);
4. exact search on the GPU over the largest random 768-dim corpus that fits (21M when it does) against FAISS's
   exact CPU search on a slice, batches of 64 queries (``python -m kunlunlab.bench exact-search``).

Each part's numbers, or the error that stopped it, go into one JSON (``$OUT/gpu_check.json`` on the device machine,
else experiments/results/gpu_check/gpu_check.json); the last line printed is that JSON. ``--tiny`` runs every part
at toy size on the CPU, which is how the script itself is tested (tests/training/test_gpu_check.py)."""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ROOT / "experiments/configs/gpu_check/qwen2.5-7b.json"
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}


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


def build_model(tiny: bool, device: str, dtype: torch.dtype):
    data = json.loads(SHAPE.read_text())
    data.pop("_comment")
    config = AutoConfig.for_model(**{**data, **(TINY if tiny else {})})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def tokenizer_from(folder: str | None):
    if folder:
        tok = AutoTokenizer.from_pretrained(folder)
    else:
        from kunlunlab.models import resolve_llm

        tok = AutoTokenizer.from_pretrained(resolve_llm(None))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def part_generation(model, tok, device: str, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """Tokens/s of the KV-cached rollout engine against ``model.generate`` on the same greedy batch."""
    from kunlunlab.agent.backends import generate_once
    from kunlunlab.agent.transformers_backend import TransformersBackend

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(100, len(tok) - 100, (batch, prompt_len), generator=g).tolist()
    model.eval()
    backend = TransformersBackend(model=model, tokenizer=tok, dtype=str(model.dtype).split(".")[-1])
    generate_once(backend, prompts[:2], 4, stop=())  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    segments = generate_once(backend, prompts, new_tokens, stop=())
    _sync(device)
    engine_s = time.perf_counter() - t0
    engine_tokens = sum(len(s.token_ids) for s in segments)
    ids = torch.tensor(prompts, device=device)
    with torch.no_grad():
        model.generate(ids[:2], max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        _sync(device)
    plain_s = time.perf_counter() - t0
    plain_tokens = (out.shape[1] - prompt_len) * batch
    engine_rate, plain_rate = engine_tokens / engine_s, plain_tokens / plain_s
    return {"batch": batch, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
            "engine_tokens_per_s": round(engine_rate, 1), "generate_tokens_per_s": round(plain_rate, 1),
            "engine_over_generate": round(engine_rate / plain_rate, 3), "engine_tokens": engine_tokens,
            "peak_gb": _peak_gb(device)}


def _train_step(model, device: str, micro: int, seq: int, lora: bool) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5, foreach=False)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model.enable_input_require_grads()
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


def part_lora_step(model, device: str, micro: int, seq: int) -> dict:
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                  task_type="CAUSAL_LM"))
    result = _train_step(peft_model, device, micro, seq, lora=True)
    peft_model.unload()  # the plain model back, adapters removed
    return result


def part_full_step(model, device: str, micro: int, seq: int) -> dict:
    model.requires_grad_(True)
    result = _train_step(model, device, micro, seq, lora=False)
    for p in model.parameters():
        p.grad = None
    return result


def part_dapo_step(model, tok, device: str, tiny: bool, out_dir: Path) -> dict:
    """One DAPO update through TRL with LoRA, rollouts by the engine on this GPU (8 prompts × 8 samples)."""
    from peft import LoraConfig

    from kunlunlab.agent.rollout import RolloutConfig
    from kunlunlab.retrieval.retriever import Hit
    from kunlunlab.training.config import DAPOStageConfig
    from kunlunlab.training.dapo import SearchRollout, rl_dataset, run_dapo
    from kunlunlab.training.rewards import RewardConfig

    def search(queries, k=3):
        return [[Hit("p0", '"Fixed"\nA fixed passage stands in for a corpus in this check.', 1.0, "Fixed")]
                for _ in queries]

    questions = [f"Who founded company number {i}?" for i in range(32)]
    dapo = DAPOStageConfig(steps=1, prompts_per_step=2 if tiny else 8, num_generations=2 if tiny else 8,
                           micro_batch_size=2 if tiny else 8, max_turn_tokens=16 if tiny else 128,
                           max_total_tokens=48 if tiny else 512, dynamic_sampling=False, save_steps=100)
    rollout = SearchRollout(search, tok, {q: ["x"] for q in questions},
                            RolloutConfig(max_turn_tokens=dapo.max_turn_tokens, max_total_tokens=dapo.max_total_tokens,
                                          top_k=1), dapo, RewardConfig(), inference_dtype="auto")
    _reset(device)
    t0 = time.perf_counter()
    trainer = run_dapo(model, tok, rl_dataset(questions, [["x"]] * len(questions)), rollout, dapo, RewardConfig(),
                       out_dir, bf16=device.startswith("cuda"), gradient_checkpointing=True, world_size=1,
                       peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    seconds = time.perf_counter() - t0
    stats = rollout.history[-1] if rollout.history else {}
    result = {"seconds": round(seconds, 1), "peak_gb": _peak_gb(device), "sequences": stats.get("rollouts"),
              "rollout_seconds": round(stats.get("seconds", 0.0), 1), "model_tokens_per_sample": stats.get("model_tokens"),
              "steps": trainer.state.global_step,
              "fits_80gb": None if _peak_gb(device) is None else _peak_gb(device) < 80}
    trainer.accelerator.free_memory()
    return result


def part_exact_search(device: str, tiny: bool) -> dict:
    """``kunlunlab.bench exact-search`` on the GPU at the largest N that fits (up to 21M), and on the CPU
    (FAISS IndexFlatIP, all cores) over a slice, so the two per-batch times can be set side by side."""
    def bench(*args) -> dict:
        done = subprocess.run([sys.executable, "-m", "kunlunlab.bench", "exact-search", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-2000:] or done.stdout.strip()[-2000:])
        return json.loads(done.stdout.strip().splitlines()[-1])

    if tiny:
        return {"gpu": bench("--device", "cpu", "--n", "20000", "--queries", "64", "--backend", "torch",
                             "--dtype", "float32"),
                "cpu": bench("--device", "cpu", "--n", "20000", "--queries", "64", "--backend", "faiss")}
    try:  # 21M x 768 in float16 is 32 GB: it fits an H100's 80 GB; else the largest N that does
        gpu = bench("--device", "cuda", "--n", "21000000", "--queries", "64", "--dtype", "float16")
    except RuntimeError as err:
        gpu = {**bench("--device", "cuda", "--n", "max", "--queries", "64", "--dtype", "float16"),
               "21M_error": str(err)[-300:]}
    return {"gpu": gpu, "cpu": bench("--device", "cpu", "--n", "2000000", "--queries", "64", "--backend", "faiss")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="every part at toy size on the CPU (tests the script)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded one)")
    ap.add_argument("--out", default=None, help="JSON file (default: $OUT/gpu_check.json, else experiments/results)")
    ap.add_argument("--skip", nargs="*", default=[], help="parts to leave out: generation lora full dapo search")
    args = ap.parse_args(argv)
    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU visible (use --tiny to test the script on a CPU)", file=sys.stderr)
        return 2
    out = Path(args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT")
                            else ROOT / "experiments/results/gpu_check/gpu_check.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "tiny": args.tiny,
              "torch": torch.__version__, "shape": "toy" if args.tiny else "Qwen2.5-7B (random init, bf16)",
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    import transformers

    report["transformers"] = transformers.__version__
    dtype = torch.float32 if args.tiny else torch.bfloat16
    tok = tokenizer_from(args.tokenizer)
    model = build_model(args.tiny, device, dtype)
    report["parameters"] = sum(p.numel() for p in model.parameters())
    sizes = {"generation": (2, 8, 8) if args.tiny else (64, 128, 256), "train": (2, 32) if args.tiny else (2, 4096),
             "full": (1, 32) if args.tiny else (1, 4096)}
    parts = [("generation", lambda: part_generation(model, tok, device, *sizes["generation"])),
             ("lora_step", lambda: part_lora_step(model, device, *sizes["train"])),
             ("full_step", lambda: part_full_step(model, device, *sizes["full"])),
             ("dapo_step", lambda: part_dapo_step(model, tok, device, args.tiny, out.parent / "dapo_run"))]
    skip = {"generation": "generation", "lora": "lora_step", "full": "full_step", "dapo": "dapo_step"}
    skipped = {skip[s] for s in args.skip if s in skip}
    for name, run in parts:
        if name in skipped:
            continue
        t0 = time.perf_counter()
        try:
            report[name] = run()
        except Exception as err:  # recorded in the JSON, with its traceback's tail: the other parts still run
            report[name] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()[-1500:]}
        report[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        out.write_text(json.dumps(report, indent=1))
        print(f"gpu_check: {name}: {json.dumps(report[name])[:400]}", flush=True)
    del model
    _reset(device)
    if "search" not in args.skip:
        t0 = time.perf_counter()
        try:
            report["exact_search"] = part_exact_search(device, args.tiny)
        except Exception as err:
            report["exact_search"] = {"error": f"{type(err).__name__}: {err}"}
        report["exact_search"]["wall_s"] = round(time.perf_counter() - t0, 1)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
