"""Rollouts that do not depend on how the batch is split over ranks: TRL's generation step, overridden.

In:  the prompts of one rank's share of the GRPO batch (token ids), the step, the run's seed and
     this process's rank (:mod:`.distributed`).
Out: one sampled completion per prompt row (token ids, cut after the first eos), as TRL's
     ``GRPOTrainer._generate_single_turn`` returns them (no sampling log-probs).

Each row draws from its own generator keyed by (seed, step, global row index) through
:class:`.distributed.RowGumbelSampler`, so a row samples the same completion on rank 0 of 1 as on
rank 1 of 2 (``tests/scaling/test_ddp_equivalence.py``). The override is pinned against TRL by
``tests/train/test_trl_pins.py``.

Deliberately simplified: only plain transformers generation with the default warpers (no top-p/top-k/
min-p, no repetition penalty) is replaced; vLLM, continuous batching, images, multimodal fields and
tools fall back to TRL's own generation (whose draws then depend on the batch split).
"""

from __future__ import annotations

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.utils import pad

from composer_pipeline.train import distributed


class RowSeededRollouts(GRPOTrainer):
    """``GRPOTrainer`` whose plain rollouts sample each row from its own (seed, step, row) generator."""

    # what GRPOTrainer is given (transformers.Trainer declares the base TrainingArguments)
    args: GRPOConfig

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        plain = not (
            self.use_vllm or self.use_transformers_continuous_batching or images or multimodal_fields or self.tools
        )
        gk = self.generation_kwargs
        default_warpers = (
            gk.get("top_p") in (None, 1.0)
            and not gk.get("top_k")
            and not gk.get("min_p")
            and gk.get("repetition_penalty") in (None, 1.0)
        )
        if not (plain and default_warpers):
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        from transformers import GenerationConfig, LogitsProcessorList

        device = self.accelerator.device
        first = distributed.current().rank * len(prompt_ids)
        seeds = [
            distributed.row_seed(self.args.seed, self.state.global_step, first + i) for i in range(len(prompt_ids))
        ]
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        ids = pad(tensors, padding_value=self._tokenizer.pad_token_id, padding_side="left").to(device)
        mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left").to(device)
        greedy = GenerationConfig(
            max_new_tokens=self.max_completion_length,
            do_sample=False,
            pad_token_id=self._tokenizer.pad_token_id,
            bos_token_id=self._tokenizer.bos_token_id,
            eos_token_id=self.eos_token_ids,
            disable_compile=True,
        )
        checkpointing_kwargs = self.args.gradient_checkpointing_kwargs
        if isinstance(checkpointing_kwargs, str):
            # transformers keeps a string that is not JSON as given; the unwrapping takes keywords only
            raise ValueError(f"gradient_checkpointing_kwargs must be a dict, got {checkpointing_kwargs!r}")
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=greedy,
                logits_processor=LogitsProcessorList([distributed.RowGumbelSampler(seeds, self.temperature)]),
            )
        completion_ids = []
        eos = set(self.eos_token_ids)
        for row in out[:, ids.size(1) :].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            completion_ids.append(row[:cut])
        return completion_ids, None
