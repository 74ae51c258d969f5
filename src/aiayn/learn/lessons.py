"""The course's ten lessons, in order: each a notebook in ``docs/course/``, the exercises its final check runs, and the
explorer view that shows its piece in a trained model."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.errors import AiaynError

#: the explorer on the translation demo's model (``make demo`` trains it into runs/demo/best)
EXPLORER_COMMAND = ('aiayn inspect --checkpoint runs/demo/best --text "the dog sleeps because the woman sees the '
                    'ball"')


@dataclass(frozen=True)
class Lesson:
    """One lesson.

    Args:
        number: two digits, "01" .. "10".
        slug: the notebook's name after the number.
        title: what it teaches.
        exercises: the functions its final check runs, by exercise name.
        explorer: the explorer view (docs/inspect.md) that shows the lesson's piece in a trained model.
    """

    number: str
    slug: str
    title: str
    exercises: tuple[str, ...]
    explorer: str

    @property
    def notebook(self) -> str:
        """The notebook's path in the repository."""
        return f"docs/course/{self.number}-{self.slug}.ipynb"

    @property
    def name(self) -> str:
        """``"lesson 03 (masks: padding, causal, combined, an empty row)"``."""
        return f"lesson {self.number} ({self.title})"


LESSONS: tuple[Lesson, ...] = (
    Lesson("01", "why-attention", "why attention: the path length problem", ("soft_lookup",),
           "head view: every token reaches every other in one step; hover a token to see its lines"),
    Lesson("02", "scaled-dot-product", "scaled dot-product attention by hand", ("attention",),
           "model view: one heatmap of weights per layer and head; hover a cell for its weight"),
    Lesson("03", "masks", "masks: padding, causal, combined, an empty row",
           ("causal_mask", "decoder_mask", "masked_attention"),
           "masks: the causal mask of the decoder and the padding of the encoder, as each attention applied them"),
    Lesson("04", "multi-head", "multi-head attention and its shapes",
           ("split_heads", "merge_heads", "multi_head_attention"),
           "head view: one colour per head; click a colour to show one head alone"),
    Lesson("05", "positions", "positions: sinusoidal, learned, RoPE, ALiBi", ("sinusoidal", "rope"),
           "positions: the sinusoidal table the model adds to its embeddings"),
    Lesson("06", "block", "the block: residual, LayerNorm pre and post, FFN", ("feed_forward", "sublayer"),
           "model view, layer by layer, and the head statistics of each layer"),
    Lesson("07", "encoder-decoder", "encoder, decoder, cross-attention and teacher forcing",
           ("teacher_forcing", "encode"),
           "alignment: the decoder's cross-attention over the source, averaged over heads"),
    Lesson("08", "decoding", "greedy and beam decoding with a KV cache", ("greedy_decode", "beam_step"),
           "output: the translation, its beam and its score; --beam 1 shows greedy decoding"),
    Lesson("09", "training", "training the copy task, then the translation demo", ("noam_lr", "label_smoothed_loss"),
           "output and alignment of the model make demo trained; its learning curve is runs/demo/learning_curve.png"),
    Lesson("10", "explorer", "looking inside with the explorer", ("head_entropy", "mean_distance"),
           "head statistics: entropy, mean distance, weight on the first token, per layer and head"),
)


def find_lesson(key: str | int) -> Lesson:
    """The lesson that ``key`` names: its number (3, "3", "03"), its slug ("masks") or both ("03-masks").

    Raises:
        AiaynError: no such lesson (the message lists them).
    """
    text = str(key).strip().lower().removesuffix(".ipynb")
    for lesson in LESSONS:
        if text in (lesson.number, lesson.number.lstrip("0"), lesson.slug, f"{lesson.number}-{lesson.slug}"):
            return lesson
    names = ", ".join(f"{lesson.number} ({lesson.slug})" for lesson in LESSONS)
    raise AiaynError(f"no lesson {key!r}; the lessons are {names}")


def lesson_of(exercise: str) -> Lesson:
    """The lesson whose final check runs ``exercise``."""
    for lesson in LESSONS:
        if exercise in lesson.exercises:
            return lesson
    raise KeyError(exercise)
