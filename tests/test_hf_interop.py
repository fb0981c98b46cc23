"""transformers interop: import a random GPT2LMHeadModel, export back, round trip.

transformers is the peer: in float64 it must agree with the float64 reference to
1e-10 relative (a layout or formula mistake shows up at 1e-3 or worse); in float32 the
reference's derived budget (gptspec.conformance.budgets) bounds both it and our backend.
"""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from gptspec.conformance.budgets import Precision, compare, gpt_forward_bound  # noqa: E402
from gptspec.fast import hf_interop  # noqa: E402
from gptspec.fast.hf_interop import (  # noqa: E402
    InteropError,
    config_to_hf,
    from_hf_model,
    load_hf_dir,
    save_hf_dir,
    to_hf_model,
)
from gptspec.fast.tokenizer import ENDOFTEXT  # noqa: E402
from gptspec.reference.output import gpt_forward  # noqa: E402
from gptspec.spec import PRESETS  # noqa: E402

F64_RELATIVE = 1e-10

HF_CONFIGS = {
    "gelu_new-tied": dict(activation_function="gelu_new"),
    "gelu-untied": dict(activation_function="gelu", tie_word_embeddings=False),
    "relu-narrow-ffn": dict(activation_function="relu", n_inner=40),
}


def random_hf_model(dtype=torch.float64, seed: int = 0, **overrides):
    """A GPT2LMHeadModel with every parameter random, LayerNorm gains and biases too
    (fresh LayerNorms are exactly 1 and 0, which would hide a swapped mapping)."""
    kwargs = dict(vocab_size=97, n_positions=24, n_embd=48, n_layer=3, n_head=4,
                  bos_token_id=None, eos_token_id=None)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kwargs)).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if ".ln_" in name else 0.05))
    return model


def tokens_for(config, batch=2, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, config.vocab_size, size=(batch, config.n_ctx))


def hf_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.double().numpy()


def relative(actual, expected) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_reference_reproduces_transformers_float64(case):
    model = random_hf_model(**HF_CONFIGS[case])
    config, params = from_hf_model(model)
    assert config.tied_embeddings == model.config.tie_word_embeddings
    tokens = tokens_for(config)
    assert relative(gpt_forward(tokens, params, config), hf_logits(model, tokens)) <= F64_RELATIVE


def test_a_swapped_mapping_is_caught(monkeypatch):
    """The 1e-10 comparison catches importing ln_2's gain as ln_1's."""
    monkeypatch.setitem(hf_interop.BLOCK_NAMES, "ln_1.weight", "ln_2.weight")
    model = random_hf_model()
    config, params = from_hf_model(model)
    tokens = tokens_for(config)
    assert relative(gpt_forward(tokens, params, config), hf_logits(model, tokens)) > 1e-4


def test_a_wrong_activation_is_caught():
    """gelu_new (tanh) and gelu (erf) differ by ~1e-3: the comparison tells them apart."""
    model = random_hf_model(activation_function="gelu_new")
    config, params = from_hf_model(model)
    tokens = tokens_for(config)
    wrong = config.replace(ffn="gelu")
    assert relative(gpt_forward(tokens, params, wrong), hf_logits(model, tokens)) > 1e-6


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_float32_transformers_and_fast_backend_within_the_derived_budget(case):
    from gptspec.fast.model import GPT

    model = random_hf_model(dtype=torch.float32, **HF_CONFIGS[case])
    config, params = from_hf_model(model)  # float32 values, held exactly in float64
    tokens = tokens_for(config)
    expected = gpt_forward(tokens, params, config)
    bound = gpt_forward_bound(tokens, params, config, Precision.of("float32"))
    hf = compare(hf_logits(model, tokens), expected, bound)
    assert hf.passed, hf.describe()
    fast = GPT.from_parameters(params, config, device="cpu", dtype=torch.float32).eval()
    with torch.no_grad():
        ours = fast(torch.as_tensor(tokens)).double().numpy()
    result = compare(ours, expected, bound)
    assert result.passed, result.describe()


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, case):
    source = random_hf_model(**HF_CONFIGS[case])
    config, params = from_hf_model(source)
    out = save_hf_dir(tmp_path / "hf", params, config, dtype=torch.float64)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(out), dtype=torch.float64).eval()
    tokens = tokens_for(config)
    assert relative(hf_logits(loaded, tokens), gpt_forward(tokens, params, config)) \
        <= F64_RELATIVE


