"""The mutation catalog: every mutant is a real bug, and the suite kills a fast subset of
them with a check that names the entry the bug breaks (the whole catalog runs in
``nox -s mutants``)."""

from __future__ import annotations

import pytest
import torch

from gptspec.fast import ops
from gptspec.spec import REGISTRY
from meta.mutants import BY_NAME, MUTANTS, patched_ops
from meta.mutation import main, run_mutant, table

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
    from meta.mutants import _owner, patched_paths

    for m in MUTANTS:
        originals = {path: getattr(*_owner(path)) for path in m.elsewhere}
        with patched_paths(m.elsewhere):
            for path, fn in m.elsewhere.items():
                assert getattr(*_owner(path)) is fn, path
        assert {path: getattr(*_owner(path)) for path in m.elsewhere} == originals


@pytest.mark.parametrize("name", FAST_SUBSET)
def test_mutant_is_killed_by_a_check_naming_the_entry_it_breaks(name):
    result = run_mutant(name, profile="quick", seed=0)
    if BY_NAME[name].missing_here():
        # a kernel this CPU cannot run (AVX-512 BF16): the bug is never executed here, and
        # the runner must say so rather than report a survivor or a kill
        assert result.status == "not-run" and "which this machine lacks" in result.detail
        assert not result.killed_by and not result.on_target
        return
    assert result.killed_by, f"{name} survived the suite"
    assert result.on_target, f"{name} killed by {result.killed_by} ({result.check_entries})"
    assert result.status in ("fail", "error")


def test_the_table_shows_a_survivor_and_the_command_fails_on_it(monkeypatch, capsys):
    from meta import mutation

    survivor = mutation.MutantResult("noop", ["softmax"], "", [], "survived", False, 0.0)
    assert "SURVIVED" in table([survivor]) and "| NO " in table([survivor])
    monkeypatch.setattr(mutation, "run_catalog", lambda *a, **k: [survivor])
    monkeypatch.setitem(BY_NAME, "noop", MUTANTS[0])
    assert main(["noop", "--jobs", "1"]) == 1
    assert "0 of 1 mutants killed" in capsys.readouterr().out


def test_a_mutant_is_not_run_exactly_where_the_machine_lacks_its_code_path():
    from gptspec.fast import bf16_gemv, prepacked

    onednn = prepacked.supported("cpu", torch.bfloat16)
    expected = {"prepacked_product_drops_bias": onednn,
                "bf16_gemv_stops_a_column_pair_short": onednn and bf16_gemv.available()}
    for name, runs_here in expected.items():
        assert (BY_NAME[name].missing_here() is None) == runs_here, name
    assert all(m.missing_here() is None for m in MUTANTS if m.name not in expected)


def test_a_catalog_of_only_unrunnable_mutants_is_no_verdict(monkeypatch, capsys):
    import dataclasses

    from meta import mutation

    absent = dataclasses.replace(BY_NAME["mask_shifted_by_one"],
                                 requires=("a machine nobody has", lambda: False))
    monkeypatch.setitem(mutation.BY_NAME, absent.name, absent)
    assert main([absent.name, "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "needs a machine nobody has, which this machine lacks" in out
    assert "1 not run" in out
