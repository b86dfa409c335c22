"""Turning the PyTorch model a user has into the module ``PredictPytorch`` runs.

One concept per module, used in this order:

    sources     a path -> a module (TorchScript file, ``torch.save`` file, Transformers4Rec folder)
    sample      one sample input -> the model's input schema and output names
    schemas     where the schemas come from: given, saved with the model, carried by it, a sample
    signature   how ``forward`` takes its inputs, bound to the input schema's columns
    probes      varied inputs built from the schema, to compare a compiled model with the eager one
    prepare     script, else trace, else run eagerly: the first that answers like the eager model
    eager       saving an eager model for the python backend, and checking a fresh Python loads it
"""
