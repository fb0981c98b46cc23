"""Hugging Face transformers interop: GPT2LMHeadModel ↔ a configuration and schema params.

GPT-2's Conv1D weights are stored (in, out), the schema's layout, so nothing is
transposed but the untied output map (``lm_head.weight`` (V, d) ↔ ``w_u`` (d, V)).
transformers' GPT-2 is one structure (pre-LN, biases, final LayerNorm, GELU or ReLU FFN,
an output map without bias); a configuration outside it is refused naming the field.
transformers is optional (``gptspec[interop]``), imported only here, only when called.
:func:`save_hf_dir` writes a tokenizer as HF's tokenizer.json (with tokenizer_config and
special_tokens_map naming ``<|endoftext|>`` eos and bos), which ``AutoTokenizer`` loads
giving the same ids; :func:`load_hf_tokenizer` reads a byte-level BPE back from
tokenizer.json or GPT-2's vocab.json + merges.txt.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.atomic_files import created_mode, temporary_prefix
from gptspec.spec.config import ConfigError, GPTConfig, parse_json
from gptspec.spec.parameters import check_parameters, parameter_schema

# our ffn name ↔ transformers' activation_function
ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
ACTIVATION_ALIASES = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                      "gelu_fast": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names


class InteropError(ValueError):
    """A model or directory that cannot be converted; the message says why, in one line."""


class TokenizerInteropError(InteropError):
    """A tokenizer that cannot be carried across (the weights alone still could be)."""


def _is_file(file: Path, error: type[InteropError] = InteropError) -> bool:
    """Whether ``file`` is there as a regular file; one that is there as something else
    (a folder, a FIFO that would block the read, a device) is refused by name."""
    if not os.path.lexists(file):
        return False
    if not file.is_file():
        raise error(f"{file} is not a regular file")
    return True


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise InteropError("transformers is not installed: pip install 'gptspec[interop]'") \
            from None
    return transformers


# --- configuration ----------------------------------------------------------------------


def check_expressible(config: GPTConfig) -> None:
    """Refuse a configuration that transformers' GPT-2 cannot express."""
    refusals = [
        (config.norm != "pre", f"norm={config.norm!r} (GPT-2 blocks are pre-LN)"),
        (config.ffn not in ACTIVATIONS, f"ffn={config.ffn!r} (GPT-2's FFN is "
                                        f"W_2 act(W_1 x); act one of {sorted(ACTIVATIONS)})"),
        (not config.attn_bias, "attn_bias=False (GPT-2's c_attn and c_proj have biases)"),
        (not config.ffn_bias, "ffn_bias=False (GPT-2's c_fc and mlp.c_proj have biases)"),
        (not config.positional_embedding,
         "positional_embedding=False (GPT-2 always adds its learned wpe)"),
        (not config.head_width_is_derived,
         f"d_head={config.d_head} (GPT-2's heads are n_embd / n_head = "
         f"{config.d_model / config.n_heads:g} wide; n_heads × d_head must equal d_model)"),
        (config.output_bias, "output_bias=True (GPT-2's lm_head has no bias)"),
        (not config.final_norm, "final_norm=False (GPT-2 always applies ln_f)"),
    ]
    for refused, why in refusals:
        if refused:
            raise InteropError(f"transformers' GPT-2 cannot express config field {why}")


def why_inexpressible(config: GPTConfig) -> str | None:
    """None if GPT2LMHeadModel can hold ``config``, else why not (one line): a backend's
    ``supports``."""
    try:
        check_expressible(config)
    except InteropError as err:
        return str(err)
    return None


def config_to_hf(config: GPTConfig, tokenizer: Any = None) -> Any:
    """The GPT2Config of a configuration (dropout off: this project's model has none).
    Its bos and eos ids are the tokenizer's end-of-text token; without a tokenizer,
    GPT-2's 50256 when the vocabulary reaches it."""
    check_expressible(config)
    transformers = _transformers()
    if tokenizer is not None:
        eot = tokenizer.eot_token
    else:
        eot = 50256 if config.vocab_size > 50256 else None  # GPT-2's <|endoftext|>
    return transformers.GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.d_model,
        n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
        activation_function=ACTIVATIONS[config.ffn], layer_norm_epsilon=config.ln_eps,
        tie_word_embeddings=config.tied_embeddings, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=eot, eos_token_id=eot,
    )


