"""What does DISC21's size cost? Measured pieces at scale and the wall time worked out from them.

* :mod:`.disc21`: faiss indexes over a million synthetic descriptors, model costs, the DISC21 estimate.
* :mod:`.dedup`: ``copynce dedup --dataset`` on large synthetic collections, stage by stage.
* :mod:`.gpu_throughput`: ViT-S/16 at 224 on one accelerator (inference, search, training, data).
"""
