"""BFCL's own generation and checker against a served checkpoint, inside BFCL's environment.

Run as ``<bfcl env>/bin/python bfcl_driver.py SPEC.json`` (never imported by slca-exp: it
imports ``bfcl_eval``, which lives only in that environment). SPEC names the served checkpoint
(an OpenAI-compatible base URL and model id), the categories, the sample and the work folder;
the driver writes ``results.json`` there.

1. The checkpoint is registered in BFCL's model registry under :data:`REGISTRY` with BFCL's
   OpenAI chat-completions handler in function-calling mode (``OpenAICompletionsHandler``,
   ``is_fc_model=True``): BFCL sends each item's functions as OpenAI tools, and vLLM's tool-call
   parser turns the checkpoint's ``<tool_call>`` blocks back into OpenAI tool calls, as in the
   paper's evaluation. BFCL's prompt-format handlers (``QwenFCHandler``) write Qwen3's template
   by hand; serving the checkpoint's own chat template is what matches the trained one.
2. The sample: each category's items in BFCL's order, ``per_category`` of them drawn with a
   seed of its own (``random.Random("<seed>:<category>")``), written as BFCL's
   ``test_case_ids_to_generate.json``; BFCL's generation runs on those ids (``--run-ids``).
3. BFCL's checker scores them (``bfcl evaluate --partial-eval``: accuracy over the items
   generated), and the driver reads BFCL's result and score files back: per category, the
   accuracy, and per item, whether it passed and BFCL's error if not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

REGISTRY = "slca-exp-checkpoint"
"""The checkpoint's name in BFCL's registry and result folders (no ``_``: BFCL reads ``_`` in a
result folder's name as ``/``)."""


def main(argv: list[str]) -> int:
    """Generate, score and write ``results.json`` for the spec file ``argv[0]``."""
    spec = json.loads(Path(argv[0]).read_text())
    work = Path(spec["work"])
    for stale in ("result", "score", "test_case_ids_to_generate.json"):  # an earlier eval's
        path = work / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    # before bfcl_eval is imported: it reads these when its modules load
    os.environ["BFCL_PROJECT_ROOT"] = str(work)
    os.environ["OPENAI_BASE_URL"] = spec["base_url"]
    os.environ["OPENAI_API_KEY"] = spec.get("api_key") or "EMPTY"

    from bfcl_eval import _llm_response_generation as generation
    from bfcl_eval.constants.eval_config import SCORE_PATH, TEST_IDS_TO_GENERATE_PATH
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING, ModelConfig
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler
    from bfcl_eval.utils import (
        get_directory_structure_by_category,
        get_file_name_by_category,
        load_dataset_entry,
        load_file,
    )

    handler = OpenAICompletionsHandler
    if spec.get("max_tokens"):
        handler = _capped(OpenAICompletionsHandler, int(spec["max_tokens"]))
    MODEL_CONFIG_MAPPING[REGISTRY] = ModelConfig(
        model_name=spec["model"],
        display_name=f"{spec['model']} (FC, slca-exp)",
        url="",
        org="slca-exp",
        license="",
        model_handler=handler,
        input_price=None,
        output_price=None,
        is_fc_model=True,
        underscore_to_dot=True,  # the handler sends "a.b" as "a_b", as OpenAI's API requires
    )

    categories = list(spec["categories"])
    chosen = {c: sample([e["id"] for e in load_dataset_entry(c)], spec, c) for c in categories}
    TEST_IDS_TO_GENERATE_PATH.write_text(json.dumps(chosen, indent=1))

    args = argparse.Namespace(
        model=[REGISTRY],
        test_category=categories,
        temperature=float(spec["temperature"]),
        include_input_log=False,
        exclude_state_log=True,
        num_threads=int(spec["threads"]),
        num_gpus=1,
        backend="vllm",
        gpu_memory_utilization=0.9,
        result_dir=None,
        run_ids=True,
        allow_overwrite=True,
        skip_server_setup=True,
        local_model_path=None,
        lora_modules=None,
        enable_lora=False,
        max_lora_rank=None,
    )
    generation.main(args)
    eval_runner.main([REGISTRY], categories, None, None, partial_eval=True)

    results_root = work / "result" / REGISTRY
    scores_root = Path(SCORE_PATH) / REGISTRY
    out = {"categories": {}, "items": []}
    for category in categories:
        group = get_directory_structure_by_category(category)
        answers = load_file(
            results_root / group / get_file_name_by_category(category, is_result_file=True),
            sort_by_id=True,
        )
        score_file = scores_root / group / get_file_name_by_category(category, is_score_file=True)
        header, *failed = load_file(score_file)
        failures = {entry["id"]: entry for entry in failed}
        out["categories"][category] = {
            "accuracy": header["accuracy"],
            "correct": header["correct_count"],
            "total": header["total_count"],
        }
        for answer in answers:
            failure = failures.get(answer["id"])
            out["items"].append(
                {
                    "category": category,
                    "id": answer["id"],
                    "valid": failure is None,
                    "error_type": None if failure is None else failure.get("error_type"),
                    "error": None if failure is None else json.dumps(failure.get("error")),
                    "answer": json.dumps(answer["result"]),
                }
            )
    (work / "results.json").write_text(json.dumps(out, indent=1))
    return 0


def sample(ids: list[str], spec: dict, category: str) -> list[str]:
    """``per_category`` of a category's ids in BFCL's order, drawn by ``seed`` and the category."""
    n = spec.get("per_category")
    if n is None or n >= len(ids):
        return ids
    keep = set(random.Random(f"{spec['seed']}:{category}").sample(ids, n))
    return [i for i in ids if i in keep]


def _capped(base: type, max_tokens: int) -> type:
    """BFCL's handler, with ``max_tokens`` on every request (BFCL sends none)."""

    class Capped(base):  # type: ignore[misc, valid-type]
        def generate_with_backoff(self, **kwargs):  # noqa: ANN003, ANN202
            return super().generate_with_backoff(**{"max_tokens": max_tokens, **kwargs})

    return Capped


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
