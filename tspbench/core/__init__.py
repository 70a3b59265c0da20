"""What every layer shares and none of them owns: errors, names, units and the point spec.

Nothing here imports torch or any other part of tspbench, so the report, the experiment
schema and the analytic model's inputs can be read without loading a deep-learning stack.
"""
