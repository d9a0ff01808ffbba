"""Model runtime: loading the embedded and saved models, ONNX export and ONNX Runtime in place of PyTorch."""
