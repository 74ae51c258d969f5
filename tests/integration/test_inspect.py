"""The inspection record, its pictures and the ``aiayn inspect`` command on translation, language-model and
classification checkpoints.

The record's weights are the model's own (held equal to a reference pass), its masks, statistics and outputs are
what the model computed, and the PNG pictures draw exactly the record's numbers at the size they claim.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import pytest
import torch

from aiayn.cli.main import main
from aiayn.errors import AiaynError
from aiayn.inspect import inspect_text, render_html, write_html
from aiayn.inspect.stats import head_statistics, is_punctuation
from aiayn.pretrained import load_pretrained

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TEXTS = {"translation": "the small dog runs .", "lm": "a red bird sings over the house",
         "classification": "the cat sleeps near the river ,"}


@pytest.fixture(scope="module")
def records(inspect_checkpoints: dict[str, Path]) -> dict[str, dict]:
    return {task: inspect_text(load_pretrained(path), TEXTS[task], digits=None)
            for task, path in inspect_checkpoints.items()}


def test_a_translation_record_holds_the_decoded_output_and_every_attention(records, inspect_checkpoints) -> None:
    rec = records["translation"]
    pre = load_pretrained(inspect_checkpoints["translation"], accel="none")
    src_tok, tgt_tok = pre.tokenizers["src"], pre.tokenizers["tgt"]
    src = torch.tensor([src_tok.encode(TEXTS["translation"])])
    out_ids = [tgt_tok.token_to_id(t) for t in rec["output"]["tokens"] if t != "</s>"]
    tgt = torch.tensor([[tgt_tok.decoder_start_id] + out_ids])  # what the decoder read
    assert rec["tokens"]["decoder"] == [tgt_tok.id_to_token(i) for i in tgt[0].tolist()]
    assert rec["output"]["text"] == tgt_tok.decode(tgt[0, 1:].tolist())
    assert rec["output"]["method"] == "beam search, 2 beams"
    with torch.no_grad():
        ref = pre.model(src, tgt, return_weights=True).attentions
    for kind, name in (("encoder", "encoder"), ("decoder", "self"), ("cross", "cross")):
        assert len(rec["attention"][kind]) == 2
        for layer, weights in enumerate(rec["attention"][kind]):
            torch.testing.assert_close(torch.tensor(weights), ref[name][layer][0], atol=1e-6, rtol=0)
    t, s = len(rec["tokens"]["decoder"]), len(rec["tokens"]["encoder"])
    assert torch.equal(torch.tensor(rec["masks"]["decoder"]), torch.ones(t, t).tril())  # causal
    assert torch.equal(torch.tensor(rec["masks"]["cross"]), torch.ones(t, s))
    assert rec["mask_notes"]["decoder"].startswith("causal")
    assert len(rec["positions"]["encoder"]["table"][0]) == 32  # sinusoidal: positions x dimensions
    assert rec["model"]["task"] == "translation" and rec["model"]["n_heads"] == 4


def test_a_language_model_record_predicts_the_next_token(records, inspect_checkpoints) -> None:
    rec = records["lm"]
    pre = load_pretrained(inspect_checkpoints["lm"])
    ids = pre.tokenizers["text"].encode(TEXTS["lm"])
    with torch.no_grad():
        logits = pre.model(torch.tensor([ids])).logits[0, -1]
    out = rec["output"]
    assert out["ids"][0] == int(logits.argmax()) and out["vocab_size"] == logits.numel()
    assert out["log_z"] == pytest.approx(float(torch.logsumexp(logits, 0)), abs=1e-5)
    assert out["logits"] == sorted(out["logits"], reverse=True)
    window = torch.tensor(rec["masks"]["decoder"])  # causal with a sliding window of 4
    t = len(ids)
    want = torch.ones(t, t).tril() - torch.ones(t, t).tril(-4)
    assert torch.equal(window, want) and "sliding window of 4" in rec["mask_notes"]["decoder"]
    rope = rec["positions"]["decoder"]
    assert len(rope["inv_freq"]) == 4 and rope["angles"][0] == [1.0] * 4  # cos(0) = 1 at position 0


def test_a_classifier_record_gives_the_prediction(records, inspect_checkpoints) -> None:
    rec = records["classification"]
    out = rec["output"]
    assert out["labels"] == ["negative", "positive"] and sum(out["probs"]) == pytest.approx(1, abs=1e-5)
    assert out["prediction"] == out["labels"][max(range(2), key=lambda i: out["probs"][i])]
    tokens = rec["tokens"]["encoder"]
    assert tokens[0] == "<s>" and tokens[-1] == "</s>"  # CLS (BOS) ... EOS, as the classifier reads a text
    stats = rec["stats"]["encoder"]
    assert len(stats) == 2 and len(stats[0]) == 4
    for layer, heads in enumerate(stats):
        for h, s in enumerate(heads):
            w = torch.tensor(rec["attention"]["encoder"][layer][h])
            assert s == head_statistics(w[None], tokens, self_attention=True)[0]
            assert 0 <= s["entropy"] <= math.log2(len(tokens)) + 1e-9


def test_head_statistics_by_hand() -> None:
    w = torch.tensor([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]])  # 1 head; the last row is empty
    s = head_statistics(w, ["<s>", ",", "dog"], self_attention=True)[0]
    assert s["entropy"] == pytest.approx(0.5)  # rows: 0 bits and 1 bit; the empty row is left out
    assert s["distance"] == pytest.approx((0 + 0.5 * 1) / 2)
    assert s["first"] == pytest.approx(0.75) and s["punctuation"] == pytest.approx(0.25)
    assert head_statistics(w, ["a", "b", "c"], self_attention=False)[0]["distance"] is None
    assert is_punctuation("▁.") and is_punctuation("Ġ,") and not is_punctuation("</s>") and not is_punctuation("a.")


def test_the_offline_page_embeds_the_record_and_fetches_nothing(records, tmp_path: Path) -> None:
    record = {**records["translation"], "input": "<!--<script></script><script>alert(1)</script>"}
    page = write_html(record, tmp_path / "x.html").read_text(encoding="utf-8")
    assert set(re.findall(r"https?://[^\s\"')]+", page)) <= {"http://www.w3.org/2000/svg"}  # a name, not fetched
    assert "src=" not in page and "@import" not in page
    assert re.findall(r"<link[^>]*>", page) == [re.search(r'<link rel="icon" href="data:[^"]*">', page).group()]
    tag = '<script id="record" type="application/json">'
    start = page.index(tag) + len(tag)
    embedded = page[start:page.index("</script>", start)]
    assert "<" not in embedded and json.loads(embedded) == json.loads(json.dumps(record))
    assert 'data-served="0"' in page and 'data-served="1"' in render_html(record, served=True)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_pictures_draw_the_records_numbers_at_their_size(records, tmp_path: Path) -> None:
    from aiayn.inspect.pictures import figures, write_pictures
    from aiayn.viz.attention import DPI

    rec = records["translation"]
    heads = torch.tensor(rec["attention"]["cross"][1])  # (H, T, S)
    sizes, drawn = {}, {}
    for name, fig in figures(rec):
        sizes[name] = tuple(int(x) for x in fig.get_size_inches() * DPI)  # what savefig writes at DPI
        drawn[name] = [torch.tensor(ax.images[0].get_array()) for ax in fig.axes if ax.images]
        plt.close(fig)
    assert {"encoder_layer0.png", "decoder_layer1.png", "cross_layer1.png", "alignment_layer1.png",
            "mask_decoder.png", "positions_encoder.png"} <= set(drawn)
    torch.testing.assert_close(drawn["cross_layer1.png"][0], heads.mean(0))  # panel 0: the mean of heads
    for h in range(4):
        torch.testing.assert_close(drawn["cross_layer1.png"][1 + h], heads[h])
    torch.testing.assert_close(drawn["alignment_layer1.png"][0], heads.mean(0))
    assert torch.equal(drawn["mask_decoder.png"][0], torch.tensor(rec["masks"]["decoder"]))
    torch.testing.assert_close(drawn["positions_encoder.png"][0], torch.tensor(rec["positions"]["encoder"]["table"]))
    written = write_pictures(rec, tmp_path / "png")
    assert [p.name for p in written] == list(sizes)
    for path in written:
        assert _png_size(path) == sizes[path.name], path.name


def test_position_bias_pictures_show_each_head(inspect_checkpoints, tmp_path: Path) -> None:
    from aiayn import ModelConfig, build_model
    from aiayn.checkpoint import save_checkpoint
    from aiayn.inspect.pictures import figures
    from aiayn.nn.positions import alibi_slopes
    from aiayn.tokenize import WordTokenizer

    tok = WordTokenizer.train([TEXTS["lm"]])
    config = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                         max_len=32, position="alibi", dropout=0.0)
    path = save_checkpoint(tmp_path / "alibi", build_model(config), {
        "task": "lm", "model": config.to_dict(), "tokenizers": {"text": "tokenizer.json"}, "block_size": 32,
        "newline_symbol": None, "packing": False}, tokenizer_writer=lambda d: tok.save(d / "tokenizer.json"))
    rec = inspect_text(load_pretrained(path), TEXTS["lm"], digits=None)
    bias = torch.tensor(rec["positions"]["decoder"]["bias"])  # (H, T, T)
    t = len(rec["tokens"]["decoder"])
    distance = (torch.arange(t)[None] - torch.arange(t)[:, None]).abs()  # |key - query|
    want = -alibi_slopes(2)[:, None, None] * distance  # (H, T, T): ALiBi's linear penalty, a slope per head
    assert bias.shape == (2, t, t) and torch.allclose(bias.tril(), want.tril(), atol=1e-6)
    fig = dict(figures(rec))["positions_decoder_head1.png"]
    torch.testing.assert_close(torch.tensor(fig.axes[0].images[0].get_array()), bias[1])
    plt.close("all")


def test_the_inspect_command_writes_html_and_pngs(inspect_checkpoints, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    ckpt = str(inspect_checkpoints["classification"])
    assert main(["inspect", "--checkpoint", ckpt, "--text", TEXTS["classification"], "--html",
                 str(tmp_path / "c.html")]) == 0
    assert "Prediction" not in capsys.readouterr().err
    page = (tmp_path / "c.html").read_text(encoding="utf-8")
    assert '"kind":"classification"' in page
    (tmp_path / "in.txt").write_text("\n\n" + TEXTS["classification"] + "\n", encoding="utf-8")
    assert main(["inspect", "--checkpoint", ckpt, "-i", str(tmp_path / "in.txt"), "--png", str(tmp_path / "p")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "p" / "encoder_layer1.png").is_file()
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    assert main(["inspect", "--checkpoint", ckpt, "-i", str(tmp_path / "blank.txt"), "--html", "x.html"]) == 2
    assert "blank.txt: no non-blank line" in capsys.readouterr().err
    with pytest.raises(AiaynError, match="the input is empty"):
        inspect_text(load_pretrained(ckpt), "  ")


def test_translate_and_generate_save_the_attention_of_their_outputs(inspect_checkpoints, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src.txt"
    src.write_text("the small dog runs .\n\na red bird sings .\n", encoding="utf-8")
    ckpt = str(inspect_checkpoints["translation"])
    assert main(["translate", "--checkpoint", ckpt, "-i", str(src), "-o", str(tmp_path / "out.txt"), "--beam", "2",
                 "--attention", str(tmp_path / "att.json")]) == 0
    printed = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    records = json.loads((tmp_path / "att.json").read_text())["records"]
    assert records[1] is None and [r["input"] for r in records if r] == ["the small dog runs .", "a red bird sings ."]
    assert [records[0]["output"]["text"], records[2]["output"]["text"]] == [printed[0], printed[2]]
    pre = load_pretrained(ckpt)
    again = inspect_text(pre, "a red bird sings .", beam=2, digits=None)
    assert records[2]["attention"] == again["attention"]  # full precision, as the record gives it

    lm = str(inspect_checkpoints["lm"])
    assert main(["generate", "--checkpoint", lm, "--prompt", "the small", "--greedy", "--max-new-tokens", "4",
                 "--attention", str(tmp_path / "gen.json")]) == 0
    out = capsys.readouterr()
    text = out.out.rstrip("\n")
    (record,) = json.loads((tmp_path / "gen.json").read_text())["records"]
    assert record["input"] == text and "wrote the attention of 1 input(s)" in out.err
    assert len(record["attention"]["decoder"][0][0]) == len(record["tokens"]["decoder"])


def test_a_long_input_says_what_the_model_kept(inspect_checkpoints) -> None:
    words = "the small dog runs near the river , the cat sleeps over the house .".split()
    long_text = " ".join(words * 6)  # 90 words: over every tiny checkpoint's limit
    lm = inspect_text(load_pretrained(inspect_checkpoints["lm"]), long_text)
    cut = lm["cut"]  # a language model reads the last block_size (32) tokens
    assert (cut["tokens"], cut["limit"], cut["kept"]) == (90, 32, "last")
    assert cut["kept_text"] == " ".join((words * 6)[-32:]) and lm["tokens"]["decoder"] == (words * 6)[-32:]
    assert "90 tokens, more than the 32 the model takes" in cut["message"] and lm["notes"] == [cut["message"]]
    mt = inspect_text(load_pretrained(inspect_checkpoints["translation"]), long_text)
    assert (mt["cut"]["tokens"], mt["cut"]["limit"], mt["cut"]["kept"]) == (90, 64, "first")
    assert mt["tokens"]["encoder"] == (words * 6)[:64] and "first 64 tokens were translated" in mt["cut"]["message"]
    cls = inspect_text(load_pretrained(inspect_checkpoints["classification"]), long_text)
    assert (cls["cut"]["tokens"], cls["cut"]["limit"], cls["cut"]["kept"]) == (92, 32, "first")  # <s> text </s>
    assert cls["cut"]["kept_text"] == " ".join((words * 6)[:31])  # the start token is not text
    assert len(cls["tokens"]["encoder"]) == 32 and "first 31 tokens are classified" in cls["cut"]["message"]
    short = inspect_text(load_pretrained(inspect_checkpoints["lm"]), "the small dog")
    assert short["cut"] is None and short["notes"] == []
    unknown = inspect_text(load_pretrained(inspect_checkpoints["lm"]), "the zebra quokka dog")
    assert unknown["notes"] == ["2 of the 4 input tokens are unknown to the tokenizer (words or characters absent "
                                "from its training data): the model reads each as <unk>"]


def test_the_header_names_the_real_size(records) -> None:
    model = records["translation"]["model"]  # built from the paper-base preset at d_model 32
    assert model["name"] is None and model["design"] == "paper-base"
    assert (model["d_model"], model["d_ff"], model["n_heads"], model["n_layers"]) == (32, 48, 4, 2)
    assert model["parameters"] > 0


def test_the_example_without_an_input_is_one_the_vocabulary_knows() -> None:
    from types import SimpleNamespace

    from aiayn.cli.inspect_command import EXAMPLES, _example
    from aiayn.demos.translation import DEMO_SENTENCES
    from aiayn.tokenize import WordTokenizer

    demo = WordTokenizer.train(DEMO_SENTENCES)  # the demo's grammar has no "man" nor "bicycle"
    assert _example(SimpleNamespace(task="translation", tokenizers={"src": demo})) == DEMO_SENTENCES[0]
    known = WordTokenizer.train([EXAMPLES["translation"]])
    assert _example(SimpleNamespace(task="translation", tokenizers={"src": known})) == EXAMPLES["translation"]


def test_the_notebook_view_holds_a_step_through(inspect_checkpoints) -> None:
    from aiayn.inspect import show

    view = show(inspect_checkpoints["lm"], "the small dog runs")
    steps = view.record["steps"]  # the explorer's first choice: layer 0, head 0, the last token
    assert (steps["kind"], steps["layer"], steps["head"], steps["query"]) == ("decoder", 0, 0, 3)
    assert steps["neurons"]["scores"] and "Step-through" in view._repr_html_()
    other = show(inspect_checkpoints["lm"], "the small dog runs", steps={"kind": "decoder", "layer": 1, "head": 2,
                                                                         "query": 1})
    assert (other.record["steps"]["layer"], other.record["steps"]["head"], other.record["steps"]["query"]) == (1, 2, 1)