def test_float32_export_within_the_derived_budget(tmp_path):
    config = PRESETS["tiny"]
    from gptspec.conformance.budgets import round_to
    from gptspec.spec import init_parameters

    params = {k: round_to(v, "float32") for k, v in init_parameters(config, seed=5).items()}
    out = save_hf_dir(tmp_path / "hf", params, config)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    assert loaded.dtype == torch.float32
    tokens = tokens_for(config)
    result = compare(hf_logits(loaded, tokens), gpt_forward(tokens, params, config),
                     gpt_forward_bound(tokens, params, config, Precision.of("float32")))
    assert result.passed, result.describe()


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_round_trip_is_exact(tmp_path, case):
    source = random_hf_model(dtype=torch.float32, **HF_CONFIGS[case])
    config, params = from_hf_model(source)
    out = save_hf_dir(tmp_path / "hf", params, config)
    config2, params2 = load_hf_dir(out)
    assert config2 == config
    assert params2.keys() == params.keys()
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k])
    exported = to_hf_model(params2, config2).state_dict()
    for k, v in source.state_dict().items():
        assert torch.equal(exported[k], v), k


@pytest.mark.parametrize("preset, field", [
    ("tiny-post", "norm='post'"),
    ("tiny-guide", "norm='guide'"),
    ("blueprint", "norm='post'"),
])
def test_inexpressible_presets_are_refused(preset, field):
    with pytest.raises(InteropError, match=field):
        config_to_hf(PRESETS[preset])


