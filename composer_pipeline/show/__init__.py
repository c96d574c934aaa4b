"""Audit views: what the agent saw at a step, what it did, and what each teacher saw and answered.

In:  stores holding the pipeline's tables (or tables in memory); state ids, pair ids, or a session by its
     session key or the short partition key the Dagster UI shows (``calc/a1f0c3d2``).
Out: typed views and two renderings of them:

* :mod:`.views`: what to show: :func:`gather` reads the rows from the stores (one multi-store read,
  :class:`~composer_pipeline.stores.Stores`, and one id resolver, :mod:`composer_pipeline.ids`, both
  shared with ``lineage``) into :class:`StateView` / :class:`PairView`; ``show --json`` is
  :func:`to_json_line`; :func:`state_views` / :func:`pair_views` for tables in memory (Dagster assets).
* :mod:`.walk`: the one per-message walk both formatters read, and the lines of actions and answers.
* :mod:`.text`: :func:`format_view`, the terminal view ``composer-pipeline show`` prints.
* :mod:`.markdown`: :func:`render_markdown`, the same view in Markdown (Dagster asset metadata).

Deliberately simplified: see each module.
"""

from composer_pipeline.ids import MIN_PREFIX
from composer_pipeline.show.markdown import render_markdown
from composer_pipeline.show.text import format_view
from composer_pipeline.show.views import (
    PairView,
    ShowError,
    StateView,
    TeacherAnswer,
    View,
    gather,
    pair_views,
    resolve_ids,
    state_views,
    to_json_line,
    view_from_dict,
)
from composer_pipeline.show.walk import call_text

__all__ = [
    "MIN_PREFIX",
    "PairView",
    "ShowError",
    "StateView",
    "TeacherAnswer",
    "View",
    "call_text",
    "format_view",
    "gather",
    "pair_views",
    "render_markdown",
    "resolve_ids",
    "state_views",
    "to_json_line",
    "view_from_dict",
]
