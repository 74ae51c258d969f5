"""The offline demo (README's first command): train a small encoder-decoder on a synthetic
English -> German-like grammar (word reordering, gender/case agreement, long-range agreement),
decode held-out sentences with beam search, save the model, and draw its cross-attention.

Training is bounded by steps, not minutes, so the result does not depend on the machine's speed or load (about
3 minutes on 2 cores); the demo passes at :data:`BAR` held-out exact match and says why when it does not."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from aiayn.data.synthetic import generate_corpus
from aiayn.data.synthetic import translate as reference_translation
from aiayn.evaluate.bleu import corpus_bleu
from aiayn.output_folder import clear_run_folder
from aiayn.pretrained import load_pretrained
from aiayn.tasks.translation import TranslationTask, translate_texts
from aiayn.train.trainer import TrainConfig, train
from aiayn.viz.attention import plot_attention

DEMO_RECIPE = {
    "task": "translation",
    "data": {"batch_tokens": 1000, "max_tokens_per_side": 64, "policy": "error"},
    "tokenizer": {"kind": "word", "vocab_size": None, "joint": True, "min_frequency": 1},
    "model": {"preset": "paper-base", "d_model": 128, "n_heads": 4, "d_ff": 256, "n_layers": 2,
              "n_encoder_layers": 2, "dropout": 0.1, "max_len": 128},
    "decode": {"beam": 4, "alpha": 0.6},
    "eval": {"bleu": False},
    "train": {},
}
BAR = 0.95  #: held-out exact match the demo must reach
PICTURE = "cross_attention.png"  #: the demo's picture, beside its checkpoints
STEPS = 1400  #: training steps
DEMO_SENTENCES = ["the dog sleeps because the woman sees the ball", "the dogs that see the cat run",
                  "the woman sleeps next to the house"]


def run_translation_demo(out_dir: str = "runs/demo", seed: int = 1, max_steps: int = STEPS,
                         n_train: int = 40_000) -> dict[str, float]:
    """Train ``max_steps`` steps, evaluate exact match on 500 held-out sentences, show translations and write
    pictures.

    Returns:
        {"exact_match", "bleu", "minutes" (all of it), "steps" (made), "max_steps", "train_minutes",
        "train_loss" (per target token over the last logged steps), "threads" (torch's at the end of training)}
    """
    t0 = time.time()
    out = Path(out_dir)
    clear_run_folder(out, extra=(PICTURE,))  # an earlier run of this demo; a folder of the user's is refused
    corpus = generate_corpus(n_train, 500, 500, seed=seed)
    print(f"synthetic En->De grammar: {len(corpus['train'])} training pairs, 500 validation, 500 test; e.g.")
    for s, t in corpus["train"][:3]:
        print(f"  {s}  ->  {t}")
    task = TranslationTask(DEMO_RECIPE, pairs=corpus, seed=seed)
    cfg = TrainConfig(out_dir=str(out), max_steps=max_steps, lr=2e-3,
                      schedule="warmup_cosine", warmup=150, label_smoothing=0.1, eval_every=350,
                      log_every=50, seed=seed)
    result = train(task, cfg)
    threads = torch.get_num_threads()
    model = task.model.eval()
    # ---- held-out exact match with beam search, on the best checkpoint
    best = load_pretrained(out / "best")
    model = best.model
    src_tok, tgt_tok = best.tokenizers["src"], best.tokenizers["tgt"]
    test_src = [s for s, _ in corpus["test"]]
    test_ref = [tgt_tok.normalize(t) for _, t in corpus["test"]]
    hyps = translate_texts(model, src_tok, tgt_tok, test_src, beam=4, alpha=0.6)
    exact = sum(h == r for h, r in zip(hyps, test_ref)) / len(test_ref)
    bleu = corpus_bleu(hyps, test_ref)
    print("\nbeam-search translations of held-out sentences:")
    for s, h, r in list(zip(test_src, hyps, test_ref))[:5]:
        print(f"  {s}\n    -> {h}" + ("" if h == r else f"\n    (reference: {r})"))
    print("\nand of the examples from the README (reference from the grammar's own translator):")
    for s, h in zip(DEMO_SENTENCES, translate_texts(model, src_tok, tgt_tok, DEMO_SENTENCES, beam=4)):
        ref = reference_translation(s)
        print(f"  {s}  ->  {h}" + ("   (correct)" if h == ref else f"   (reference: {ref})"))
    picture = draw_cross_attention(model, src_tok, tgt_tok, DEMO_SENTENCES[0], out / PICTURE)
    minutes = (time.time() - t0) / 60
    print(f"\nheld-out exact match: {exact:.1%}   BLEU: {bleu.score:.1f} ({bleu.signature})")
    print(f"wall time: {minutes:.1f} min; checkpoint: {out / 'best'}")
    print(f"pictures: {picture} and {out / 'learning_curve.png'}")
    print("translate your own sentence (vocabulary and grammar: aiayn/data/synthetic.py):\n"
          f'  echo "the teacher sees the dog" | .venv/bin/aiayn translate --checkpoint {out / "best"}')
    print("and look inside the model: the attention explorer, in your browser at http://127.0.0.1:8000/ (or --html "
          "FILE for an offline page):\n"
          f'  .venv/bin/aiayn inspect --checkpoint {out / "best"} --text "{DEMO_SENTENCES[0]}"')
    losses = [r["train_loss"] for r in result.history if "train_loss" in r]
    return {"exact_match": exact, "bleu": bleu.score, "minutes": minutes, "steps": result.steps,
            "max_steps": max_steps, "train_minutes": result.wall_seconds / 60,
            "train_loss": losses[-1] if losses else float("nan"), "threads": threads}


def shortfall(metrics: dict[str, float], bar: float = BAR) -> str:
    """Why the demo missed ``bar`` ("" when it did not): what it reached, what it needed, the steps and time."""
    if metrics["exact_match"] >= bar:
        return ""
    steps, planned = int(metrics["steps"]), int(metrics["max_steps"])
    made = f"all {planned} training steps" if steps >= planned else f"only {steps} of {planned} training steps"
    hint = ("training stopped early" if steps < planned else
            f"more steps (--steps {2 * planned}) or another --seed usually get there")
    return (f"held-out exact match {metrics['exact_match']:.1%}, below the {bar:.0%} the demo needs, after {made} "
            f"in {metrics['train_minutes']:.1f} min on {int(metrics['threads'])} thread(s) (last training loss "
            f"{metrics['train_loss']:.3f}); {hint}")


@torch.no_grad()
def draw_cross_attention(model, src_tok, tgt_tok, sentence: str, path: Path) -> Path:
    """Greedy-translate one sentence, then draw the last decoder layer's cross-attention over the source."""
    hyp = translate_texts(model, src_tok, tgt_tok, [sentence], beam=1)[0]
    src = torch.tensor([src_tok.encode(sentence)])
    tgt_ids = tgt_tok.encode(hyp)
    tgt_in = torch.tensor([[tgt_tok.decoder_start_id] + tgt_ids])
    out = model(src, tgt_in, return_weights=True)
    weights = out.attentions["cross"][-1][0]  # (H, T, S) of the last layer
    q_labels = [tgt_tok.id_to_token(i) for i in tgt_ids] + [tgt_tok.id_to_token(tgt_tok.eos_id)]
    k_labels = [src_tok.id_to_token(i) for i in src[0].tolist()]
    return plot_attention(weights, q_labels, k_labels, path,
                          title=f"cross-attention, last decoder layer: {sentence!r}")