@pytest.mark.parametrize("change, field", [
    (dict(ffn="guide_product", d_ff=32), "ffn='guide_product'"),
    (dict(attn_bias=False), "attn_bias=False"),
    (dict(ffn_bias=False), "ffn_bias=False"),
    (dict(positional_embedding=False), "positional_embedding=False"),
    (dict(d_head=5), "d_head=5"),
    (dict(tied_embeddings=False, output_bias=True), "output_bias=True"),
    (dict(final_norm=False), "final_norm=False"),
])
def test_inexpressible_fields_are_refused(change, field):
    config = PRESETS["tiny"].replace(**change)
    with pytest.raises(InteropError, match=field) as err:
        config_to_hf(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("option, value", [
    ("scale_attn_by_inverse_layer_idx", True),
    ("scale_attn_weights", False),
    ("activation_function", "silu"),
])
def test_transformers_options_without_a_counterpart_are_refused(option, value):
    model = random_hf_model(**{option: value})
    with pytest.raises(InteropError, match=option):
        from_hf_model(model)


def test_bad_directories(tmp_path):
    with pytest.raises(InteropError, match="no config.json"):
        load_hf_dir(tmp_path)
    model = random_hf_model(dtype=torch.float32)
    model.save_pretrained(str(tmp_path / "bin"))
    (tmp_path / "bin" / "model.safetensors").unlink()  # as if only pickled weights were there
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(InteropError, match="no .safetensors"):
        load_hf_dir(tmp_path / "bin")
    config, params = from_hf_model(model)
    out = save_hf_dir(tmp_path / "ok", params, config)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InteropError, match="cannot be loaded") as err:
        load_hf_dir(out)
    assert "\n" not in str(err.value)
    with pytest.raises(InteropError, match="already exists"):
        save_hf_dir(out, params, config)
    (out / "config.json").write_text("{not json")
    with pytest.raises(InteropError, match="config.json cannot be read") as err:
        load_hf_dir(out)
    assert "\n" not in str(err.value)
    (out / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(InteropError, match="model_type 'bert' is not 'gpt2'"):
        load_hf_dir(out)
    # a key given twice: transformers would take the last, a different model, silently
    (out / "config.json").write_text('{"model_type": "gpt2", "n_head": 4, "n_head": 2}')
    with pytest.raises(InteropError, match="n_head") as err:
        load_hf_dir(out)
    assert "\n" not in str(err.value)
    (out / "config.json").write_text('{"model_type": "gpt2", "task_specific_params": '
                                     '{"a": 1, "a": 2}}')
    with pytest.raises(InteropError, match="config.json cannot be read"):
        load_hf_dir(out)


def test_convert_command_round_trip(tmp_path, capsys):
    from gptspec.cli import main
    from gptspec.fast.checkpoint import load_model, save_model

    config = PRESETS["tiny"]
    from gptspec.conformance.budgets import round_to
    from gptspec.spec import init_parameters

    params = {k: round_to(v, "float32") for k, v in init_parameters(config, seed=7).items()}
    save_model(tmp_path / "ck", params, config)
    assert main(["convert", "--to-hf", str(tmp_path / "ck"), str(tmp_path / "hf")]) == 0
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"))
    assert from_hf_model(loaded)[0] == config
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    config2, params2 = load_model(tmp_path / "back")
    assert config2 == config
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k])
    capsys.readouterr()
    # refusals: an existing output, a missing source, an inexpressible model
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 2
    assert main(["convert", "--to-hf", str(tmp_path / "none"), str(tmp_path / "x")]) == 2
    save_model(tmp_path / "post", init_parameters(PRESETS["tiny-post"]), PRESETS["tiny-post"])
    assert main(["convert", "--to-hf", str(tmp_path / "post"), str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("gptspec convert: error:") for line in err)
    assert "already exists" in err[0] and "does not exist" in err[1] and "norm='post'" in err[2]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_transformers_default_gpt2_config_is_the_gpt2_preset():
    assert hf_interop.config_from_hf(transformers.GPT2Config()) == PRESETS["gpt2"]


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_transformers_counts_the_same_parameters(name):
    """An independent count: transformers' own model of each size (on the meta device, so
    no memory), its distinct parameters (the tied lm_head counted once)."""
    from gptspec.reference import param_count_total

    config = PRESETS[name]
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config_to_hf(config))
    distinct = {id(p): p.numel() for p in model.parameters()}
    assert sum(distinct.values()) == param_count_total(config)


# --- the tokenizer travels with the weights ---------------------------------------------------

# spaces, a whitespace run, newlines, punctuation, contractions, non-ASCII and the special
# token: each is a place where a pre-tokenizer or a byte mapping could go wrong
TOKENIZER_TEXT = ("Hello,  world!\n\n  naïve café — 中文 😀 it's 1,000.\t\tend<|endoftext|>"
                  "New doc:\r\n  x = f(y) # ok?  spaced , out . don 't !\n")
TRAINING_TEXT = ("The quick brown fox jumps over the lazy dog. It's a fox's world, isn't it?\n"
                 "  def f(x):\n      return x * 2  # doubled\n"
                 "Naïve café résumé, 中文 中文 文字, 😀 😀 emoji.\n") * 20


def small_tokenizer(pattern="gpt2", special_tokens=(ENDOFTEXT,)):
    from gptspec.fast.tokenizer import Tokenizer

    return Tokenizer.train(TRAINING_TEXT, 300, pattern, special_tokens)


def write_checkpoint(path, tokenizer=None, vocab_size=320, seed=7):
    """A tiny float32 checkpoint (vocabulary padded past the tokenizer's, as is common)."""
    from gptspec.conformance.budgets import round_to
    from gptspec.fast.checkpoint import save_model
    from gptspec.spec import init_parameters

    config = PRESETS["tiny"].replace(vocab_size=vocab_size)
    params = {k: round_to(v, "float32") for k, v in init_parameters(config, seed=seed).items()}
    save_model(path, params, config)
    if tokenizer is not None:
        tokenizer.save(path / "tokenizer.json")
    return config, params


