"""A model split into layer ranges across machines: stages on Ray, each under its own budget.

    split.py      the layer ranges, chosen by bytes, each planned under its stage's budget (no Ray)
    stage.py      one stage: Engine.load(layers=(a, b)) in its own process, its identity checks
    pipeline.py   the driver: connect, start the stage actors, chunks through them, typed failures

Ray is imported only by pipeline.connect (pip install 'ramforge[cluster]').
"""
from __future__ import annotations


def __getattr__(name):
    if name in ("Pipeline", "connect", "RAY_SYSTEM_CONFIG"):
        from . import pipeline

        return getattr(pipeline, name)
    if name in ("plan_stages", "split_layers", "parse_budgets"):
        from . import split

        return getattr(split, name)
    raise AttributeError(f"module 'ramforge.cluster' has no attribute {name!r}")


__all__ = ["Pipeline", "connect", "plan_stages", "split_layers", "parse_budgets", "RAY_SYSTEM_CONFIG"]
