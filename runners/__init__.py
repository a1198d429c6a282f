"""GPU runners: workload specs in, run bundles out (``docs/runners.md``).

``spec`` (YAML workload specs), ``packing`` (host-side cu_seqlens layout), ``launch``
(``cptrace run``: torchrun/srun, profilers, bundle), ``workload`` and ``arms`` (the per-rank
body), ``nsys`` (Nsight Systems commands and the catalog-made function trace), ``env``
(versions), ``manifest`` and ``bundle`` (writing bundles), ``http``, ``upload`` and ``agent``
(talking to the service). Only ``launch``, ``workload`` and ``arms`` import torch.
"""
