"""Probes: run a candidate layout for a few steps and measure it.

    python -m probes.calibrate --nproc-per-node 2 --out calibration.yaml
    python -c "from probes.launch import run_local; ..."   # see probes/launch.py

Only ``probes.train``, ``probes.gpt`` and ``probes.parallel`` import torch (``probes.calibrate``
only in its workers); ``probes.result``, ``probes.layout``, ``probes.outcome``, ``probes.launch``
and ``probes.backend`` stay torch-free so that ``search`` can import them cheaply.
"""
