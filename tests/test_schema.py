"""The record's fields are declared once (``harness.record.schema.Figures``): everything else follows from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.analysis.results import BASE_COLUMNS
from harness.decode.engine import Generation
from harness.record.schema import (
    NUMERIC_FIELDS,
    RECORD_FIELDS,
    Figures,
    Outcome,
    combine_calls,
    figures_of,
    record_table,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_record_table_is_the_declaration():
    assert record_table() in README.read_text(), (
        "README.md's record table differs from harness.record.schema: replace it with\n" + record_table()
    )


def test_every_figure_declares_its_type_default_rule_and_meaning():
    hints = Figures.__annotations__
    for field in dataclasses.fields(Figures):
        assert field.name in hints
        assert field.metadata["over_calls"] in ("sum", "largest", "derived"), field.name
        assert field.metadata["meaning"], field.name
        assert field.default is not dataclasses.MISSING, field.name
    assert list(NUMERIC_FIELDS) == [field.name for field in dataclasses.fields(Figures)]
    assert list(RECORD_FIELDS[RECORD_FIELDS.index("metrics") + 1 :][: len(NUMERIC_FIELDS)]) == list(NUMERIC_FIELDS)


def test_the_engine_output_and_the_analysis_columns_come_from_the_declaration():
    assert issubclass(Generation, Figures)
    assert set(NUMERIC_FIELDS) <= set(BASE_COLUMNS)
    generation = Generation(tokens=[1, 2, 3], new_tokens=3, prefill_len=10, decode_s=2.0, slot_bytes_final=7)
    assert figures_of(generation) == Figures(prefill_len=10, new_tokens=3, decode_s=2.0, slot_bytes_final=7)


def test_calls_combine_by_their_declared_rules():
    first = Figures(prefill_len=10, kv_bytes_full=100, decode_s=1.0, prefill_s=0.5, new_tokens=3, score_s=0.25)
    second = Figures(prefill_len=40, kv_bytes_full=400, decode_s=3.0, prefill_s=1.5, new_tokens=1, score_s=0.75)
    combined = combine_calls([first, second])
    # Sizes are the largest call's; times and tokens add up; the rate counts each call's decode steps.
    assert (combined.prefill_len, combined.kv_bytes_full) == (40, 400)
    assert (combined.decode_s, combined.prefill_s, combined.score_s, combined.new_tokens) == (4.0, 2.0, 1.0, 4)
    assert combined.decode_tokens_per_s == (2 + 0) / 4.0


def test_an_outcome_from_flat_fields_keeps_the_rest_as_meta_in_order():
    outcome = Outcome.from_fields(
        {"metrics": {"a": 1.0}, "prediction": "", "decode_s": 2.0, "max_cache_len": 5, "prefill_len": 3, "world": "p"}
    )
    assert outcome.figures == Figures(decode_s=2.0, prefill_len=3)
    assert list(outcome.meta) == ["max_cache_len", "world"]
