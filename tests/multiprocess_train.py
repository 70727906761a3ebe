"""The script ``tests/training/test_multiprocess_training.py`` launches on every process of ``accelerate launch``:
``kunlunlab train`` with one hook that records, per process, the rewards TRL's ``GRPOTrainer`` computed
on that process's own rollouts and what the process got back after TRL gathered them from every
process (``_calculate_rewards`` ends with ``gather``: the group advantages are normalised on the
gathered ``(processes × local completions, reward functions)`` tensor and each rank keeps its slice).

Each rank appends one line per DAPO generation batch to ``<run dir>/rank<i>_rewards.jsonl``, and writes how many
passages it embedded and how many flat indexes it built to ``<run dir>/rank<i>_embedded.json``. Usage, as
``kunlunlab train``:  ``python tests/multiprocess_train.py train --run-dir DIR --smoke --set ...``"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _rows(tensor) -> list[list[float | None]]:
    return [[None if v != v else v for v in row] for row in tensor.tolist()]  # NaN (a None reward) -> null


def install_reward_recorder(run_dir: Path) -> None:
    import trl.trainer.grpo_trainer as grpo

    calculate, gather = grpo.GRPOTrainer._calculate_rewards, grpo.gather
    seen: list = []

    def recording_gather(tensor):  # the module's `gather` is called once, on the local reward tensor
        seen.append(_rows(tensor))
        return gather(tensor)

    def recording(self, inputs, prompts, completions, completion_ids_list):
        seen.clear()
        gathered = calculate(self, inputs, prompts, completions, completion_ids_list)
        rank = self.accelerator.process_index
        row = {"rank": rank, "processes": self.accelerator.num_processes, "step": self.state.global_step,
               "questions": [p if isinstance(p, str) else p[-1]["content"] for p in prompts],
               "local": seen[0] if len(seen) == 1 else None, "gathered": _rows(gathered)}
        with (run_dir / f"rank{rank}_rewards.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        return gathered

    grpo.gather = recording_gather
    grpo.GRPOTrainer._calculate_rewards = recording


def install_generation_server_stand_in(run_dir: Path) -> None:
    """With ``dapo.use_vllm`` the rollouts go to an OpenAI-compatible server (``kunlunlab serve-llm`` stands in
    for ``trl vllm-serve``). Only TRL's weight sync is replaced (it needs CUDA and vLLM's NCCL communicator):
    a stand-in ``VLLMGeneration`` that counts the syncs. Every completion request a rank sends is recorded in
    ``<run dir>/rank<i>_server_calls.jsonl``."""
    import trl.trainer.grpo_trainer as grpo

    from kunlunlab.agent import openai_backend

    class WeightSyncStandIn:
        def __init__(self, accelerator=None, **kwargs):
            self.accelerator = accelerator
            self.vllm_client = self  # TRL reads the server's logprobs mode through it on the main process

        def get_server_info(self):
            return {"model_config": {"logprobs_mode": "processed_logprobs"}}

        def sync_weights(self):
            """The main process "pushes" for 2 s (TRL's NCCL broadcast to the server), the others return at once,
            as under ZeRO-2; each records when its sync started and ended."""
            import time

            start = time.time()
            if self.accelerator.is_main_process:
                time.sleep(2.0)
            with (run_dir / f"rank{self.accelerator.process_index}_syncs.jsonl").open("a") as f:
                f.write(json.dumps({"start": start, "end": time.time()}) + "\n")

    complete = openai_backend.OpenAIBackend.complete

    def recording_complete(self, prompts, *args, **kwargs):
        import time

        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        with (run_dir / f"rank{rank}_server_calls.jsonl").open("a") as f:
            f.write(json.dumps({"rank": rank, "url": self.url, "prompts": len(prompts), "time": time.time()}) + "\n")
        return complete(self, prompts, *args, **kwargs)

    grpo.VLLMGeneration = WeightSyncStandIn
    openai_backend.OpenAIBackend.complete = recording_complete


def count_index_builds() -> list:
    """Counts the flat indexes this process builds (a saved index loaded is not built: FAISS reads it whole)."""
    from kunlunlab.retrieval.indexes import FlatIndex

    builds: list = []
    init = FlatIndex.__init__

    def counting(self, dim):
        builds.append(dim)
        init(self, dim)

    FlatIndex.__init__ = counting
    return builds


def main(argv: list[str]) -> int:
    import os

    from kunlunlab.cli import main as cli

    run_dir = Path(argv[argv.index("--run-dir") + 1])
    install_reward_recorder(run_dir)
    builds = count_index_builds()
    if os.environ.get("KUNLUNLAB_TEST_GENERATION_SERVER"):
        install_generation_server_stand_in(run_dir)
    code = cli(argv)
    from kunlunlab.retrieval.encoder import passages_embedded

    rank = int(os.environ.get("RANK", 0))  # how many passages this process embedded (the shared index: rank 0 only)
    (run_dir / f"rank{rank}_embedded.json").write_text(json.dumps({"passages": passages_embedded(),
                                                                   "index_builds": len(builds)}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