def convert(*argv) -> int:
    from gptspec.cli import main

    return main(["convert", *map(str, argv)])


def errors(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("pattern, special", [("gpt2", (ENDOFTEXT,)),
                                              ("cl100k", (ENDOFTEXT,)),
                                              ("gpt2", ())])
def test_to_hf_tokenizer_loads_in_transformers_with_the_same_ids(tmp_path, pattern, special):
    """cl100k's pattern catches a tokenizer class that rebuilds GPT-2's pre-tokenizer."""
    tok = small_tokenizer(pattern, special)
    write_checkpoint(tmp_path / "ck", tok)
    assert convert("--to-hf", tmp_path / "ck", tmp_path / "hf") == 0
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert isinstance(hf, transformers.PreTrainedTokenizerFast)
    text = TOKENIZER_TEXT if special else TOKENIZER_TEXT.replace(ENDOFTEXT, " ")
    ids = tok.encode(text, allowed_special="all")
    assert hf(text)["input_ids"] == ids
    assert hf.decode(ids) == text
    hf_config = transformers.AutoConfig.from_pretrained(str(tmp_path / "hf"))
    generation = transformers.GenerationConfig.from_pretrained(str(tmp_path / "hf"))
    eot = tok.eot_token
    assert (eot is not None) == bool(special)
    assert hf.eos_token_id == hf.bos_token_id == eot
    assert hf_config.eos_token_id == hf_config.bos_token_id == eot
    assert generation.eos_token_id == generation.bos_token_id == eot


def test_round_trip_keeps_the_tokenizer_and_the_logits(tmp_path, capsys):
    from gptspec.fast.checkpoint import load_model
    from gptspec.fast.model import GPT
    from gptspec.fast.tokenizer import Tokenizer

    tok = small_tokenizer()
    config, params = write_checkpoint(tmp_path / "ck", tok)
    assert convert("--to-hf", tmp_path / "ck", tmp_path / "hf") == 0
    assert convert("--from-hf", tmp_path / "hf", tmp_path / "back") == 0
    back = Tokenizer.load(tmp_path / "back" / "tokenizer.json")
    assert (back.merges, back.base, back.pattern, back.special_tokens) == \
        (tok.merges, tok.base, tok.pattern, tok.special_tokens)
    ids = tok.encode(TOKENIZER_TEXT, allowed_special="all")
    assert back.encode(TOKENIZER_TEXT, allowed_special="all") == ids

    config2, params2 = load_model(tmp_path / "back")
    assert config2 == config
    tokens = torch.as_tensor([ids[: config.n_ctx]])
    with torch.no_grad():
        before = GPT.from_parameters(params, config, dtype=torch.float32)(tokens)
        after = GPT.from_parameters(params2, config2, dtype=torch.float32)(tokens)
    assert torch.equal(before, after)

    # end to end: the converted checkpoint generates what the original does
    capsys.readouterr()
    outputs = []
    for ck in ("ck", "back"):
        assert main_generate(tmp_path / ck) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("Hello")


def main_generate(checkpoint) -> int:
    from gptspec.cli import main

    return main(["generate", "--checkpoint", str(checkpoint), "--prompt", "Hello",
                 "--max-new-tokens", "8", "--temperature", "0"])


def hf_model_dir(path, vocab_size=320):
    """A transformers directory holding weights only."""
    config, params = from_hf_model(random_hf_model(dtype=torch.float32, vocab_size=vocab_size,
                                                   n_positions=16, n_embd=32, n_layer=1))
    return save_hf_dir(path, params, config)


def test_from_hf_reads_gpt2_classic_vocab_and_merges(tmp_path):
    """vocab.json + merges.txt as the tokenizers library writes them, with <|endoftext|>
    after the merged tokens as in GPT-2's own vocab.json; transformers' GPT2Tokenizer,
    reading the same pair, is the judge."""
    import json

    from gptspec.fast.tokenizer import Tokenizer

    tok = small_tokenizer()
    hf = hf_model_dir(tmp_path / "hf")
    tok.save(tmp_path / "tokenizer.json", "hf")
    from tokenizers import Tokenizer as HFTokenizer

    HFTokenizer.from_file(str(tmp_path / "tokenizer.json")).model.save(str(hf))
    vocab = json.loads((hf / "vocab.json").read_text())
    vocab[ENDOFTEXT] = len(vocab)
    (hf / "vocab.json").write_text(json.dumps(vocab))
    assert convert("--from-hf", hf, tmp_path / "ck") == 0
    ours = Tokenizer.load(tmp_path / "ck" / "tokenizer.json")
    assert ours.eot_token == tok.eot_token == 299
    judge = transformers.GPT2Tokenizer.from_pretrained(str(hf))
    ids = ours.encode(TOKENIZER_TEXT, allowed_special="all")
    assert ids == judge(TOKENIZER_TEXT)["input_ids"] == tok.encode(TOKENIZER_TEXT,
                                                                   allowed_special="all")


def test_from_hf_without_a_tokenizer_warns_and_writes_the_weights(tmp_path, capsys):
    hf = hf_model_dir(tmp_path / "hf")
    assert convert("--from-hf", hf, tmp_path / "ck") == 0
    (warning,) = errors(capsys)
    assert warning.startswith("gptspec convert: warning:") and "no tokenizer" in warning
    assert (tmp_path / "ck" / "model.safetensors").is_file()
    assert not (tmp_path / "ck" / "tokenizer.json").exists()
    assert main_generate(tmp_path / "ck") == 2
    assert "has no tokenizer.json" in errors(capsys)[0]


def unsupported_tokenizers():
    """(name, what to write into a transformers directory, words the error must hold)."""
    import json

    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    def wordpiece(hf):
        word = HFTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
        word.save(str(hf / "tokenizer.json"))

    def split_then_bytelevel_regex(hf):  # two regexes in a row: no one pattern says that
        small_tokenizer().save(hf / "tokenizer.json", "hf")
        doc = json.loads((hf / "tokenizer.json").read_text())
        doc["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = True
        (hf / "tokenizer.json").write_text(json.dumps(doc))

    def metaspace(hf):
        small_tokenizer().save(hf / "tokenizer.json", "hf")
        doc = json.loads((hf / "tokenizer.json").read_text())
        doc["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace().__getstate__())
        (hf / "tokenizer.json").write_text(json.dumps(doc))

    def added_not_special(hf):  # HF matches it in raw text; gptspec's BPE would not
        small_tokenizer().save(hf / "tokenizer.json", "hf")
        doc = json.loads((hf / "tokenizer.json").read_text())
        doc["added_tokens"].append({"id": 300, "content": "fox", "special": False})
        (hf / "tokenizer.json").write_text(json.dumps(doc))

    def prefix_space(hf):
        small_tokenizer().save(hf / "tokenizer.json", "hf")
        (hf / "tokenizer_config.json").write_text('{"add_prefix_space": true}')

    def edited(change):  # the small tokenizer's file, one field changed
        def write(hf):
            small_tokenizer().save(hf / "tokenizer.json", "hf")
            doc = json.loads((hf / "tokenizer.json").read_text())
            change(doc)
            (hf / "tokenizer.json").write_text(json.dumps(doc))
        return write

    def template(doc):  # HF puts <|endoftext|> before every encoding
        from tokenizers import processors

        eot = doc["added_tokens"][0]["id"]
        doc["post_processor"] = json.loads(processors.TemplateProcessing(
            single=f"{ENDOFTEXT} $A", special_tokens=[(ENDOFTEXT, eot)]).__getstate__())

    def added(option):
        return lambda doc: doc["added_tokens"][0].update({option: True})

    return {
        "wordpiece": (wordpiece, "BPE model (its model is WordPiece)"),
        "sentencepiece": (lambda hf: (hf / "tokenizer.model").write_bytes(b"\x0a\x00"),
                          "tokenizer.model is not a byte-level BPE"),
        "vocab-alone": (lambda hf: (hf / "vocab.json").write_text("{}"),
                        "vocab.json without merges.txt"),
        "split-then-regex": (split_then_bytelevel_regex, "one pattern cannot express"),
        "metaspace": (metaspace, "not byte-level"),
        "prefix-space": (prefix_space, "add_prefix_space=true"),
        "added-not-special": (added_not_special, "added token 'fox' is not special"),
        "template-post-processor": (edited(template), "post_processor 'TemplateProcessing'"),
        "added-lstrip": (edited(added("lstrip")), "sets lstrip=true"),
        "added-rstrip": (edited(added("rstrip")), "sets rstrip=true"),
        "added-single-word": (edited(added("single_word")), "sets single_word=true"),
    }


@pytest.mark.parametrize("case", sorted(unsupported_tokenizers()))
def test_from_hf_unsupported_tokenizer_is_a_one_line_error(tmp_path, capsys, case):
    write, words = unsupported_tokenizers()[case]
    hf = hf_model_dir(tmp_path / "hf")
    write(hf)
    capsys.readouterr()
    assert convert("--from-hf", hf, tmp_path / "ck") == 2
    (line,) = errors(capsys)
    assert line.startswith("gptspec convert: error: unsupported tokenizer") or \
        "add_prefix_space" in line
    assert words in line and line.endswith("--no-tokenizer converts the weights alone")
    assert not (tmp_path / "ck").exists()  # nothing written
    assert convert("--from-hf", hf, tmp_path / "ck", "--no-tokenizer") == 0
    assert not (tmp_path / "ck" / "tokenizer.json").exists()



def test_from_hf_options_that_change_ids_would_have_changed_them(tmp_path):
    """What the refusals above prevent: HF's ids differ from gptspec's for each."""
    import json

    from tokenizers import Tokenizer as HFTokenizer

    from gptspec.fast.tokenizer_files import tokenizer_from_hf_doc

    tok = small_tokenizer()
    text = f"a x {ENDOFTEXT} b"
    ids = tok.encode(text, allowed_special="all")
    cases = unsupported_tokenizers()
    for case in ("template-post-processor", "added-lstrip", "added-rstrip"):
        folder = tmp_path / case
        folder.mkdir()
        cases[case][0](folder)
        doc = (folder / "tokenizer.json").read_text()
        assert HFTokenizer.from_str(doc).encode(text).ids != ids, case
        with pytest.raises(ValueError, match=cases[case][1]):
            tokenizer_from_hf_doc(folder / "tokenizer.json", json.loads(doc))


def test_from_hf_accepts_gpt2s_own_post_processor_and_added_token(tmp_path):
    """GPT-2's tokenizer.json: a ByteLevel post-processor (offsets only) with
    add_prefix_space true, and <|endoftext|> with normalized true (no normalizer)."""
    import json

    from tokenizers import Tokenizer as HFTokenizer

    from gptspec.fast.tokenizer_files import tokenizer_from_hf_doc

    folder = tmp_path
    small_tokenizer().save(folder / "tokenizer.json", "hf")
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True,
                             "trim_offsets": False, "use_regex": True}
    doc["added_tokens"][0]["normalized"] = True
    tok = tokenizer_from_hf_doc(folder / "tokenizer.json", doc)
    text = f"a x {ENDOFTEXT} b  c"
    assert tok.encode(text, allowed_special="all") == \
        HFTokenizer.from_str(json.dumps(doc)).encode(text).ids

def test_from_hf_tokenizer_larger_than_the_model_is_refused(tmp_path, capsys):
    hf = hf_model_dir(tmp_path / "hf", vocab_size=290)
    small_tokenizer().save(hf / "tokenizer.json", "hf")  # 300 tokens
    capsys.readouterr()
    assert convert("--from-hf", hf, tmp_path / "ck") == 2
    (line,) = errors(capsys)
    assert "the tokenizer has 300 tokens but the model only 290" in line
    assert not (tmp_path / "ck").exists()


def test_from_hf_keeps_what_out_dir_already_holds(tmp_path, capsys):
    hf = hf_model_dir(tmp_path / "hf")
    small_tokenizer().save(hf / "tokenizer.json", "hf")
    out = tmp_path / "ck"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "tokenizer.json").write_text("also mine")
    capsys.readouterr()
    assert convert("--from-hf", hf, out) == 2
    assert "tokenizer.json already exists" in errors(capsys)[0]
    assert (out / "tokenizer.json").read_text() == "also mine"
    assert not (out / "model.safetensors").exists()
    (out / "tokenizer.json").unlink()
    assert convert("--from-hf", hf, out) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "notes.txt",
                                                     "tokenizer.json"]


