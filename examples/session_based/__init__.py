"""The session-based example: synthetic clicks, an NVTabular session workflow and a
Transformers4Rec next-item model, as small functions the demo, notebook and tests share.
"""