def config_from_hf(hf_config: Any) -> GPTConfig:
    """The configuration of a GPT2Config; refuses options outside this project's model."""
    c = hf_config
    if getattr(c, "model_type", "gpt2") != "gpt2":
        raise InteropError(f"model_type {c.model_type!r} is not 'gpt2'")
    unsupported = [
        (not getattr(c, "scale_attn_weights", True), "scale_attn_weights=False"),
        (getattr(c, "scale_attn_by_inverse_layer_idx", False),
         "scale_attn_by_inverse_layer_idx=True"),
        (getattr(c, "add_cross_attention", False), "add_cross_attention=True"),
    ]
    for refused, what in unsupported:
        if refused:
            raise InteropError(f"GPT2Config option {what} has no counterpart in gptspec")
    activation = c.activation_function
    if activation not in ACTIVATION_ALIASES:
        raise InteropError(f"GPT2Config activation_function {activation!r} is not one of "
                           f"{sorted(ACTIVATION_ALIASES)}")
    try:
        return GPTConfig(
            vocab_size=c.vocab_size, n_ctx=c.n_positions, d_model=c.n_embd,
            n_layers=c.n_layer, n_heads=c.n_head,
            d_ff=c.n_inner if c.n_inner is not None else 4 * c.n_embd,
            norm="pre", ffn=ACTIVATION_ALIASES[activation],
            tied_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
            attn_bias=True, ffn_bias=True, output_bias=False, final_norm=True,
            ln_eps=float(c.layer_norm_epsilon),
        )
    except ConfigError as err:
        raise InteropError(f"GPT2Config does not describe a valid model: {err}") from None


# --- parameters -------------------------------------------------------------------------

# schema name (after blocks.{l}.) ↔ transformers name (after transformer.h.{l}.)
BLOCK_NAMES = {
    "ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias",
    "attn.w_qkv": "attn.c_attn.weight", "attn.b_qkv": "attn.c_attn.bias",
    "attn.w_o": "attn.c_proj.weight", "attn.b_o": "attn.c_proj.bias",
    "ln_2.weight": "ln_2.weight", "ln_2.bias": "ln_2.bias",
    "ffn.w_1": "mlp.c_fc.weight", "ffn.b_1": "mlp.c_fc.bias",
    "ffn.w_2": "mlp.c_proj.weight", "ffn.b_2": "mlp.c_proj.bias",
}


def hf_name(name: str) -> str:
    """The transformers state-dict key of a schema name (w_u is stored transposed)."""
    if name in ("wte", "wpe"):
        return f"transformer.{name}.weight"
    if name.startswith("ln_f."):
        return f"transformer.{name}"
    if name == "w_u":
        return "lm_head.weight"
    _, layer, rest = name.split(".", 2)
    return f"transformer.h.{layer}.{BLOCK_NAMES[rest]}"


def _numpy64(tensor: Any) -> np.ndarray:
    return tensor.detach().to("cpu").double().numpy()