def test_to_hf_tokenizer_problems(tmp_path, capsys):
    tok = small_tokenizer()
    # more tokens than the model: refused before anything is written
    write_checkpoint(tmp_path / "small", tok, vocab_size=290)
    capsys.readouterr()
    assert convert("--to-hf", tmp_path / "small", tmp_path / "a") == 2
    (line,) = errors(capsys)
    assert "300 tokens but the model only 290" in line and "--no-tokenizer" in line
    assert not (tmp_path / "a").exists()
    # a corrupt tokenizer.json: refused, naming the file
    write_checkpoint(tmp_path / "bad", tok)
    (tmp_path / "bad" / "tokenizer.json").write_text('{"format": "gptspec-tokenizer"')
    assert convert("--to-hf", tmp_path / "bad", tmp_path / "b") == 2
    (line,) = errors(capsys)
    assert "cannot load the tokenizer" in line and "tokenizer.json" in line
    assert not (tmp_path / "b").exists()
    assert convert("--to-hf", tmp_path / "bad", tmp_path / "b", "--no-tokenizer") == 0
    assert not (tmp_path / "b" / "tokenizer.json").exists()
    # no tokenizer at all: a warning, and the weights
    write_checkpoint(tmp_path / "bare")
    capsys.readouterr()
    assert convert("--to-hf", tmp_path / "bare", tmp_path / "c") == 0
    (warning,) = errors(capsys)
    assert warning.startswith("gptspec convert: warning:") and "tokenizer.json" in warning
    assert (tmp_path / "c" / "model.safetensors").is_file()
    assert not (tmp_path / "c" / "tokenizer.json").exists()


