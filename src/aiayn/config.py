"""ModelConfig: one typed, validated description of every model aiayn builds.

A config is data. It is validated at construction (one error lists every problem), round-trips through
JSON, and comes in named presets (``ModelConfig.preset("paper-base")``). ``aiayn.build_model(config)`` is
the only place that turns it into modules.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from aiayn.errors import AiaynError, where
from aiayn.files import BadJSON, parse_json
from aiayn.validation import Problems, Rule, above, at_least, choice, dataclass_types, within

ARCHS = ("encoder", "decoder", "encoder-decoder")
ACTIVATIONS = ("relu", "gelu", "silu", "swiglu", "geglu")
FFNS = ("dense", "moe")
GELU_APPROXIMATIONS = ("none", "tanh")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("post", "pre")
POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
ROPE_SCALINGS = ("none", "linear", "ntk", "yarn", "llama3")
INITS = ("paper", "gpt2")
ATTENTION_BACKENDS = ("auto", "reference", "sdpa", "tiled", "flex")
ATTENTIONS = ("softmax", "linear")
ATTENTION_MASKS = ("dense", "block_sparse", "local_global")
POOLINGS = ("cls", "mean")
INPUTS = ("tokens", "patches")


#: each field's own rule (its type comes from its annotation); ModelConfig.problems adds the checks across fields
_RULES: dict[str, Rule] = {
    **{name: choice(options) for name, options in (
        ("arch", ARCHS), ("activation", ACTIVATIONS), ("ffn", FFNS), ("gelu_approximate", GELU_APPROXIMATIONS),
        ("norm", NORMS), ("norm_position", NORM_POSITIONS), ("position", POSITIONS),
        ("sinusoidal_layout", SINUSOIDAL_LAYOUTS), ("rope_scaling", ROPE_SCALINGS), ("init", INITS),
        ("attention_backend", ATTENTION_BACKENDS), ("attention", ATTENTIONS), ("attention_mask", ATTENTION_MASKS),
        ("pooling", POOLINGS), ("input", INPUTS))},
    **dict.fromkeys(("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len", "t5_num_buckets",
                     "t5_max_distance", "sparse_block", "sparse_local_blocks", "local_window", "image_size",
                     "patch_size", "channels"), at_least(1, whole=True)),
    **dict.fromkeys(("tgt_vocab_size", "n_kv_heads", "n_encoder_layers", "sliding_window", "n_classes",
                     "n_token_labels", "rope_original_max_len", "n_token_types", "sparse_stride"),
                    at_least(1, whole=True, unset="null (left out)")),
    "head_dim": at_least(1, whole=True, unset="null (d_model / n_heads)"),
    **dict.fromkeys(("dropout", "attn_dropout", "ffn_dropout"), within(0, 1)),
    "n_experts": at_least(1, whole=True, note=", e.g. 8"),
    "moe_capacity_factor": above(0, note=" (e.g. 1.25)", unset="null (dropless)"),
    **dict.fromkeys(("moe_aux_loss_weight", "moe_z_loss_weight"), at_least(0, note=" (0 turns the loss off)")),
    "norm_eps": above(0, note=", e.g. 1e-5"),
    "rope_theta": above(0, note=", e.g. 10000.0"),
    **dict.fromkeys(("position_offset", "global_tokens"), at_least(0, whole=True)),
    "attn_logit_softcap": above(0, note=" (Gemma 2 uses 50.0)", unset="null (off)"),
}


@dataclass
class ModelConfig:
    """Every architectural choice of an aiayn model.

    Attributes (the important ones):
        arch: "encoder" (BERT-like), "decoder" (GPT-like) or "encoder-decoder" (the paper's).
        vocab_size: source vocabulary (and target, unless ``tgt_vocab_size`` is set).
        d_model, n_heads, d_ff: widths. ``n_kv_heads`` < ``n_heads`` gives GQA (1 gives MQA).
        head_dim: width of one attention head; null is d_model / n_heads. Another width makes the query, key and
            value projections D -> H * head_dim and the output projection H * head_dim -> D (T5 v1.1's ``d_kv``,
            Gemma, Qwen3).
        n_layers: layers of the decoder (or of the only stack); ``n_encoder_layers`` defaults to it.
        dropout: residual and embedding dropout (the paper's P_drop); ``attn_dropout`` on attention
            weights, ``ffn_dropout`` on the FFN hidden activation.
        norm_position: "post" is the paper's ``LN(x + Dropout(Sublayer(x)))``; "pre" is
            ``x + Dropout(Sublayer(LN(x)))`` with a final norm. ``deepnorm`` scales post-LN residuals.
        position: "sinusoidal" | "learned" (added to embeddings), "rope" (rotates q/k), "alibi" | "t5"
            (additive attention bias), or "none".
        tie_embeddings: output projection shares the target embedding matrix (paper section 3.4);
        share_src_tgt_embeddings: encoder and decoder share one embedding (needs one joint vocabulary).

    Options that pretrained families need (each default leaves the model as it was):
        gelu_approximate: "none" (exact, erf) or "tanh" (GPT-2's ``gelu_new``), for activation "gelu" and "geglu"
            (as ``F.gelu(approximate=)``). Activation "silu" is the plain, ungated SiLU (Marian's "swish").
        position_offset: absolute positions (learned or sinusoidal) read table row position + offset (BART: 2).
        sinusoidal_layout: "interleaved" (the paper's sin, cos, sin, ...) or "halves" (all sines, then all cosines:
            Marian, fairseq).
        rope_low_freq_factor, rope_high_freq_factor: rope_scaling "llama3"'s band edges (with rope_scaling_factor
            and rope_original_max_len).
        qkv_bias: biases on the query/key/value projections; null follows ``bias`` (Qwen2: bias=false,
            qkv_bias=true).
        embedding_norm: a norm right after embeddings + positions, before dropout (BERT, BART).
        n_token_types: token-type (segment) embeddings added to the input embeddings (BERT: 2); the models'
            ``forward`` takes ``token_type_ids`` (default all 0).
        tied_output_scale: multiply the hidden state by d_model^-0.5 before the tied output layer (T5 v1.0).
        output_bias: a bias on the output layer (BART/Marian ``final_logits_bias``); an encoder's masked-LM head
            always has one (BERT's decoder bias).

    Attention that scales (each default leaves the model as it was):
        attention_backend: how softmax attention is computed, all equal up to float rounding: "auto" (torch's fused
            kernel, or the reference where weights are requested), "reference" (explicit softmax), "sdpa" (torch's
            fused kernel), "tiled" (online softmax by key blocks, memory linear in length: ``nn/tiled_attention.py``),
            "flex" (torch's FlexAttention, which skips masked blocks: ``nn/flex.py``). "tiled" and "flex" need
            attn_dropout = 0.
        attention: "softmax" or "linear" (Katharopoulos et al. 2020: elu(x) + 1 features, a constant-size state per
            decoding step; no ALiBi/T5 bias, sliding window, sparse mask or soft-capping).
        attention_mask: "dense" (every allowed key), "block_sparse" (blocks of ``sparse_block`` positions see the
            ``sparse_local_blocks`` nearest blocks and, with ``sparse_stride``, every stride-th summary block) or
            "local_global" (a window of ``local_window`` positions, plus the first ``global_tokens`` positions,
            which see and are seen by every position). Decoders keep the pattern causal.
        qk_norm: an RMSNorm over each head's queries and keys before RoPE (OLMo 2, Gemma 3, Qwen3).
        attn_logit_softcap: cap * tanh(scores / cap) on the attention scores (Gemma 2); null is off.

    Mixture of experts (``ffn="moe"``; the other fields are read only then):
        ffn: "dense" (one feed-forward network per layer) or "moe" (``n_experts`` of them and a router).
        n_experts: experts per layer, each a feed-forward network of width ``d_ff`` and the model's activation.
        moe_top_k: experts per token: 1 is Switch (output weighted by the router probability), 2 is Mixtral (the
            top-k probabilities renormalised to sum to 1).
        moe_capacity_factor: null is dropless; a number caps each expert in training at ceil(factor * top_k *
            tokens / n_experts) tokens per forward pass, and a token beyond it gets no output from that expert
            (Switch). Inference is always dropless.
        moe_aux_loss_weight, moe_z_loss_weight: the weights of the load-balancing loss (Switch) and the router
            z-loss (ST-MoE) that training adds to the task's loss.

    Images (the Vision Transformer, Dosovitskiy et al. 2021; ``input="patches"``, read only then):
        input: "tokens" (token ids through an embedding table) or "patches": an encoder with a classification
            head reads images (B, channels, image_size, image_size), cut into (image_size / patch_size)^2 square
            patches, each flattened and projected to d_model (``nn/patches.py``); ``pooling="cls"`` prepends a
            learned CLS token. Positions (``position``) then number the patches row by row; ``vocab_size``,
            ``pad_id`` and ``scale_embeddings`` are not used, and the model has no masked-LM head.
        image_size, patch_size, channels: the image's side in pixels, a patch's side (dividing image_size) and
            the colour channels (1 grey, 3 RGB).
    """

    arch: str = "encoder-decoder"
    vocab_size: int = 32000
    tgt_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None
    head_dim: int | None = None
    n_layers: int = 6
    n_encoder_layers: int | None = None
    d_ff: int = 2048
    max_len: int = 1024
    dropout: float = 0.1
    attn_dropout: float = 0.0
    ffn_dropout: float = 0.0
    activation: str = "relu"
    ffn: str = "dense"
    n_experts: int = 8
    moe_top_k: int = 2
    moe_capacity_factor: float | None = None
    moe_aux_loss_weight: float = 0.01
    moe_z_loss_weight: float = 0.001
    gelu_approximate: str = "none"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "post"
    deepnorm: bool = False
    position: str = "sinusoidal"
    position_offset: int = 0
    sinusoidal_layout: str = "interleaved"
    rope_theta: float = 10000.0
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_original_max_len: int | None = None
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    sliding_window: int | None = None
    attention_backend: str = "auto"
    attention: str = "softmax"
    attention_mask: str = "dense"
    sparse_block: int = 64
    sparse_local_blocks: int = 1
    sparse_stride: int | None = None
    local_window: int = 128
    global_tokens: int = 1
    qk_norm: bool = False
    attn_logit_softcap: float | None = None
    bias: bool = True
    qkv_bias: bool | None = None
    scale_embeddings: bool = True
    embedding_norm: bool = False
    n_token_types: int | None = None
    tie_embeddings: bool = True
    tied_output_scale: bool = False
    output_bias: bool = False
    share_src_tgt_embeddings: bool = True
    init: str = "paper"
    pad_id: int = 0
    n_classes: int | None = None
    n_token_labels: int | None = None
    pooling: str = "cls"
    input: str = "tokens"
    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise AiaynError("invalid model config:\n  - " + "\n  - ".join(problems))

    # ------------------------------------------------------------------ derived values
    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (``n_heads`` for MHA, fewer for GQA, 1 for MQA)."""
        return self.n_kv_heads or self.n_heads

    @property
    def encoder_layers(self) -> int:
        """Layers in the encoder stack (encoder and encoder-decoder models)."""
        return self.n_encoder_layers if self.n_encoder_layers is not None else self.n_layers

    @property
    def target_vocab_size(self) -> int:
        """Vocabulary size of the decoder / output layer."""
        return self.tgt_vocab_size or self.vocab_size

    @property
    def n_patches(self) -> int:
        """Patches of one image (``input="patches"``): (image_size / patch_size)^2."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def n_input_positions(self) -> int:
        """Positions an image takes in the encoder (``input="patches"``): its patches, plus the CLS token when
        ``pooling="cls"``."""
        return self.n_patches + (self.pooling == "cls")

    @property
    def qkv_uses_bias(self) -> bool:
        """Whether the query/key/value projections have biases (``qkv_bias``, else ``bias``)."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    # ------------------------------------------------------------------ validation
    def problems(self) -> list[str]:
        """Every problem with this config, each as ``key=value: problem; fix`` (empty when valid): types from the
        annotations, each field's own rule (:data:`_RULES`), then the checks across fields."""
        p = Problems(vars(self))  # the stored values (a derived property may share a field's name)
        p.check_types(*dataclass_types(self))
        p.check_all(_RULES)
        self._shape_problems(p)
        self._attention_problems(p)
        self._image_problems(p)
        if p.ok("pad_id") and (self.pad_id < 0 or (p.ok("vocab_size") and self.pad_id >= max(self.vocab_size, 1))):
            p.add("pad_id", f"must be a valid token id below vocab_size={self.vocab_size}")
        return p.lines

    def _shape_problems(self, p: Problems) -> None:
        """The checks across the fields of widths, heads, positions, norms and the output layer."""
        explicit_head_dim = vars(self)["head_dim"]
        if p.ok("d_model", "n_heads", "n_kv_heads", "head_dim") and self.d_model >= 1 and self.n_heads >= 1:
            if explicit_head_dim is None and self.d_model % self.n_heads:
                p.add("d_model", f"not divisible by n_heads={self.n_heads}; pick n_heads that divides d_model")
            elif self.position == "rope" and self.head_dim >= 1 and self.head_dim % 2:
                got = "d_model/n_heads" if explicit_head_dim is None else "head_dim"
                p.add("position", f"needs an even head width, got {got}={self.head_dim}; change d_model or n_heads, "
                                  "or set an even head_dim")
            if self.n_kv_heads and self.n_kv_heads >= 1 and self.n_heads % self.n_kv_heads:
                p.add("n_kv_heads", f"n_heads={self.n_heads} is not divisible by it; pick a divisor of n_heads")
        if p.ok("moe_top_k", "n_experts") and not 1 <= self.moe_top_k <= max(self.n_experts, 1):
            p.add("moe_top_k", f"must be between 1 and n_experts={self.n_experts} (1: Switch, 2: Mixtral)")
        if p.ok("rope_scaling_factor") and self.rope_scaling != "none" and self.rope_scaling_factor < 1.0:
            p.add("rope_scaling_factor", "must be >= 1 when rope_scaling is set")
        if p.ok("rope_low_freq_factor", "rope_high_freq_factor") and self.rope_scaling == "llama3" and not (
                0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
            p.line(f"rope_low_freq_factor={self.rope_low_freq_factor}, rope_high_freq_factor="
                   f"{self.rope_high_freq_factor}: rope_scaling='llama3' needs 0 < low < high, e.g. 1.0 and 4.0",
                   "rope_low_freq_factor", "rope_high_freq_factor")
        if p.ok("n_token_types") and self.n_token_types is not None and self.arch == "encoder-decoder":
            p.add("n_token_types", "token types apply to encoder or decoder models; set n_token_types=null for "
                                   "arch='encoder-decoder'")
        if p.ok("output_bias") and self.output_bias and self.arch == "encoder":
            p.add("output_bias", "an encoder's masked-LM head always has its bias; output_bias applies to "
                                 "arch='decoder' or 'encoder-decoder', set output_bias=false")
        if p.ok("tied_output_scale") and self.tied_output_scale:
            if self.arch == "encoder":
                p.add("tied_output_scale", "applies to the output layer of arch='decoder' or 'encoder-decoder'; set "
                                           "tied_output_scale=false")
            elif self.tie_embeddings is not True:
                p.add("tied_output_scale", "rescales before a tied output layer; set tie_embeddings=true or "
                                           "tied_output_scale=false")
        if p.ok("deepnorm") and self.deepnorm and self.norm_position != "post":
            p.add("deepnorm", "needs norm_position='post' (DeepNorm scales post-LN residuals); set deepnorm=false or "
                              "norm_position='post'")
        if self.arch == "encoder-decoder" and self.share_src_tgt_embeddings is True and self.tgt_vocab_size not in (
                None, self.vocab_size):
            p.add("tgt_vocab_size", "share_src_tgt_embeddings=true needs one joint vocabulary; set "
                                    "tgt_vocab_size=null or share_src_tgt_embeddings=false")
        if self.sliding_window is not None and self.arch == "encoder":
            p.add("sliding_window", "applies to causal self-attention; it is not supported for arch='encoder'")

    def _image_problems(self, p: Problems) -> None:
        """The checks of an image input (``input="patches"``) against the model around it."""
        if not p.ok("input") or self.input != "patches":
            return
        if p.ok("arch") and self.arch != "encoder":
            p.add("input", f"images feed an encoder; set arch='encoder' (got {self.arch!r}) or input='tokens'")
        if p.ok("n_classes") and self.n_classes is None:
            p.add("input", "an image model classifies; set n_classes (the number of labels)")
        for name in ("n_token_types", "n_token_labels"):
            if p.ok(name) and getattr(self, name) is not None:
                p.add(name, f"applies to token input; set {name}=null with input='patches'")
        if not p.ok("image_size", "patch_size", "max_len", "pooling") or min(self.image_size, self.patch_size) < 1:
            return
        if self.image_size % self.patch_size:
            fits = [d for d in range(1, self.image_size + 1) if self.image_size % d == 0]
            p.add("patch_size", f"does not divide image_size={self.image_size}; choose one of "
                                f"{', '.join(map(str, fits))}")
        elif self.max_len < self.n_input_positions:
            p.add("max_len", f"an image takes {self.n_input_positions} positions ({self.n_patches} patches"
                             f"{' + CLS' if self.pooling == 'cls' else ''}); set max_len >= {self.n_input_positions}")

    def _attention_problems(self, p: Problems) -> None:
        """The checks across the attention options (backend, linear attention, sparse masks, soft-capping)."""
        if p.ok("attention_backend", "attn_dropout") and self.attention_backend in ("tiled", "flex") and (
                self.attn_dropout > 0):
            p.add("attention_backend", "has no attention dropout; set attn_dropout=0 or attention_backend='auto'")
        if p.ok("attention_mask", "sliding_window") and self.attention_mask != "dense" and (
                self.sliding_window is not None):
            p.add("attention_mask", "already limits each query's keys; set sliding_window=null or "
                                    "attention_mask='dense'")
        if p.ok("attention") and self.attention == "linear":
            kept = {"position": ("alibi", "t5"), "attention_mask": ("block_sparse", "local_global"),
                    "attention_backend": ("tiled", "flex")}
            for name, bad in kept.items():
                if getattr(self, name) in bad:
                    p.add(name, "attention='linear' has no score matrix to bias, mask by pattern or compute by "
                                f"another backend; change {name} or set attention='softmax'")
            for name in ("sliding_window", "attn_logit_softcap"):
                if getattr(self, name) is not None:
                    p.add(name, f"attention='linear' has no score matrix to limit; set {name}=null or "
                                "attention='softmax'")

    @classmethod
    def check(cls, data: dict[str, Any]) -> list[str]:
        """The problems :meth:`from_dict` would raise for ``data`` (unknown keys first), as a list.

        Each item reads ``key=value: problem; fix``; nothing is built.
        """
        known = {f.name for f in fields(cls)}
        unknown = Problems(data)
        unknown.unknown(known)
        config = cls.__new__(cls)
        for f in fields(cls):  # a config that skipped __post_init__, so that its problems can be listed
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            setattr(config, f.name, data.get(f.name, default))
        return unknown.lines + config.problems()

    # ------------------------------------------------------------------ (de)serialization
    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (``head_dim`` as stored: null when it is d_model / n_heads)."""
        return {**asdict(self), "head_dim": vars(self)["head_dim"]}

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialize to JSON text; also write it to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> ModelConfig:
        """Build from a dict; unknown keys are an error that suggests the closest known key."""
        known = {f.name for f in fields(cls)}
        unknown = [k for k in data if k not in known]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, known, n=1)
                hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise AiaynError(f"{source}: unknown model config key(s) {', '.join(hints)}; "
                             f"valid keys: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except TypeError as e:  # pragma: no cover - dataclass signature errors
            raise AiaynError(f"{source}: {e}") from None
        except AiaynError as e:  # the problems, said with the file (or section) they came from
            if source == "config":
                raise
            raise AiaynError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path_or_text: str | Path) -> ModelConfig:
        """Load from a JSON file path or a JSON string."""
        source = "config"
        text = str(path_or_text)
        if not text.lstrip().startswith("{"):
            path = Path(path_or_text)
            if not path.exists():
                raise AiaynError(f"{path}: config file not found; check the path")
            source, text = str(path), path.read_text(encoding="utf-8")
        try:
            data = parse_json(text)
        except BadJSON as e:
            raise AiaynError(f"{where(source, e.line)}: invalid JSON ({e.detail}); fix the file") from None
        return cls.from_dict(data, source)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **{"head_dim": vars(self)["head_dim"], **changes})

    @classmethod
    def preset(cls, preset: str, /, **overrides: Any) -> ModelConfig:
        """A named preset (see ``PRESETS``), with optional field overrides."""
        if preset not in PRESETS:
            raise AiaynError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        data = {**PRESETS[preset], "name": preset, **overrides}
        return cls.from_dict(data, f"preset {preset!r}")


def _head_dim(self: ModelConfig) -> int:
    """Width of one attention head: the ``head_dim`` field, or ``d_model // n_heads`` when it is null."""
    explicit = vars(self)["head_dim"]
    return self.d_model // self.n_heads if explicit is None else explicit


def _set_head_dim(self: ModelConfig, value: int | None) -> None:
    vars(self)["head_dim"] = value


# the field holds what was given (null by default); reading ``config.head_dim`` gives the width in use
ModelConfig.head_dim = property(_head_dim, _set_head_dim, doc=_head_dim.__doc__)  # type: ignore[assignment]

# Table 3 of the paper: base = N 6, d_model 512, d_ff 2048, h 8, P_drop 0.1; big = 1024/4096/16, P_drop 0.3.
_PAPER = dict(arch="encoder-decoder", vocab_size=37000, n_layers=6, norm_position="post", norm="layernorm",
              activation="relu", position="sinusoidal", scale_embeddings=True, tie_embeddings=True,
              share_src_tgt_embeddings=True, init="paper", max_len=1024, norm_eps=1e-6)

PRESETS: dict[str, dict[str, Any]] = {
    "paper-base": {**_PAPER, "d_model": 512, "d_ff": 2048, "n_heads": 8, "dropout": 0.1},
    "paper-big": {**_PAPER, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3},
    "gpt2-small": dict(arch="decoder", vocab_size=50257, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                       max_len=1024, dropout=0.1, activation="gelu", gelu_approximate="tanh", norm="layernorm",
                       norm_position="pre", position="learned", scale_embeddings=False, tie_embeddings=True,
                       init="gpt2"),
    "llama": dict(arch="decoder", vocab_size=32000, d_model=2048, n_heads=32, n_kv_heads=8, n_layers=16,
                  d_ff=5632, max_len=2048, dropout=0.0, activation="swiglu", norm="rmsnorm", norm_eps=1e-6,
                  norm_position="pre", position="rope", rope_theta=10000.0, bias=False,
                  scale_embeddings=False, tie_embeddings=False, init="gpt2"),
    "bert-base": dict(arch="encoder", vocab_size=30522, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                      max_len=512, dropout=0.1, activation="gelu", norm="layernorm", norm_eps=1e-12,
                      norm_position="post", position="learned", scale_embeddings=False, embedding_norm=True,
                      n_token_types=2, tie_embeddings=True, init="gpt2", pooling="cls", n_classes=2),
    "t5-small": dict(arch="encoder-decoder", vocab_size=32128, d_model=512, n_heads=8, n_layers=6, d_ff=2048,
                     max_len=512, dropout=0.1, activation="relu", norm="rmsnorm", norm_eps=1e-6,
                     norm_position="pre", position="t5", bias=False, scale_embeddings=False,
                     tie_embeddings=True, tied_output_scale=True, share_src_tgt_embeddings=True, init="gpt2"),
    # BART's pad id is 1 (<s> is 0); its learned positions start at table row 2
    "bart-base": dict(arch="encoder-decoder", vocab_size=50265, d_model=768, n_heads=12, n_layers=6, d_ff=3072,
                      max_len=1024, dropout=0.1, attn_dropout=0.1, ffn_dropout=0.1, activation="gelu",
                      norm="layernorm", norm_position="post", position="learned", position_offset=2,
                      embedding_norm=True, scale_embeddings=False, tie_embeddings=True,
                      share_src_tgt_embeddings=True, output_bias=True, init="gpt2", pad_id=1),
    # opus-mt (Marian) en-de; its pad id is the vocabulary's last (58100 here), which a converter sets
    "marian": dict(arch="encoder-decoder", vocab_size=58101, d_model=512, n_heads=8, n_layers=6, d_ff=2048,
                   max_len=512, dropout=0.1, activation="silu", norm="layernorm", norm_position="post",
                   position="sinusoidal", sinusoidal_layout="halves", scale_embeddings=True, tie_embeddings=True,
                   share_src_tgt_embeddings=True, output_bias=True, init="gpt2"),
    "tiny": dict(arch="encoder-decoder", vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                 max_len=128, dropout=0.0),
}
