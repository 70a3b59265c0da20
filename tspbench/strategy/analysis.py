"""What a strategy costs, for the analytic model: the collectives of one step, the per-rank
shapes, and the activation memory, FLOPs and element-wise bytes priced from them
(tspbench.strategy.base.Strategy inherits it).

Every method here runs on a planning instance (``Strategy.for_analysis``: the layout's sizes, no
process groups, nothing allocated), so the planner can ask thousands of points. A plugin states
its own part by overriding ``traffic`` (its collectives), and where its shapes or memory differ
from a whole-weight rank's, ``shapes``, ``activation_terms``, ``flop_terms`` or
``elementwise_extra_bytes``; what every strategy adds (the gradient and loss all-reduces, what
recomputation repeats, decode's steps) is added here once.

Uses Strategy's ``workload``, ``config`` and ``mesh``, its axes (``sequence_axis``,
``vocab_axis``, ``data_axes``, ``_axis``), ``local_parameters`` (tspbench.strategy.weights) and
``decode_run_traffic`` (tspbench.strategy.decode).
"""

from __future__ import annotations

import math

from tspbench.core.spec import Layout, Workload
from tspbench.costs.elementwise import step_bytes
from tspbench.costs.flops import FlopTerms, autograd_flops
from tspbench.costs.memory import ActivationTerms, MemoryPrediction, Shapes, autograd_terms, predict_memory
from tspbench.dist.comm import CommRecord
from tspbench.strategy.traffic import Traffic, with_recomputation


class Analysis:
    """The analytic half of Strategy (mixed into it; uses its mesh, workload and parameters)."""

    # ------------------------------------------------------------------ collectives
    @classmethod
    def comm_volume(cls, layout: Layout, workload: Workload) -> list[CommRecord]:
        """Analytic collectives of one training or inference step on one rank (every rank alike)."""
        sized = cls.for_analysis(layout, workload)
        return [sized.record(t) for t in sized.step_traffic() if sized.mesh.size(*t.axes) > 1]

    def record(self, t: Traffic) -> CommRecord:
        label = "+".join(a for a in self.mesh.names if a in t.axes) + (f"#{t.channel}" if t.channel else "")
        return CommRecord(t.op, t.phase, self.mesh.size(*t.axes), t.msg_bytes, t.count, group=label)

    def step_traffic(self) -> list[Traffic]:
        """Everything one step moves: the strategy's own traffic with what recomputation repeats,
        the gradient all-reduces and the loss all-reduce; in decode mode the prefill (its
        ``traffic``, phase forward), the first token and ``decode_tokens`` steps (phase decode)."""
        out = with_recomputation(self.traffic(), self.workload)
        if self.workload.mode == "decode":
            out += [t for t in self.decode_run_traffic() if t.count]
        if self.workload.mode == "train":
            elt = self.workload.element_size
            for shape, placement in self.local_parameters().values():
                if placement.reduce:
                    nbytes = math.prod(shape) * elt
                    out.append(
                        Traffic("all_reduce", placement.reduce, nbytes, 1, "optimizer", "model", batched=True)
                    )
            out.append(Traffic("all_reduce", self.data_axes(), elt, 1, "forward", "model"))
        return out

    def traffic(self) -> list[Traffic]:
        """This strategy's own collectives in one step (mode-aware); see Traffic."""
        return []

    # ------------------------------------------------------------------ memory, FLOPs, element-wise bytes
    def shapes(self) -> Shapes:
        """Per-rank sizes for the analytic model: whole weights, tokens split over ``sequence_axis``."""
        cfg, w = self.config, self.workload
        return Shapes(
            w.batch,
            self.local_seq,
            self.local_seq,
            w.seq_len,
            cfg.hidden,
            cfg.n_heads * cfg.head_dim,
            cfg.kv_hidden,
            cfg.ffn_hidden,
            cfg.vocab_size,
            cfg.n_heads,
            self._axis(self.sequence_axis)[0],
            w.element_size,
            cfg.n_layers,
        )

    def activation_terms(self) -> ActivationTerms:
        """This strategy's activation and working-memory terms (see tspbench.memory_model)."""
        return autograd_terms(self.shapes())

    def elementwise_layer_bytes(self) -> int:
        """Bytes of the activations one block computes on this rank, the basis of the time
        model's element-wise passes (tspbench.analytic.timing): what autograd saves of them
        when nothing is recomputed."""
        return self.activation_terms().saved_layer["none"]

    def elementwise_step_bytes(self) -> int:
        """Bytes the step's element-wise kernels move on this rank, the optimizer apart: the
        model's operators in this rank's shapes (tspbench.costs.elementwise) and what the
        strategy's own code adds."""
        w, vocab = self.workload, self.vocab_axis
        vocab_parts = self.mesh.size(vocab) if vocab else 1
        return step_bytes(self.shapes(), w.mode, w.recompute, vocab_parts) + self.elementwise_extra_bytes()

    def elementwise_extra_bytes(self) -> int:
        """What this strategy's own code adds to the model's element-wise work (copies,
        concatenations); nothing by default."""
        return 0

    @property
    def param_element_size(self) -> int:
        """Bytes of an element of the parameters this rank holds and its optimizer steps."""
        return self.workload.element_size

    def flop_terms(self) -> FlopTerms:
        """Hardware FLOPs of one step on this rank (see tspbench.flops)."""
        return autograd_flops(self.shapes(), self.workload.mode, self.workload.recompute)

    def predict_memory(self, terms: ActivationTerms | None = None) -> MemoryPrediction:
        elt = self.workload.element_size
        params = {n: math.prod(shape) * elt for n, (shape, _) in self.local_parameters().items()}
        terms = terms or self.activation_terms()
        return predict_memory(terms, params, self.workload.mode, self.workload.recompute, elt)

    # ------------------------------------------------------------------ sizes for analytic counts
    @property
    def local_batch(self) -> int:
        """Sequences per rank: the micro-batch (dp splits the global batch, not the micro-batch)."""
        return self.workload.batch

    @property
    def local_seq(self) -> int:
        """Tokens per sequence on this rank."""
        parts = self._axis(self.sequence_axis)[0]
        return self.workload.seq_len // parts