def test_real_gpt2_tokenizer_through_transformers(tmp_path):
    """GPT-2's own vocabulary (numbered in its byte order, not the identity) written for
    transformers and read back: the same ids as tiktoken's GPT-2, both ways."""
    from test_tokenizer_gpt2 import fetch_gpt2_ranks, varied_texts

    from gptspec.fast.hf_interop import load_hf_tokenizer, save_hf_tokenizer
    from gptspec.fast.tokenizer import Tokenizer

    gpt2 = Tokenizer.load(fetch_gpt2_ranks())
    assert gpt2.base != tuple(range(256))
    save_hf_tokenizer(tmp_path, gpt2, 1024)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.eos_token_id == 50256 and hf.model_max_length == 1024
    back = load_hf_tokenizer(tmp_path)
    assert back.merges == gpt2.merges and back.base == gpt2.base
    for text in [*varied_texts().values(), TOKENIZER_TEXT]:
        ids = gpt2.encode(text, allowed_special="all")
        assert hf(text)["input_ids"] == ids
        assert back.encode(text, allowed_special="all") == ids


def test_an_export_gets_the_permissions_of_files_made_under_the_umask(tmp_path):
    # transformers renamed model.safetensors from a private temporary file: 0600 beside
    # the 0644 of the others (issue 29)
    import os
    import stat

    from gptspec.fast.tokenizer import Tokenizer
    from gptspec.spec import init_parameters

    config = PRESETS["tiny"].replace(vocab_size=256)
    old = os.umask(0o022)
    try:
        out = save_hf_dir(tmp_path / "hf", init_parameters(config, seed=1), config,
                          tokenizer=Tokenizer.byte_level())
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


