"""The mutation catalog: every mutant is a real bug, and the suite kills a fast subset of
them with a check that names the entry the bug breaks (the whole catalog runs in
``nox -s mutants``)."""

from __future__ import annotations

import pytest

from gptspec.fast import ops
from gptspec.fast.mutants import BY_NAME, MUTANTS, patched_ops
from gptspec.fast.mutation import main, run_mutant, table
from gptspec.spec import REGISTRY

FAST_SUBSET = ("mask_shifted_by_one", "softmax_without_max_shift", "l2_instead_of_decoupled_decay",
               "heads_split_without_transpose", "positions_off_by_one",
               "train_ties_to_largest_pair", "bpe_merges_by_frequency", "stale_kv_cache_position",
               "decode_step_misses_its_own_key", "bf16_gemv_stops_a_column_pair_short")


def test_the_catalog_has_at_least_25_named_documented_mutants_of_existing_entries():
    assert len(MUTANTS) >= 25
    ids = {e.id for e in REGISTRY}
    for m in MUTANTS:
        assert m.doc and m.breaks, m.name
        assert set(m.breaks) <= ids, f"{m.name} breaks unknown entries {m.breaks}"
    assert {m.area for m in MUTANTS} >= {"forward", "tokenizer", "generation"}


def test_forward_mutants_patch_existing_operations_and_restore_them():
    before = {name: getattr(ops, name) for name in dir(ops)}
    for m in MUTANTS:
        assert set(m.patches) <= set(before), m.name
        with patched_ops(m.patches):
            for name, fn in m.patches.items():
                assert getattr(ops, name) is fn
    assert {name: getattr(ops, name) for name in dir(ops)} == before


def test_generation_mutants_patch_existing_functions_and_restore_them():
    from gptspec.fast.mutants import _owner, patched_paths

    for m in MUTANTS:
        originals = {path: getattr(*_owner(path)) for path in m.elsewhere}
        with patched_paths(m.elsewhere):
            for path, fn in m.elsewhere.items():
                assert getattr(*_owner(path)) is fn, path
        assert {path: getattr(*_owner(path)) for path in m.elsewhere} == originals


@pytest.mark.parametrize("name", FAST_SUBSET)
def test_mutant_is_killed_by_a_check_naming_the_entry_it_breaks(name):
    result = run_mutant(name, profile="quick", seed=0)
    assert result.killed_by, f"{name} survived the suite"
    assert result.on_target, f"{name} killed by {result.killed_by} ({result.check_entries})"
    assert result.status in ("fail", "error")


def test_the_table_shows_a_survivor_and_the_command_fails_on_it(monkeypatch, capsys):
    from gptspec.fast import mutation

    survivor = mutation.MutantResult("noop", ["softmax"], "", [], "survived", False, 0.0)
    assert "SURVIVED" in table([survivor]) and "| NO " in table([survivor])
    monkeypatch.setattr(mutation, "run_catalog", lambda *a, **k: [survivor])
    monkeypatch.setitem(BY_NAME, "noop", MUTANTS[0])
    assert main(["noop", "--jobs", "1"]) == 1
    assert "0 of 1 mutants killed" in capsys.readouterr().out
