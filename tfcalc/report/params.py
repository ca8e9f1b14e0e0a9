"""Rows for `tfcalc params`: totals, active counts and the per-component breakdown."""

from __future__ import annotations

from tfcalc.calc.params import count_params
from tfcalc.dtypes import PARAM_COMPONENTS
from tfcalc.spec.model import ModelSpec
from tfcalc.units import format_count

Row = dict[str, object]


def params_rows(specs: list[ModelSpec]) -> list[Row]:
    """Per model: total and active parameters, then each component's total and active count."""
    rows: list[Row] = []
    for spec in specs:
        counts = count_params(spec)
        row: Row = {
            "model": spec.name,
            "total_params": counts.total_params,
            "active_params": counts.active_params,
            "non_embedding_params": counts.total_params - counts.total["embedding"].total
            - counts.total["lm_head"].total,
        }
        for component in PARAM_COMPONENTS:
            row[f"{component}_params"] = counts.total[component].total
            row[f"{component}_active_params"] = counts.active[component].total
        row["active_convention"] = counts.convention
        rows.append(row)
    return rows


def params_breakdown_rows(specs: list[ModelSpec]) -> list[Row]:
    """Long format for the table: one row per (model, component) with its share of the total, then the exact
    total."""
    rows: list[Row] = []
    for spec in specs:
        counts = count_params(spec)
        for component in PARAM_COMPONENTS:
            total = counts.total[component].total
            if total == 0:
                continue
            rows.append({"model": spec.name, "component": component, "component_params": total,
                         "component_active_params": counts.active[component].total,
                         "share_of_total": total / counts.total_params})
        rows.append({"model": spec.name, "component": "total", "component_params": counts.total_params,
                     "component_active_params": counts.active_params, "share_of_total": 1.0})
    return rows


def params_notes(specs: list[ModelSpec]) -> tuple[str, ...]:
    """The active-parameter convention of each MoE model (where total and active differ), then what is not
    counted (``mtp_notes``)."""
    models: dict[str, list[str]] = {}
    for spec in specs:
        counts = count_params(spec)
        if counts.total_params != counts.active_params:
            models.setdefault(counts.convention, []).append(spec.name)
    conventions = tuple(f"active convention for {', '.join(names)}: {convention}"
                        for convention, names in models.items())
    return conventions + mtp_notes(specs)


def mtp_notes(specs: list[ModelSpec]) -> tuple[str, ...]:
    """Models whose checkpoint also ships multi-token-prediction layers, which no count here includes."""
    return tuple(f"{spec.name}: not counted: the {format_count(spec.num_mtp_layers, 'multi-token-prediction layer')}"
                 " its checkpoint also ships for speculative decoding"
                 for spec in specs if spec.num_mtp_layers)
