"""How fast is each part, beside its reference, on this machine?

* :mod:`.parts`: PixTrace against dense tables, the data pipeline, extraction against ``ViTModel``, faiss.
* :mod:`.dense_tables`: the full-resolution table-warping pipeline the PixTrace figure is compared with.
* :mod:`.dataloader`: the training data pipeline's pairs per second, and where the time goes.
* :mod:`.model_costs`: seconds per descriptor image, matcher encoder view and fusion pair.
* :mod:`.runtimes`: PyTorch against ONNX Runtime.
* :mod:`.contention`: a command's wall and CPU time alone and beside busy processes.
"""
