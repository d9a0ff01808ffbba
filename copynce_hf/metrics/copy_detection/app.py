import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load("copy_detection.py")
launch_gradio_widget(module)
