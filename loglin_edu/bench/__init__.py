"""How fast is it: the log-linear kernels against SDPA flash, their linear models and fla-core.

    python -m loglin_edu.bench                     # GPU: PAPER.md §7's setting -> book/results/kernels_<device>.json
    python -m loglin_edu.bench --model gated_deltanet   # log-linear Gated DeltaNet, the authors' setting (6 heads,
                                                        # K=192, V=384) -> book/results/kernels_gdn_<device>.json
    python -m loglin_edu.bench --tier cpu --out /tmp/bench.json   # tiny, under Triton's interpreter
    python -m loglin_edu.bench --accuracy          # errors of every output and gradient against float64
    python -m loglin_edu.bench --variants          # our kernel under several launch configurations
    python -m loglin_edu.bench --variants --linear # the chunk-parallel linear Mamba-2 (kernel step 1b), likewise
    python -m loglin_edu.bench --precision         # time and errors of every rung of the precision ladder
    python -m loglin_edu.bench --decode            # one decoding step against a KV cache and Mamba-2's step

``--model gated_deltanet`` runs our log-linear Gated DeltaNet beside fla's linear Gated DeltaNet
(``chunk_gated_delta_rule``, recorded as skipped when fla-core is not installed) and SDPA flash at the same
heads and key width; ``--heads/--key/--value`` change the widths (``--heads 48 --key 128 --value 64``: the
Mamba-2 setting's). Each implementation runs in one process on the same inputs; times are medians
(:func:`~loglin_edu.timing.median_ms`: ``triton.testing.do_bench`` on a GPU), memory is the peak allocated
during one forward+backward above what the inputs hold. The modules, by job:

- :mod:`~loglin_edu.bench.settings` — the shapes, the inputs, the counted work and its floor;
- :mod:`~loglin_edu.bench.implementations` — what is measured, side by side;
- :mod:`~loglin_edu.bench.measure` — timing and memory; :mod:`~loglin_edu.bench.accuracy` — errors;
- :mod:`~loglin_edu.bench.report` — table and plot; :mod:`~loglin_edu.bench.diagnose` — a GPU failure, stage by stage;
- :mod:`~loglin_edu.bench.profile` — device time of every kernel launch; :mod:`~loglin_edu.bench.decode` — decoding;
- :mod:`~loglin_edu.bench.__main__` — the command line.
"""
