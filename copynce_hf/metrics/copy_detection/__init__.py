"""The ``copy_detection`` evaluate metric folder (load it with ``evaluate.load`` on this folder).

This ``__init__`` only makes the folder a regular package so that the package can import
``formulas``; it deliberately imports nothing, so importing the formulas never
pulls in ``evaluate``.
"""