@pytest.mark.parametrize("key, dtype", [("dtype", "float16"), ("dtype", "bfloat16"),
                                        ("torch_dtype", "float16")])
def test_from_hf_reads_the_weights_as_stored_whatever_dtype_config_json_names(
        tmp_path, capsys, key, dtype):
    """transformers 5 loads weights in config.json's dtype: float32 weights under
    "dtype": "float16" were rounded through float16, and "wrote … (float64)" said nothing."""
    import json

    from safetensors.numpy import load_file

    from gptspec.fast.checkpoint import load_model

    hf = hf_model_dir(tmp_path / "hf")
    settings = json.loads((hf / "config.json").read_text())
    for old in ("dtype", "torch_dtype"):
        settings.pop(old, None)
    (hf / "config.json").write_text(json.dumps({**settings, key: dtype}))
    stored = load_file(hf / "model.safetensors")
    assert {v.dtype for v in stored.values()} == {np.dtype("float32")}
    capsys.readouterr()
    out = tmp_path / "ck"
    assert convert("--from-hf", hf, out, "--dtype", "float64") == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'model.safetensors'} (float64)"
    _, params = load_model(out)
    for name, value in params.items():
        if hf_interop.hf_name(name) in stored:  # (a tied lm_head is stored once)
            kept = stored[hf_interop.hf_name(name)]
            np.testing.assert_array_equal(value, kept.T if name == "w_u" else kept)


