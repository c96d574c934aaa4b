"""Where assets appear in the UI: one asset group for the whole pipeline, each stage as a tag.

Dagster's global lineage graph (*Lineage* in the left bar) draws asset groups collapsed whenever
there is more than one group (its layout's "if-varied" group rendering; which groups are open is
only a URL / browser-storage setting, nothing a code location can set). Four stage groups hid every
asset name there until *Expand all groups*. With one group the graph shows every asset by name;
the stage (``ingest``, ``replay``, ``pairs``, ``train``) is the ``stage`` tag, shown on each asset
page and usable in selections (``tag:stage=replay`` in the catalog, ``AssetSelection.tag``).
"""

GROUP = "composer_pipeline"


def stage(name: str) -> dict[str, str]:
    """The tags of an asset of one stage."""
    return {"stage": name}
