"""Named training recipes: model size, data phases, optimiser settings.

``embedded`` is the recipe of the shipped model; ``tiny`` is a seconds-long recipe for
tests and smoke runs (it learns nothing useful).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvcert.tasks import SYNTHETIC_TASKS
from kvcert.training.data import Phase
from kvcert.training.model import ArchitectureSpec

#: every synthetic task of the registry, each as often (a batch draws its rows by weight over sorted names)
ALL_TASKS = {name: 1.0 for name in SYNTHETIC_TASKS}
#: the regime table's tasks (provenance.json's `regime`): the synthetic ones but multiturn
REGIME_TASKS = tuple(name for name in SYNTHETIC_TASKS if name != "multiturn")


@dataclass(frozen=True)
class Recipe:
    name: str
    model: ArchitectureSpec
    phases: tuple[Phase, ...]
    lr: float = 2e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    aux_weight: float = 0.5  # weight of the auxiliary next-token loss next to the answer loss
    lm_fraction: float = 0.25  # share of context tokens given an auxiliary target
    max_questions: int = 8  # questions per task sequence
    copy_vocab: int | None = None  # tokens copy segments draw from (None: all)
    retrieval_layer: int = -1  # the attention layer whose head is taught to retrieve
    retrieval_head: int = 0
    retrieval_weight: float = 1.0
    readout_weight: float = 0.0  # the retrieval head's output must name the token it attends to
    # (layer, head, offset): heads taught to attend `offset` tokens back
    local_heads: tuple[tuple[int, int, int], ...] = ((0, 0, 1), (0, 1, 2), (0, 2, 3))
    local_weight: float = 1.0
    local_steps: int = 600  # supervise the local heads during the first steps only (cost)
    entity_head: tuple[int, int] | None = None  # (layer, head) taught to attend to the recent key
    entity_weight: float = 1.0
    question_weight: float = 0.0  # question-time attention on the fact's sentence
    question_heads: tuple[tuple[int, int], ...] = ()  # (layer, head); () = the retrieval head
    checkpoint_every: int = 50
    eval_lengths: tuple[int, ...] = (512, 2048)
    eval_examples: int = 100
    eval_tasks: tuple[str, ...] = field(default=SYNTHETIC_TASKS)
    regime_examples: int = 32  # records per task and length of the regime table (provenance)
    regime_tasks: tuple[str, ...] = field(default=REGIME_TASKS)

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RECIPES: dict[str, Recipe] = {
    "embedded": Recipe(
        name="embedded",
        # wide heads (64) so that a head's value vector can carry a token's identity
        model=ArchitectureSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                        intermediate_size=256, rope_theta=10000.0),
        phases=(
            Phase(steps=250, lengths=(256, 256), tokens_per_batch=8192, task_weights={"copy": 1.0}),
            Phase(steps=500, lengths=(320, 768), tokens_per_batch=6144,
                  task_weights={"copy": 0.5, **ALL_TASKS}),
            Phase(steps=1100, lengths=(640, 2304), tokens_per_batch=6144,
                  task_weights={"copy": 0.5, **ALL_TASKS}),
        ),
        retrieval_layer=1,
        # layer 0: three heads look 1-3 tokens back, the fourth at the most recent key
        local_heads=((0, 0, 1), (0, 1, 2), (0, 2, 3)),
        entity_head=(0, 3),
        readout_weight=1.0,
        # every head of layer 1 looks at the fact's sentence from the question
        question_weight=1.0,
        question_heads=((1, 0), (1, 1), (1, 2), (1, 3)),
    ),
    "tiny": Recipe(
        name="tiny",
        model=ArchitectureSpec(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=64, max_position_embeddings=1024),
        phases=(
            Phase(steps=2, lengths=(64, 64), tokens_per_batch=256, task_weights={"copy": 1.0}),
            Phase(steps=4, lengths=(192, 256), tokens_per_batch=512,
                  task_weights={"copy": 0.5, **ALL_TASKS}),
        ),
        readout_weight=1.0,
        entity_head=(0, 3),
        question_weight=1.0,
        warmup_steps=2,
        checkpoint_every=2,
        eval_lengths=(256,),
        eval_examples=2,
        regime_examples=1,
    ),
}


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None