def params_from_hf(config: GPTConfig, state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Schema parameters (float64 NumPy; exact, every float32 is a float64) from a state dict."""
    params = {}
    for spec in parameter_schema(config):
        key = hf_name(spec.name)
        if key not in state_dict:
            raise InteropError(f"transformers state dict has no {key!r} (for {spec.name!r})")
        value = _numpy64(state_dict[key])
        params[spec.name] = value.T.copy() if spec.name == "w_u" else value
    try:
        check_parameters(params, config)
    except ValueError as err:
        raise InteropError(f"transformers weights do not match their config: {err}") from None
    return params


def params_to_hf(params: Mapping[str, Any], config: GPTConfig, dtype: Any = None
                 ) -> dict[str, Any]:
    """A GPT2LMHeadModel state dict (torch tensors of ``dtype``, float32 by default)."""
    import torch

    check_expressible(config)
    check_parameters(dict(params), config)
    dtype = torch.float32 if dtype is None else dtype
    state = {}
    for name, value in params.items():
        t = torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
        t = t.detach().to("cpu", dtype)
        state[hf_name(name)] = t.T.contiguous() if name == "w_u" else t.contiguous()
    if config.tied_embeddings:
        state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def from_hf_model(model: Any) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """The configuration and float64 schema parameters of a GPT2LMHeadModel."""
    config = config_from_hf(model.config)
    return config, params_from_hf(config, model.state_dict())


def to_hf_model(params: Mapping[str, Any], config: GPTConfig, dtype: Any = None,
                tokenizer: Any = None) -> Any:
    """A GPT2LMHeadModel (eval mode) holding these parameters (bos/eos from ``tokenizer``)."""
    transformers = _transformers()
    state = params_to_hf(params, config, dtype)
    model = transformers.GPT2LMHeadModel(config_to_hf(config, tokenizer))
    model.to(next(iter(state.values())).dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(".attn.bias")]  # old causal-mask buffers
    if missing or unexpected:
        raise InteropError(f"state dict does not fit GPT2LMHeadModel: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")
    if config.tied_embeddings:
        model.tie_weights()
    return model.eval()


# --- directories ----------------------------------------------------------------------------


def load_hf_dir(path: str | os.PathLike[str]) -> tuple[GPTConfig, dict[str, np.ndarray]]:
    """Read a ``save_pretrained`` directory (config.json + safetensors; never pickle)."""
    transformers = _transformers()
    p = Path(path)
    if not _is_file(p / "config.json"):
        raise InteropError(f"{p} is not a transformers model directory: no config.json")
    try:  # transformers would take the last of a key given twice: refuse it instead
        parse_json((p / "config.json").read_bytes())
    except (OSError, ValueError) as err:
        raise InteropError(f"{p}/config.json cannot be read: {str(err).splitlines()[0]}") \
            from None
    if not any(p.glob("*.safetensors")):
        raise InteropError(f"{p} holds no .safetensors weights (pickled .bin files are refused)")
    try:
        hf_config = transformers.AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as err:  # transformers validates fields with its own error types
        # its message names the field on one line and the problem on the next: one line
        said = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        said = said[:300] + ("…" if len(said) > 300 else "") or type(err).__name__
        raise InteropError(f"{p}/config.json cannot be read: {said}") from None
    config = config_from_hf(hf_config)
    check_hf_weights(p, config)  # before from_pretrained, which fills gaps with random values
    try:
        model = transformers.GPT2LMHeadModel.from_pretrained(
            str(p), local_files_only=True, use_safetensors=True, **_float64(transformers))
    except Exception as err:  # transformers raises many types for a bad file
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InteropError(f"{p}: weights cannot be loaded ({first})") from None
    loaded = {str(t.dtype).removeprefix("torch.") for t in model.parameters()}
    if loaded != {"float64"}:  # never the case with the argument above
        raise InteropError(f"{p}: transformers loaded the weights as {sorted(loaded)}, not "
                           "float64: they would not be carried exactly")
    return config, params_from_hf(config, model.state_dict())


def _float64(transformers: Any) -> dict[str, Any]:
    """from_pretrained's argument loading every weight as float64, which holds each stored
    float type (F16, BF16, F32, F64) exactly. Left out, transformers 5 loads them in
    config.json's ``dtype`` ("auto"): float32 weights under a config saying float16 were
    rounded to float16, silently (and transformers 4 rounded F64 weights to float32)."""
    import re

    import torch

    found = re.match(r"(\d+)\.(\d+)", transformers.__version__)
    version = (int(found[1]), int(found[2])) if found else (5, 0)
    return {"dtype" if version >= (4, 56) else "torch_dtype": torch.float64}


def _hf_shapes(config: GPTConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor a GPT2LMHeadModel of this config stores, by its name without the
    ``transformer.`` prefix (lm_head.weight is optional when tied), one at a time: a
    config.json claiming a billion layers is refused at the first missing one."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    yield from {"wte.weight": (v, d), "wpe.weight": (config.n_ctx, d),
                "ln_f.weight": (d,), "ln_f.bias": (d,)}.items()
    for layer in range(config.n_layers):
        h = f"h.{layer}."
        yield from {
            h + "ln_1.weight": (d,), h + "ln_1.bias": (d,),
            h + "attn.c_attn.weight": (d, 3 * d), h + "attn.c_attn.bias": (3 * d,),
            h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
            h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (d, f), h + "mlp.c_fc.bias": (f,),
            h + "mlp.c_proj.weight": (f, d), h + "mlp.c_proj.bias": (d,)}.items()
    if not config.tied_embeddings:
        yield "lm_head.weight", (v, d)


def check_hf_weights(path: Path, config: GPTConfig) -> None:
    """Refuse safetensors files that do not hold exactly the tensors config.json describes
    (missing, misshapen or foreign ones), reading only their headers: transformers would
    initialise a missing tensor at random, and a config far larger than its weights would
    be allocated before any check."""
    from safetensors import SafetensorError, safe_open

    buffers = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers, not weights
    found: dict[str, tuple[int, ...]] = {}
    stored_in: dict[str, str] = {}
    for file in sorted(path.glob("*.safetensors")):
        if not file.is_file():  # a FIFO would block the read for ever
            raise InteropError(f"{path}: {file.name} is not a regular file")
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    short = name.removeprefix("transformer.")
                    if short in stored_in:  # which copy transformers takes is not defined
                        raise InteropError(f"{path}: tensor {short!r} is stored twice, in "
                                           f"{stored_in[short]} and {file.name}")
                    stored_in[short] = file.name
                    found[short] = tuple(f.get_slice(name).get_shape())
                    dtype = f.get_slice(name).get_dtype()
                    if dtype not in FLOAT_DTYPES and not short.endswith(buffers):
                        # integers are quantized weights without their scales, not a model
                        raise InteropError(f"{path}: tensor {short!r} has dtype {dtype}, not "
                                           "a floating-point one")
        except InteropError:
            raise
        except (SafetensorError, OSError, ValueError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise InteropError(f"{path}: weights cannot be loaded ({file.name} is not a readable "
                               f"safetensors file: {first})") from None
    optional = {"lm_head.weight"} if config.tied_embeddings else set()
    expected: set[str] = set()
    for name, shape in _hf_shapes(config):
        expected.add(name)
        if name not in found:
            raise InteropError(f"{path}: tensor {name!r} is missing from the weights (config.json "
                               f"describes {config.n_layers} layers of width {config.d_model})")
        if found[name] != shape:
            raise InteropError(f"{path}: tensor {name!r} has shape {list(found[name])} but "
                               f"config.json implies {list(shape)}")
    for name, shape in found.items():
        if name in expected or name.endswith(buffers):
            continue
        if name in optional and shape == (config.vocab_size, config.d_model):
            continue
        raise InteropError(f"{path}: tensor {name!r} is not part of the GPT-2 model config.json "
                           "describes")


def save_hf_dir(path: str | os.PathLike[str], params: Mapping[str, Any], config: GPTConfig,
                dtype: Any = None, tokenizer: Any = None) -> Path:
    """Write a directory that ``GPT2LMHeadModel.from_pretrained`` loads (safetensors), and
    ``AutoTokenizer.from_pretrained`` too when a ``tokenizer`` is given.

    It is written in full under a temporary name beside ``path`` and then renamed, so
    ``path`` either does not exist or is complete. An existing non-empty ``path`` is
    refused rather than replaced."""
    target = Path(path)
    if target.is_symlink():  # written through, as atomic_files writes a file's link: the
        # folder it points to is filled, the link stays
        target = Path(os.path.realpath(target))
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InteropError(f"{path} already exists and is not an empty directory")
    if tokenizer is not None:
        check_tokenizer_fits(config, tokenizer)
    model = to_hf_model(params, config, dtype, tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    # the name cut where the whole temporary name would pass 255 bytes: a legal OUT_DIR works
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(target, ""), dir=target.parent))
    os.chmod(tmp, created_mode(directory=True))  # mkdtemp's 0700 is for the temporary name
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            save_hf_tokenizer(tmp, tokenizer, config.n_ctx)
        for f in tmp.iterdir():
            # transformers renames model.safetensors from a private 0600 temporary file
            os.chmod(f, created_mode(directory=f.is_dir()))
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
        try:  # onto an empty folder too, in one step: one that another process filled
            # meanwhile is kept (rename(2) replaces only an empty folder)
            os.replace(tmp, target)
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            raise InteropError(f"{path} was filled by another process while this "
                               "conversion ran; nothing was written") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Path(path)


# --- tokenizers -------------------------------------------------------------------------------

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# tokenizer files of kinds that are not byte-level BPE (SentencePiece, WordPiece)
FOREIGN_TOKENIZER_FILES = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                           "vocab.txt")


def check_tokenizer_fits(config: GPTConfig, tokenizer: Any) -> None:
    """Refuse a tokenizer with ids the model has no embedding for (spare model ids are fine:
    vocabularies are often padded)."""
    if tokenizer.vocab_size > config.vocab_size:
        raise TokenizerInteropError(f"the tokenizer has {tokenizer.vocab_size} tokens but the "
                                    f"model only {config.vocab_size}: they do not belong together")


def save_hf_tokenizer(folder: str | os.PathLike[str], tokenizer: Any, n_ctx: int) -> None:
    """Write tokenizer.json (HF's format), tokenizer_config.json and special_tokens_map.json
    into ``folder``, each atomically. The class named is PreTrainedTokenizerFast, which
    takes tokenizer.json and the special tokens as they are (GPT2TokenizerFast makes
    <|endoftext|> eos, bos and unk even for a tokenizer without it)."""
    import json

    from gptspec.atomic_files import write_text
    from gptspec.fast.tokenizer import ENDOFTEXT, TokenizerError

    folder = Path(folder)
    try:
        tokenizer.save(folder / TOKENIZER_JSON, "hf")
    except TokenizerError as err:
        raise TokenizerInteropError(f"the tokenizer cannot be written as HF's tokenizer.json: "
                                    f"{err}") from None
    # GPT-2's convention: <|endoftext|> both ends and starts a document
    special = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT} \
        if tokenizer.eot_token is not None else {}
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": n_ctx,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,  # transformers 4 would drop " ,"'s space
        **special,
    }
    write_text(folder / TOKENIZER_CONFIG, json.dumps(settings, indent=2) + "\n")
    write_text(folder / SPECIAL_TOKENS_MAP, json.dumps(special, indent=2) + "\n")


def _tokenizer_settings(folder: Path) -> dict:

    file = folder / TOKENIZER_CONFIG
    if not _is_file(file, TokenizerInteropError):
        return {}
    try:
        settings = parse_json(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise TokenizerInteropError(f"{file} cannot be read: {str(err).splitlines()[0]}") \
            from None
    return settings if isinstance(settings, dict) else {}


def load_hf_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The tokenizer of a transformers directory as a ``gptspec.fast.tokenizer.Tokenizer``,
    from tokenizer.json or else GPT-2's vocab.json + merges.txt; None if it holds neither.
    A tokenizer that is not a byte-level BPE this project can reproduce id for id raises
    :class:`TokenizerInteropError` naming the problem."""
    from gptspec.fast import tokenizer_files
    from gptspec.fast.tokenizer import TokenizerError

    folder = Path(path)
    settings = _tokenizer_settings(folder)
    if settings.get("add_prefix_space"):
        raise TokenizerInteropError(f"{folder / TOKENIZER_CONFIG}: add_prefix_space=true is "
                                    f"not supported (gptspec encodes text as it is)")
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    has_json = _is_file(folder / TOKENIZER_JSON, TokenizerInteropError)
    has_vocab, has_merges = (not has_json and _is_file(file, TokenizerInteropError)
                             for file in (vocab, merges))
    try:
        if has_json:
            return tokenizer_files.load(folder / TOKENIZER_JSON, "hf")
        if has_vocab and has_merges:
            added = settings.get("added_tokens_decoder")
            special = {t["content"]: int(i) for i, t in added.items()
                       if isinstance(t, dict) and t.get("special") and "content" in t} \
                if isinstance(added, dict) else {}
            return tokenizer_files.load_vocab_merges(vocab, merges, special)
    except (TokenizerError, ValueError) as err:  # TokenizerFileError names the file
        raise TokenizerInteropError(f"unsupported tokenizer: {str(err).splitlines()[0]}") \
            from None
    foreign = [name for name in FOREIGN_TOKENIZER_FILES
               if _is_file(folder / name, TokenizerInteropError)]
    if foreign:
        raise TokenizerInteropError(f"unsupported tokenizer: {folder / foreign[0]} is not a "
                                    f"byte-level BPE that gptspec can represent (it reads "
                                    f"tokenizer.json or vocab.json + merges.txt)")
    if has_vocab or has_merges:
        have, lack = (vocab, merges) if has_vocab else (merges, vocab)
        raise TokenizerInteropError(f"unsupported tokenizer: {have} without {lack.name}")
    return None
