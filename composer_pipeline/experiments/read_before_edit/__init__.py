"""``composer-pipeline experiment read-before-edit``: does training on this pipeline's data make a
policy *act* better on states it has not seen, and which part of the training does it?

The whole chain, on generated sessions with a checkable right answer (:mod:`~composer_pipeline.experiments.sessions`):

1. write train and held-out Claude Code sessions (disjoint target files, wording; held-out sessions
   from a seed range no design round looked at, ``sessions.HELDOUT_SEED``; no train session reads a
   held-out file, not even as a decoy);
2. ingest both through the normal ingest (``ingest_paths``), to ``trace_states`` / ``trace_messages``;
3. replay the train task states over the normal replay path (priced, cached, ledgered HTTP) against
   teachers that disagree (:mod:`~composer_pipeline.experiments.rule_teacher` variants: the rule, two that err at their own fifth
   of the states, one that writes where the rule edits, and the rule's model asked twice), so pairs
   come from real consensus (2, 3 or 4 of 4 models, ties skipped) and the distinct-model rule is used;
4. pairs and hints with the normal code (``build_pairs``, ``normalize_pairs``, ``load_train_data``);
5. start policy: the base model supervised on the agents' own actions (:mod:`~composer_pipeline.experiments.sft`), so it edits an
   unread file about as often as the agents did. With ``--model tiny`` the base model is first
   trained from scratch on other generated sessions (every file pair, train wording) (:mod:`~composer_pipeline.experiments.pretrain`): a random-init
   model cannot write a held-out path, so no metric could move;
6. arms from the same start (:data:`.arms.ARMS`), each through the normal ``train()``, N seeds: ``grpo``,
   ``sdpo`` (hint distillation, error-site rows only), ``dpo`` (RPO: preference + NLL on the chosen
   answers), ``all``, and the controls that attribute a gain: ``nll`` (the same NLL on the same
   chosen answers, no preference term), ``dpo_shuffled`` (the pairs' sides swapped at a seeded random
   half), ``grpo_shuffled`` (a seeded prompt order instead of error sites first), ``nll_all`` (the NLL on
   the teachers' consensus at every task state that has one, not only where a pair exists), and the
   preference-loss candidates ``dpo_differing`` / ``dpo_first`` (the preference term over the tokens
   where chosen and rejected differ / over the first of them only) and ``dpop`` (DPO-Positive: the
   chosen answer kept at or above the start's likelihood). Same steps per arm;
7. held-out probe by greedy decoding, per state kind (:data:`.probe.STATE_KINDS`: the request, after a decoy
   read of *another* file, after an error, after the first / second read of the target); the score is
   ``combined`` = min(reading an unread target, editing a once-read one) on the decisive kinds (where the
   agents split 50/50), so always reading or always editing scores 0; prompts are cut at 320 tokens,
   where every held-out request is still visible. Every answer's ``parse_rate`` (greedy answers that
   parse as an action) and failures by reason are recorded too: a preference term can break the format.

Out (under ``--out``): each arm × seed *cell* in ``cells/`` when it is done (row, curve, per-state
outputs); a re-run with the same settings skips finished cells and ``budget_minutes`` stops between
cells. From all cells: ``results.jsonl``, ``per_kind.jsonl`` (seed × arm × state kind),
``states.jsonl`` (seed × arm × held-out state, with the answer's full text), ``table.md`` (per-kind shares, paired 95% intervals
against the start and between each arm and its control), ``curves.json`` / ``curves.png``.
The sessions are fixed; the seeds vary the start policy's fitting and every arm's training.

One module per idea: :mod:`.config` (the settings and their presets, ``recipes/experiments/read_before_edit/``),
:mod:`.data` (steps 1-4), :mod:`.arms` (step 6: what each arm trains, the controls' data),
:mod:`.probe` (step 7), :mod:`.run` (the base model, start policies and resumable cells),
:mod:`.report` (results, table, plots) and :mod:`.merge` (run directories joined by seed, e.g. GPU cells
beside CPU ones: ``bench/gpu/``). ``device`` (``--device``) says where models train and probes generate:
cpu by default; cuda has not run on a GPU here.
"""

from composer_pipeline.experiments.read_before_edit.config import ExperimentConfig, load_config
from composer_pipeline.experiments.read_before_edit.run import run_experiment

__all__ = ["ExperimentConfig", "load_config", "run_experiment"]
