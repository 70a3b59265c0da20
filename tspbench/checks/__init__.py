"""The models' checks: each holds the analytic model or the timeline against something outside
them and writes its results folder. ``tspbench check NAME`` runs any of them (tspbench.cli.check).

    backtest.py, published.py, published_fake.py   published GPU runs predicted (results/published/),
                         with their errors by sample (backtest_score.py) and the calibrated
                         profiles' fit (backtest_fit.py)
    timeline_ops.py      op level: replayed compute by kind against torch.profiler
    torch_estimator.py   the timeline against torch's RuntimeEstimator on the same fake step
    overlap.py           how much of TSP's weight traffic hides behind its GEMMs, measured
    trace_cost.py        what tracing a fake-world step costs, and how fast the timeline replays it
    tsp_prefetch.py      TSP's first broadcast of each attention pass, before and after its prefetch
    host_drift.py        how much this host's speed moved between two measurements
    gpu_check.py         every path only a GPU exercises (``tspbench gpu-check``), with the
                         types its rows share (gpu_plan.py), its speed and steady-state rows
                         (gpu_rows.py) and its op-level rows (gpu_ops.py)
    gpu_points.py, gpu_op_kinds.py   the committed H200 probe scored step by step and kind by kind

A layer of its own, above analytic, measure, calibrate, sweep and report: the checks drive all of them, and
nothing but the CLI imports a check (the report and the docs read what the checks stored)."""
