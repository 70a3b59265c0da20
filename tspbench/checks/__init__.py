"""The models' checks: each holds the analytic model or the timeline against something outside
them and writes its results folder. ``tspbench check NAME`` runs any of them (tspbench.cli.check).

    backtest.py, published.py, published_fake.py   published GPU runs predicted (results/published/)
    timeline_ops.py      op level: replayed compute by kind against torch.profiler
    torch_estimator.py   the timeline against torch's RuntimeEstimator on the same fake step
    overlap.py           how much of TSP's weight traffic hides behind its GEMMs, measured
    trace_cost.py        what tracing a fake-world step costs, and how fast the timeline replays it
    tsp_prefetch.py      TSP's first broadcast of each attention pass, before and after its prefetch
    host_drift.py        how much this host's speed moved between two measurements

A layer of its own, above analytic, measure, sweep and report: the checks drive all of them, and
nothing but the CLI imports a check (the report and the docs read what the checks stored)."""
