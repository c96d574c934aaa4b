"""Token counts for fitting a prefix into a teacher's window: the teacher's own tokenizer where the
project has it (local models the teacher server hosts), else the conservative bytes-per-token ratio of
:func:`composer_pipeline.render.count_tokens`.

In:  a :class:`TeachersConfig` and one of its teachers.
Out: :func:`counter_for` → a function ``message or tools list -> tokens`` for
     :func:`composer_pipeline.render.fit_messages`, or ``None`` (use the ratio).

A local teacher is one whose ``model`` is a key of the recipe's ``serve`` section; its tokenizer is the
``tokenizer.json`` of the model directory :func:`composer_pipeline.models.resolve_model` gives (read with
the ``tokenizers`` library, offline). A message counts as its JSON text's tokens plus the per-message
allowance of the chat template: the JSON carries keys, quotes and escapes the template does not
render, so this over-counts slightly, which is the safe side.

Deliberately simplified: API teachers' tokenizers are not here (``tiktoken`` downloads its files; no
Claude tokenizer is public); they use the ratio and the one refit on a provider's "too long".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

from composer_pipeline.models import resolve_model
from composer_pipeline.render import FIT_TOKENS_PER_MESSAGE
from composer_pipeline.teachers.config import TeacherConfig, TeachersConfig


@lru_cache(maxsize=8)
def _tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def tokenizer_file(config: TeachersConfig, teacher: TeacherConfig) -> Path | None:
    """The ``tokenizer.json`` of a locally served teacher's model, or None."""
    src = config.serve.get(teacher.model)
    if src is None:
        return None

    f = resolve_model(src) / "tokenizer.json"
    return f if f.is_file() else None


def counter_for(config: TeachersConfig, teacher: TeacherConfig) -> Callable[[Any], int] | None:
    """The teacher's tokenizer as a fitting counter (local models), else None: the bytes ratio."""
    if teacher.context_window is None:
        return None
    f = tokenizer_file(config, teacher)
    if f is None:
        return None
    tok = _tokenizer(str(f))

    def count(obj: Any) -> int:
        return len(tok.encode(orjson.dumps(obj).decode(), add_special_tokens=False).ids) + FIT_TOKENS_PER_MESSAGE

    return count
