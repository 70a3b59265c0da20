"""The numbers docs/ and the README quote, computed from the stored records beside the renderer
that fills docs/templates/ with them (tools/gen_docs.py), out of the installed package: no
command of tspbench needs them.

    stored.py        records read once, layouts named as the docs name them, ``Part``
    studies.py       memory, throughput, the backtest's summary, TSP against FSDP+SP, decode,
                     the fake world's cost, this host's set-up and test times
    time_checks.py   the time models' checks on the CPU: op level, step level, timeline
    paper_checks.py  the time models' checks at paper scale, torch's estimator, overlap

A formatted number reads as the report's tables read it (tspbench.report.formats).
"""
