"""hf: tiny Hugging Face transformers models, built from config classes with random weights.

Each `HFArch` names a transformers model class and the config keywords that make it tiny (1-2
layers, hidden 32-64, a vocabulary of 99); `make_inputs` draws fresh random inputs of sequence
length <= 16. Nothing is downloaded. `ARCHS` is the list the suite and tests use; transformers is
imported lazily so kiln runs without it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["HFArch", "ARCHS", "get", "build", "loss"]

_SEQ = 8
_FULL_SEQ = 128
_BATCH = 2
_VOCAB = 99

# Keyword sets shared by many decoder-only configs.
_DEC = dict(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
_ENC = dict(vocab_size=_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64)


@dataclasses.dataclass(frozen=True)
class HFArch:
    """name: the suite key (`hf:<name>`); config / model: transformers class names; kwargs: the
    tiny config; inputs: "ids", "ids_mask", "enc_dec", "pixels" or "audio"; pixels: image side;
    train: whether the grads test covers it."""
    name: str
    config: str
    model: str
    kwargs: dict
    inputs: str = "ids"
    pixels: int = 32
    train: bool = False


ARCHS: list[HFArch] = [
    HFArch("bert", "BertConfig", "BertModel", _ENC, "ids_mask", train=True),
    HFArch("roberta", "RobertaConfig", "RobertaModel", _ENC, "ids_mask"),
    HFArch("distilbert", "DistilBertConfig", "DistilBertModel",
           dict(vocab_size=_VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                max_position_embeddings=64), "ids_mask", train=True),
    HFArch("albert", "AlbertConfig", "AlbertModel", dict(_ENC, embedding_size=16), "ids_mask"),
    HFArch("electra", "ElectraConfig", "ElectraModel", dict(_ENC, embedding_size=16),
           "ids_mask"),
    HFArch("gpt2", "GPT2Config", "GPT2LMHeadModel",
           dict(vocab_size=_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64), train=True),
    HFArch("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", _ENC),
    HFArch("llama", "LlamaConfig", "LlamaForCausalLM", _DEC, train=True),
    HFArch("mistral", "MistralConfig", "MistralForCausalLM", _DEC),
    HFArch("qwen2", "Qwen2Config", "Qwen2ForCausalLM", _DEC),
    HFArch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(_DEC, head_dim=8), train=True),
    HFArch("phi3", "Phi3Config", "Phi3ForCausalLM", dict(_DEC, pad_token_id=0)),
    HFArch("gemma", "GemmaConfig", "GemmaForCausalLM", dict(_DEC, head_dim=8)),
    HFArch("opt", "OPTConfig", "OPTForCausalLM",
           dict(vocab_size=_VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32)),
    HFArch("bloom", "BloomConfig", "BloomForCausalLM",
           dict(vocab_size=_VOCAB, hidden_size=32, n_layer=2, n_head=4)),
    HFArch("falcon", "FalconConfig", "FalconForCausalLM",
           dict(vocab_size=_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)),
    HFArch("t5", "T5Config", "T5Model",
           dict(vocab_size=_VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                decoder_start_token_id=0), "enc_dec", train=True),
    HFArch("bart", "BartConfig", "BartModel",
           dict(vocab_size=_VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, max_position_embeddings=64), "enc_dec"),
    HFArch("vit", "ViTConfig", "ViTModel",
           dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, image_size=32, patch_size=8), "pixels", train=True),
    HFArch("clip_vision", "CLIPVisionConfig", "CLIPVisionModel",
           dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, image_size=32, patch_size=8), "pixels"),
    HFArch("whisper_encoder", "WhisperConfig", "WhisperForAudioClassification",
           dict(vocab_size=_VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                decoder_start_token_id=1, d_model=32, encoder_layers=1, decoder_layers=1,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=8,
                max_target_positions=16), "audio"),
    HFArch("mixtral", "MixtralConfig", "MixtralForCausalLM",
           dict(_DEC, num_local_experts=4, num_experts_per_tok=2), train=True),
    HFArch("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
           dict(_DEC, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=32)),
    HFArch("mpnet", "MPNetConfig", "MPNetModel", _ENC, "ids_mask"),
    HFArch("deberta_v2", "DebertaV2Config", "DebertaV2Model", _ENC, "ids_mask"),
    HFArch("mobilebert", "MobileBertConfig", "MobileBertModel",
           dict(_ENC, embedding_size=16, intra_bottleneck_size=32, true_hidden_size=32),
           "ids_mask"),
]
_BY_NAME = {a.name: a for a in ARCHS}


def get(name: str) -> HFArch:
    """The arch called `name` (without the `hf:` prefix)."""
    return _BY_NAME[name.removeprefix("hf:")]


def build(arch: HFArch, seed: int = 0, no_dropout: bool = False) -> torch.nn.Module:
    """The tiny model with random weights (reproducible from `seed`), in eval mode, eager
    attention (what TorchDynamo also traces on CPU). `no_dropout` zeroes every dropout
    probability of the config, so training runs are deterministic."""
    import transformers
    transformers.logging.set_verbosity_error()  # tiny vocabularies trip token-id warnings
    config = getattr(transformers, arch.config)(**arch.kwargs)
    config._attn_implementation = "eager"
    if no_dropout:
        for key, value in vars(config).items():
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
                setattr(config, key, 0.0)
    torch.manual_seed(seed)
    model = getattr(transformers, arch.model)(config)
    return model.eval()


def make_inputs(arch: HFArch, config: Any = None, gen: torch.Generator | None = None,
                device: str | torch.device = "cpu", seq: int | None = None) -> dict[str, Any]:
    """Fresh random keyword inputs for a model of `config` (default: the tiny config), on
    `device`. Drawn on the CPU (from `gen`, a CPU generator, when given) and then moved, so a seed
    gives the same inputs on every device and a CPU generator works under `torch.device("cuda")`.
    `seq`: the sequence length of token inputs (default 8 tiny, 128 full)."""
    vocab = getattr(config, "vocab_size", _VOCAB) if config is not None else _VOCAB
    seq = seq or (_SEQ if config is None else _FULL_SEQ)
    cpu = torch.device("cpu")
    ids = lambda: torch.randint(1, vocab, (_BATCH, seq), generator=gen, device=cpu)  # noqa: E731
    if arch.inputs == "ids":
        inputs = {"input_ids": ids()}
    elif arch.inputs == "ids_mask":
        mask = torch.ones(_BATCH, seq, dtype=torch.long, device=cpu)
        mask[1, seq // 2 + int(torch.randint(0, 3, (), generator=gen, device=cpu)):] = 0
        inputs = {"input_ids": ids(), "attention_mask": mask}
    elif arch.inputs == "enc_dec":
        inputs = {"input_ids": ids(), "decoder_input_ids": ids()}
    elif arch.inputs == "pixels":
        side = arch.pixels if config is None else config.image_size
        inputs = {"pixel_values": torch.randn(_BATCH, 3, side, side, generator=gen, device=cpu)}
    elif arch.inputs == "audio":
        mels = arch.kwargs["num_mel_bins"] if config is None else config.num_mel_bins
        frames = 2 * (arch.kwargs["max_source_positions"] if config is None
                      else config.max_source_positions)
        inputs = {"input_features": torch.randn(_BATCH, mels, frames, generator=gen, device=cpu)}
    else:
        raise ValueError(f"hf: unknown inputs kind {arch.inputs!r} for {arch.name}")
    return {key: t.to(device) for key, t in inputs.items()}


def tensors_of(output: Any) -> list[torch.Tensor]:
    """The tensors of a model output (ModelOutput, tuple, dict), in order, for comparison."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in tensors_of(item)]
    return []


