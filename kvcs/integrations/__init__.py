"""Bridges between model runtimes and the KVCS publisher and consumer (optional extras).

:mod:`kvcs.integrations.hf`: Hugging Face transformers (``pip install 'kvcs[hf]'``).
Nothing here is imported by ``import kvcs``; each module imports its runtime itself.
"""