def test_from_hf_float64_weights_are_kept_exact_or_said_rounded(tmp_path, capsys):
    """float64 weights: exact with --dtype float64; rounded to the default float32 only
    as the message says."""
    from gptspec.fast.checkpoint import load_model

    config, params = from_hf_model(random_hf_model(vocab_size=320, n_positions=16, n_embd=32,
                                                   n_layer=1))
    hf = save_hf_dir(tmp_path / "hf", params, config, dtype=torch.float64)
    capsys.readouterr()
    assert convert("--from-hf", hf, tmp_path / "exact", "--dtype", "float64") == 0
    assert capsys.readouterr().out.strip().endswith("(float64)")
    for name, value in load_model(tmp_path / "exact")[1].items():
        np.testing.assert_array_equal(value, params[name])
    assert convert("--from-hf", hf, tmp_path / "f32") == 0
    said = capsys.readouterr().out.strip()
    assert said.endswith("(float32; the source's float64 weights rounded to float32: "
                         "--dtype float64 keeps them exact)"), said


def test_to_hf_writes_through_a_link_to_an_empty_folder(tmp_path, capsys):
    """A link to an empty folder was refused: "cannot write link: Not a directory"."""
    write_checkpoint(tmp_path / "ck", small_tokenizer())
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to("real")
    assert convert("--to-hf", tmp_path / "ck", link) == 0
    assert link.is_symlink() and (tmp_path / "real" / "model.safetensors").is_file()
    assert from_hf_model(transformers.GPT2LMHeadModel.from_pretrained(str(link)))[0] == \
        PRESETS["tiny"].replace(vocab_size=320)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "link", "real"]
    capsys.readouterr()
    # a link to a folder that is not empty: refused, naming the link; the folder kept
    assert convert("--to-hf", tmp_path / "ck", link) == 2
    (line,) = errors(capsys)
    assert f"{link} already exists and is not an empty directory" in line
    assert (tmp_path / "real" / "model.safetensors").is_file()