def loss(output: Any) -> torch.Tensor:
    """A scalar training loss that reads every float tensor of the output."""
    outs = [t.float() for t in tensors_of(output) if t.is_floating_point()]
    return sum((t * t).mean() for t in outs)


# -- suite specs: `hf:<arch>` in `kiln.tools.suite.get` and `python -m kiln bench --models` ------
class HFAdapter(torch.nn.Module):
    """A transformers model called with the suite's positional inputs (`names` in order)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(**dict(zip(self.names, inputs)))


def _full_config(arch: HFArch) -> Any:
    """The config class's defaults (the base-size model)."""
    import transformers
    transformers.logging.set_verbosity_error()
    keep = {k: v for k, v in arch.kwargs.items() if k.endswith("_token_id")}
    config = getattr(transformers, arch.config)(**keep)
    config._attn_implementation = "eager"
    return config


def spec(name: str) -> Any:
    """The suite `ModelSpec` for `hf:<arch>`: "small" is the tiny config, "full" the config
    class's defaults; the loss reads every float tensor of the output."""
    import transformers
    from kiln.tools.suite.batch import Batch
    from kiln.tools.suite.spec import ModelSpec
    arch = get(name)

    def make_model(size: str) -> torch.nn.Module:
        if size == "small":
            model = build(arch)
        else:
            model = getattr(transformers, arch.model)(_full_config(arch)).eval()
        return HFAdapter(model, tuple(make_inputs(arch)))

    def make_batch(size: str) -> Batch:
        inputs = make_inputs(arch, None if size == "small" else _full_config(arch))
        return Batch(tuple(inputs.values()), torch.zeros(()))

    return ModelSpec(f"hf:{arch.name}", make_model, make_batch,
                     lambda output, target: loss(output),
                     (torch.float32, torch.bfloat16, torch.float16),
                     f"transformers {arch.model} ({arch.config}), random weights")
